"""Machine plumbing: what this kernel offers, Open vSwitch, run records and locks, the VM,
programs in hosts.
"""
