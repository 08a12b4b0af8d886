"""Request ids: uuid4-shaped, unique in a process, and a forked worker's differ from its parent's."""

from __future__ import annotations

import os
import re

from router.ids import new_id


def test_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_its_own_prefix() -> None:
    read, write = os.pipe()
    parent = new_id()
    pid = os.fork()
    if pid == 0:  # the child: what --workers' forked workers run
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    # Same counter position, so only a fresh prefix keeps the two apart.
    assert child[:16] != parent[:16] and child != new_id()
