"""monitor/worker_supervisor.py WorkerPlane, without worker processes: the hang-up watch and
the merging of reports, which fhmon serve's one path for every data plane relies on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from monitor.metrics import CallStats
from monitor.worker_supervisor import HANG_UP_POLL, WorkerPlane
from protocol import worker as wire


def fake_target(target_id: int, hung_up: list[bool]) -> Any:
    """What the plane reads of a Target: its id, calls, and its listener's hang-up."""
    return SimpleNamespace(target_id=target_id, calls=0,
                           listener=SimpleNamespace(hung_up=lambda: hung_up[0]))


async def test_a_hang_up_is_told_once_and_reports_count_until_remove() -> None:
    plane = WorkerPlane(CallStats())
    hung_up, told = [False], []
    target = fake_target(3, hung_up)
    plane.add(target, lambda: told.append(3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plane.serve)
        await trio.sleep(HANG_UP_POLL * 2)
        assert told == []
        plane._merge_report(wire.Report(calls={3: 5, 4: 1}))
        hung_up[0] = True
        await trio.sleep(HANG_UP_POLL * 3)
        assert told == [3]
        plane._merge_report(wire.Report(calls={3: 2}))  # reported after the hang-up
        plane.remove(target)
        plane._merge_report(wire.Report(calls={3: 9}))
        nursery.cancel_scope.cancel()
    assert target.calls == 7


def test_a_worker_that_ended_is_the_planes_failure() -> None:
    """What readiness and status read of the plane: the workers' pids, and that one ended."""
    plane = WorkerPlane(CallStats())
    processes = [SimpleNamespace(pid=pid, returncode=None) for pid in (10, 11)]
    plane.workers = [SimpleNamespace(process=process) for process in processes]  # type: ignore[misc]
    assert (plane.failure(), plane.worker_pids()) == (None, [10, 11])
    processes[1].returncode = -9
    assert plane.failure() == "a worker process ended"
