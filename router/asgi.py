"""The router's ASGI app for a server other than ``lmroute serve``'s, from ``LMROUTE_*``.

``lmroute serve`` runs the app on uvicorn and adds two things of its own: OpenAI-shaped
answers to malformed HTTP (``router.framing``) and a drain on SIGTERM (``router.drain``).
Any other ASGI server can serve the same app, without those two, as ``router.asgi:app``;
the settings come from the environment (``LMROUTE_BACKENDS``, ``LMROUTE_POLICY``, ...:
``lmroute serve --help`` names them all), with ``LMROUTE_CONFIG`` naming a settings file:

    LMROUTE_BACKENDS=http://127.0.0.1:8001 granian --interface asgi router.asgi:app

Start-up is ``lmroute serve``'s: logging configured, then the GC frozen once the app is
built (``router.hotpath.freeze_gc``). ``bench/peers.py --server`` measures such servers
against uvicorn (docs/benchmarks.md).
"""

from __future__ import annotations

import os

from router.app import create_app
from router.hotpath import freeze_gc
from router.logs import configure
from router.settings import load_settings

settings = load_settings({}, os.environ, os.environ.get("LMROUTE_CONFIG"))
configure(settings.log_format, settings.log_level, settings.access_log)
app = create_app(settings)
if settings.gc_freeze:
    freeze_gc(settings.gc_threshold0)
