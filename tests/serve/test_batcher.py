"""The replica's batcher (:class:`embedl_dynamo.serve.batcher.Batcher`), without Ray or a model:
a lone request runs at once instead of waiting for company, the requests that arrive while a
batch runs are run together next, in order and within the row limit, and a batch's failure
reaches each of its callers."""

from __future__ import annotations

import asyncio

import pytest

from embedl_dynamo.serve.batcher import Batcher


class _Model:
    """A batch runner that records each batch and holds it until released."""

    def __init__(self, hold: bool = False) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def run(self, items: list[tuple[str, int]]) -> list[str]:
        self.batches.append(list(items))
        await self.release.wait()
        return [f"{name}!" for name, _ in items]


def _batcher(model: _Model, max_rows: int = 8, wait_s: float = 0.0) -> Batcher:
    return Batcher(model.run, lambda item: item[1], max_rows, wait_s)


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_request_runs_at_once():
    async def scenario():
        model = _Model(hold=True)
        batcher = _batcher(model)
        task = asyncio.create_task(batcher.submit(("a", 1)))
        await _turns()  # no timer ran: a batcher waiting for company would not have started
        started = [list(b) for b in model.batches]
        model.release.set()
        return started, await task

    started, result = asyncio.run(scenario())
    assert started == [[("a", 1)]]
    assert result == "a!"


def test_requests_arriving_during_a_batch_are_run_together_next():
    async def scenario():
        model = _Model(hold=True)
        batcher = _batcher(model, max_rows=4)
        first = asyncio.create_task(batcher.submit(("a", 1)))
        await _turns()
        items = [("b", 1), ("c", 2), ("d", 1), ("e", 1)]
        later = [asyncio.create_task(batcher.submit(item)) for item in items]
        await _turns()
        model.release.set()
        return model.batches, await first, await asyncio.gather(*later), batcher

    batches, first, later, batcher = asyncio.run(scenario())
    # b, c and d fill the 4 rows of the next batch; e runs after them
    assert batches == [[("a", 1)], [("b", 1), ("c", 2), ("d", 1)], [("e", 1)]]
    assert (first, later) == ("a!", ["b!", "c!", "d!", "e!"])
    assert (batcher.batches, batcher.largest) == (3, 3)


def test_an_item_larger_than_a_batch_runs_alone():
    async def scenario():
        model = _Model(hold=True)
        batcher = _batcher(model, max_rows=2)
        tasks = [asyncio.create_task(batcher.submit(item)) for item in [("a", 1), ("big", 5)]]
        await _turns()
        model.release.set()
        await asyncio.gather(*tasks)
        return model.batches

    assert asyncio.run(scenario()) == [[("a", 1)], [("big", 5)]]


def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_runs():
    calls = []

    async def run(items):
        calls.append(items)
        if len(calls) == 1:
            raise ValueError("the model refused the batch")
        return [name for name, _ in items]

    async def scenario():
        batcher = Batcher(run, lambda item: item[1], 8)
        both = [batcher.submit(("a", 1)), batcher.submit(("b", 1))]
        first = await asyncio.gather(*both, return_exceptions=True)
        return first, await batcher.submit(("c", 1))

    first, after = asyncio.run(scenario())
    assert [str(e) for e in first] == ["the model refused the batch"] * 2
    assert after == "c"


def test_a_wait_holds_a_batch_with_room_for_more():
    async def scenario():
        model = _Model()
        batcher = _batcher(model, max_rows=2, wait_s=30.0)
        first = asyncio.create_task(batcher.submit(("a", 1)))
        await _turns()
        assert model.batches == []  # waiting for a second row
        second = asyncio.create_task(batcher.submit(("b", 1)))
        return await first, await second, model.batches

    assert asyncio.run(scenario()) == ("a!", "b!", [[("a", 1), ("b", 1)]])


def test_a_negative_wait_is_refused():
    with pytest.raises(ValueError, match="wait_s=-1"):
        Batcher(_Model().run, len, 8, -1)
