"""Drive a ``Scheduler`` until a set of requests has finished.

Kept apart from the scheduler so that callers that want continuous batching across calls (a
server) use ``Scheduler.add/step`` directly, while batch callers (API, CLI) use ``run_requests``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from constrain.engine.scheduler import Scheduler
from constrain.engine.types import GenerationRequest, GenerationResult


def run_requests(
    scheduler: Scheduler,
    requests: Sequence[GenerationRequest],
    on_result: Callable[[int, GenerationResult], None] | None = None,
) -> list[GenerationResult]:
    """Queue ``requests``, step until all of them finished, return results in request order.

    ``on_result(index, result)`` is called as each request finishes (progress bars, streaming
    to a file).
    """
    ids = [scheduler.add(r) for r in requests]
    index = {rid: i for i, rid in enumerate(ids)}
    results: list[GenerationResult | None] = [None] * len(ids)
    while any(r is None for r in results):
        finished = scheduler.step()
        if not finished and not scheduler.has_work():
            raise RuntimeError("scheduler ran out of work before every request finished")
        for rid, res in finished:
            i = index.get(rid)
            if i is None:
                continue
            results[i] = res
            if on_result is not None:
                on_result(i, res)
    return results  # type: ignore[return-value]
