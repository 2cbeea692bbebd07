"""monitor.dataplane: the configured plane is built, or refused with a message that says
what to do."""

from __future__ import annotations

import sys

import pytest

from monitor import dataplane
from monitor.calls import Answerer
from monitor.config import Config
from monitor.handlers.registry import HandlerRegistry
from monitor.metrics import CallStats
from monitor.signing import KeyRing


def _make(plane: str) -> dataplane.DataPlane:
    keys = KeyRing({1: bytes(range(32))}, 1)
    config = Config(data_plane=plane)
    return dataplane.make_data_plane(config.data_plane,
                                     Answerer(HandlerRegistry(), lambda: keys, True), CallStats(),
                                     keys, signing=config.signing,
                                     threads_per_target=config.data_plane_threads)


def test_each_setting_builds_its_plane() -> None:
    python = _make("python")
    assert isinstance(python, dataplane.PythonDataPlane)
    python.close()
    native = _make("native")
    assert isinstance(native, dataplane.NativeDataPlane)
    native.stop()


async def test_an_in_process_plane_serves_on_a_thread_until_cancelled() -> None:
    """serve() runs the plane's loop on a thread and returns, stopped, when cancelled; an
    in-process plane has no failure and no worker process to report."""
    import trio

    for name in ("python", "native"):
        plane = _make(name)
        with trio.move_on_after(0.3) as waited:
            await plane.serve()
        assert waited.cancelled_caught  # it served until cancelled, then returned
        assert (plane.failure(), plane.worker_pids()) == (None, [])
        plane.close()


def test_a_missing_extension_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "monitor._native", None)  # import fails
    with pytest.raises(dataplane.DataPlaneUnavailable, match='set data_plane = "python"'):
        _make("native")
