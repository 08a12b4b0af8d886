"""The router's ASGI app for a server other than ``lmroute serve``'s, from ``LMROUTE_*``.

``lmroute serve`` runs the app on uvicorn and adds two things of its own: OpenAI-shaped
answers to malformed HTTP (``router.framing``) and a drain on SIGTERM (``router.drain``).
Any other ASGI server can serve the same app, without those two, as ``router.asgi:app``;
the settings come from the environment (``LMROUTE_BACKENDS``, ``LMROUTE_POLICY``, ...:
``lmroute serve --help`` names them all), with ``LMROUTE_CONFIG`` naming a settings file:

    LMROUTE_BACKENDS=http://127.0.0.1:8001 granian --interface asgi router.asgi:app

Start-up is ``lmroute serve``'s: the same settings errors (no backend is one), logging
configured, then the GC frozen once the app is built (``router.hotpath.freeze_gc``). A
server's own worker processes each import this module, so each builds its own app: as with
``lmroute serve --workers``, they share what they learn only through ``LMROUTE_INDEX``
(Redis) or the engines' KV events. ``bench/peers.py --server`` measures such servers
against uvicorn (docs/benchmarks.md).
"""

from __future__ import annotations

import os

from router.app import create_app
from router.hotpath import freeze_gc
from router.logs import configure
from router.settings import load_settings

settings = load_settings({}, os.environ, os.environ.get("LMROUTE_CONFIG"))
if not settings.backends and not settings.backends_file:
    raise SystemExit("lmroute: LMROUTE_BACKENDS (or LMROUTE_BACKENDS_FILE) is required")
configure(settings.log_format, settings.log_level, settings.access_log)
app = create_app(settings)
if settings.gc_freeze:
    freeze_gc(settings.gc_threshold0)
