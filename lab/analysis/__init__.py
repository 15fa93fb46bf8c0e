"""Analysis of plans and results: per-flow diagnosis, balls-into-bins, policy predictions,
partitions, offline policy checks.
"""
