"""The discrete-event simulator: event loop, cluster, workloads, traces.

Imports sim.replica only (never sim.emulator).
"""
