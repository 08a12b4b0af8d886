"""Request ids: 32 hex digits, unique across processes and restarts, without a system call.

``uuid.uuid4()`` reads 16 bytes from the kernel on every call: two per request were 3 %
of the router's CPU per short request (``bench/profile_router.py``). Here an id is a
random 64-bit process prefix (from ``os.urandom`` once, drawn again in a forked child:
``lmroute serve --workers`` forks) followed by a 64-bit counter: as unguessable across
processes as the prefix, unique within one, and the same shape as ``uuid4().hex``.
"""

from __future__ import annotations

import itertools
import os

_prefix = ""
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix = os.urandom(8).hex()
    _counter = itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh request id: 16 hex digits of process prefix, 16 of counter."""
    return f"{_prefix}{next(_counter):016x}"
