"""A replica's streamed body as an async iterator: the one piece of the replica hop that
is an async generator, kept in this small pure-Python module because mypyc does not
compile async generators (``make fast`` compiles ``router.wire`` and ``router.upstream``).

Each iterator yields the body's bytes as they arrive, unbuffered and unframed, and ends at
the body's end; a broken stream raises ``UpstreamStreamBroken`` (from the response's own
``next_chunk``). Leaving one early (the client left, ``aclose``) closes the replica's
connection, which is how vLLM learns to abort the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class ChunkSource(Protocol):
    """What the iterator needs of a response: its next bytes, and a way to drop it."""

    async def next_chunk(self) -> bytes | None:
        """The next body bytes; None once the body ended."""
        ...

    def abort(self) -> None:
        """Close the connection unless the body was read to its end."""
        ...


async def body_chunks(source: ChunkSource) -> AsyncIterator[bytes]:
    """Yield ``source``'s body bytes until its end; abort it if left before."""
    try:
        while (chunk := await source.next_chunk()) is not None:
            yield chunk
    finally:
        source.abort()  # a no-op once the body was read to its end
