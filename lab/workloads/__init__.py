"""What the lab puts on the network from outside the hosts: iperf3 flows and injected faults."""
