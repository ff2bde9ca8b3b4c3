"""``Background``: the tasks a session collaborator starts and does not await (a save after a turn, a prune, a slot
released when the engine is done with it), each held until it ends so that none is garbage-collected mid-run, and
all cancelled at once when the owner closes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TypeVar

T = TypeVar("T")


class Background:
    """The tasks started by ``spawn`` that have not ended yet."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def spawn(self, work: Coroutine[object, object, T]) -> asyncio.Task[T]:
        """Run ``work`` in the background, kept until it ends (``cancel`` cancels what is left)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel(self) -> None:
        """Cancel every task that has not ended yet."""
        for task in list(self._tasks):
            task.cancel()
