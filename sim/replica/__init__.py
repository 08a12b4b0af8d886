"""The pure replica model: profiles, GPU prefix cache, shared pool, the replica.

No I/O and no clock of its own; imports neither sim.des nor sim.emulator.
"""
