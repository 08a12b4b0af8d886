"""The live emulated vLLM server: HTTP surface, engines, tokens, KV events, metrics.

Imports sim.replica only (never sim.des).
"""
