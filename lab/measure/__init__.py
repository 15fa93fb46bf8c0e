"""Measurement: counters and queues sampled from the kernel, router statistics, ECN on the
wire, result entries.
"""
