"""``lmroute validate``: does a reused KV cache give the same greedy reply as computing it?

The study's service regression over HTTP, against a running deployment (a router, or its
replicas directly). Modules: ``config`` (the run's parameters), ``client`` (requests to
the replicas: pinned through a router, or direct), ``run`` (the tiers), ``compare`` (one
reply against its cold reference, and per-tier verdicts), ``report`` (table, JSON, PNG),
``command`` (the CLI). The method and its tolerances: docs/validate.md.
"""
