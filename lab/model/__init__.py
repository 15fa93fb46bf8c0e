"""Pure data with no side effects: errors, validators, scenarios, flow paths, flows,
statistics.
"""
