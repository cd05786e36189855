"""Batching across requests without a timer: a lone request runs at once, the ones that arrive
while a batch runs are run together next.

Ray Serve's ``@serve.batch`` (2.60) forms a batch as soon as its first request arrives and waits
``batch_wait_timeout_s`` for more, whether or not the model is busy: with a timeout every lone
request pays it (5 ms per request before this module), without one the next batches are formed
at once, one request each, and queue for the model. :class:`Batcher` forms a batch only when the
model is free: it takes every request queued by then, up to ``max_rows`` batch rows, in arrival
order. So one client's request runs as soon as it arrives, and concurrent clients' requests
are stacked while the batch before them runs. ``wait_s`` can still hold a batch that has room
for up to that long, for callers who prefer fuller batches to latency.

Nothing here imports Ray: :class:`~embedl_dynamo.serve.replica.Replica` runs every request
through one, in Ray Serve's replica and in tests alike.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["Batcher"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Runs submitted items in batches, one batch at a time, each as soon as the one before it ends.

    Args:
        run: runs one batch: the items in order, their results in the same order.
        rows: how many batch rows an item counts for.
        max_rows: the most rows one batch holds (a larger item runs alone).
        wait_s: how long a batch that has room waits for more items (0: not at all).
    """

    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[Sequence[Result]]],
        rows: Callable[[Item], int],
        max_rows: int,
        wait_s: float = 0.0,
    ) -> None:
        if wait_s < 0:
            raise ValueError(f"wait_s={wait_s!r}: give a number of seconds >= 0")
        self.max_rows, self.wait_s = max(1, max_rows), wait_s
        self._run, self._rows = run, rows
        self._queue: deque[tuple[Item, asyncio.Future]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.batches = 0  # batches run so far
        self.largest = 0  # the most items one batch held

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` and wait for its result.

        Raises:
            Exception: what running its batch raised.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append((item, future))
        if self._arrived is not None:
            self._arrived.set()
        if self._worker is None:  # idle: start the batch now, nothing to wait for
            self._worker = loop.create_task(self._drain())
        return await future

    def _take(self) -> list[tuple[Item, asyncio.Future]]:
        """The next batch: the first live item, then those after it while they fit."""
        batch: list[tuple[Item, asyncio.Future]] = []
        used = 0
        while self._queue:
            item, future = self._queue[0]
            if future.done():  # its caller gave up
                self._queue.popleft()
                continue
            size = self._rows(item)
            if batch and used + size > self.max_rows:
                break
            batch.append(self._queue.popleft())
            used += size
        return batch

    def _queued_rows(self) -> int:
        return sum(self._rows(item) for item, future in self._queue if not future.done())

    async def _fill(self) -> None:
        """Wait up to ``wait_s`` while the queued items leave room in a batch."""
        self._arrived = asyncio.Event()
        deadline = asyncio.get_running_loop().time() + self.wait_s
        try:
            while self._queued_rows() < self.max_rows:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    return
        finally:
            self._arrived = None

    async def _drain(self) -> None:
        try:
            while self._queue:
                if self.wait_s > 0:
                    await self._fill()
                batch = self._take()
                if not batch:
                    continue
                self.batches += 1
                self.largest = max(self.largest, len(batch))
                await self._settle(batch)
        finally:
            self._worker = None  # no await since the queue was seen empty: nothing is lost
            while self._queue:  # left only when this task was cancelled: so are its callers
                self._queue.popleft()[1].cancel()

    async def _settle(self, batch: list[tuple[Item, asyncio.Future]]) -> None:
        futures = [future for _, future in batch]
        try:
            results: Any = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} gave {len(results)} results")
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, result in zip(futures, results):
            if not future.done():
                future.set_result(result)
