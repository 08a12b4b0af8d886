"""Background task helpers shared by the router's long-running loops."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every task, wait until each has ended, and empty the list."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()
