"""Building the network: links, topologies, the fabric, the BGP edge and its FRR routers, the
controller process.
"""
