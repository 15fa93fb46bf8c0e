"""Plots as specifications (data and a draw function, no matplotlib until drawn), and a
run read into the sections they are made of. Below the kinds, which build their own plots
on it, and below ``lab.report``, which picks and draws them.
"""
