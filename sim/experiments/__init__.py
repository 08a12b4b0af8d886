"""Experiments: study reproduction, scenarios, demo, live load, A/B, and their reports.

Imports sim.des, sim.emulator and sim.replica.
"""
