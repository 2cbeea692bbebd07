"""The data plane: what receives, checks, performs and answers every trapped call.

One interface, two implementations, chosen by the `data_plane` config key:

- `python`: monitor.plane.answer_loop.PythonAnswerLoop, one thread answering every target
  through monitor/handlers (the readable reference), handing its loop to a new thread when
  one call keeps it (SLOW_CALL);
- `native` (the default): the Rust plane (native/src/plane.rs, monitor._native.Plane): per target,
  `data_plane_threads` native threads blocked in RECV, none holding the GIL, so that a
  target whose call blocks holds only its own threads. Calls the native code does not
  handle (another uid's call, other syscalls) go to the Python reference (Answerer), one
  at a time per target, before anything reached the target. Its counters, per-target call
  counts and refusals are merged into CallStats, Target.calls and the audit log by flush()
  (the middleware does it for the calls the reference answers).

The server holds one DataPlane: serve() for as long as fhmon serve serves, add(target,
hung_up) when a listener registers, remove() once it hung up (returns when no thread
answers its calls), set_keys() on reload, aclose() at the end. Both in-process planes are
ThreadedPlanes: serve() runs their run() on one thread and stop()s it when cancelled (a
worker process runs the same pair on its own thread). With `workers = N` the plane is the
worker processes (monitor/worker_supervisor.py WorkerPlane), whose serve() is their
supervision on fhmon serve's trio loop; its failure() and worker_pids() are what status,
readiness and the metrics read, and which the in-process planes answer with nothing.
"""

from __future__ import annotations

import errno
import importlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from monitor import log
from monitor.labels import refusal_code
from monitor.metrics import LATENCY_BUCKETS, CallStats
from monitor.plane.answer_loop import PythonAnswerLoop
from monitor.plane.thread_cache import MAX_CACHED_THREADS
from protocol import kernel

if TYPE_CHECKING:
    from monitor import _native
    from monitor.calls import Answerer, Target
    from monitor.listener import SharedReceiveLock
    from monitor.policy import Share
    from monitor.signing import KeyRing

_log = logging.getLogger("fhmon.dataplane")


class DataPlaneUnavailable(Exception):
    """The configured data plane cannot run here; the message says what to do."""


class DataPlane(Protocol):
    def add(self, target: Target, hung_up: Callable[[], None]) -> None: ...
    def remove(self, target: Target) -> None: ...
    def set_keys(self, keys: KeyRing) -> None: ...
    def close(self) -> None: ...

    def flush(self) -> None:
        """Counters, latency buckets and refusals of the calls answered so far into CallStats
        and the audit log now (status and scrapes call it, so that they see every answer)."""

    async def serve(self) -> None:
        """What the plane does while fhmon serve serves, in fhmon serve's nursery until it is
        cancelled; raises when the plane can no longer answer."""

    async def aclose(self) -> None:
        """close() where fhmon serve ends (the worker processes are waited for)."""
        self.close()

    def failure(self) -> str | None:
        """Why the plane can no longer answer (readiness says it), or None."""
        return None

    def worker_pids(self) -> list[int]:
        """The processes that answer for fhmon serve (status lists them): none in-process."""
        return []


class ThreadedPlane(DataPlane, Protocol):
    """An in-process plane: run() on one thread until stop() (fhmon serve's serve(), or a
    worker process's own thread)."""

    def run(self) -> None: ...
    def stop(self) -> None: ...

    async def serve(self) -> None:
        """run() on a thread; when cancelled, stop() it and return once run() has."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_cancel, self.stop)
            try:
                await trio.to_thread.run_sync(self.run)  # waits for the thread, always
            finally:
                nursery.cancel_scope.cancel()


async def _stop_on_cancel(stop: Callable[[], None]) -> None:
    try:
        await trio.sleep_forever()
    finally:
        stop()


class PythonDataPlane(PythonAnswerLoop, ThreadedPlane):
    """Today's path: the dispatch thread (the Answerer reads the current keys per call)."""

    def set_keys(self, keys: KeyRing) -> None:
        pass

    def flush(self) -> None:
        pass  # the middleware counts each call into CallStats as it is answered


class NativeDataPlane(ThreadedPlane):
    """monitor._native.Plane behind the DataPlane interface."""

    def __init__(self, answer: Answerer, stats: CallStats, keys: KeyRing, *, signing: bool,
                 threads_per_target: int | str, pidfds_per_target: int) -> None:
        try:
            _native = importlib.import_module("monitor._native")
        except ImportError as exc:
            raise DataPlaneUnavailable(
                f'data_plane = "native" needs the Rust extension monitor._native, which does '
                f'not load ({exc}): reinstall fhmon with `pip install .` (it needs cargo) or '
                f'set data_plane = "python"') from None
        from monitor.handlers.name_to_handle_at import ACCEPTED_FLAGS

        self._answer = answer
        self._stats = stats
        self._targets: dict[int, tuple[Target, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        threads, auto = native_threads(threads_per_target)
        config = _native.PlaneConfig(accepted_flags=ACCEPTED_FLAGS, signing=signing,
                                     threads_per_target=threads, auto_threads=auto,
                                     buckets=list(LATENCY_BUCKETS),
                                     pidfds_per_target=pidfds_per_target)
        self._plane = _native.Plane(config, self._fallback, self._hung_up)
        try:
            self._plane.set_keys(keys.native())
        except ValueError as exc:  # mlock refused (RLIMIT_MEMLOCK)
            raise DataPlaneUnavailable(
                f"the native data plane cannot lock its key memory ({exc}): raise the "
                f"memlock limit (ulimit -l, LimitMEMLOCK=) or set data_plane = \"python\""
            ) from None

    def add(self, target: Target, hung_up: Callable[[], None]) -> None:
        with self._lock:
            self._targets[target.target_id] = (target, hung_up)
        try:
            self._plane.add(target.target_id, target.listener.fd, target.peer.uid,
                            native_share_root(target.share))
        except BaseException:
            with self._lock:
                del self._targets[target.target_id]
            raise

    def remove(self, target: Target) -> None:
        self._plane.remove(target.target_id)
        self.flush()  # its last refusals are audited while its share is still known
        with self._lock:
            self._targets.pop(target.target_id, None)

    def set_keys(self, keys: KeyRing) -> None:
        """Swap in a new ring; KeyDirError (the old ring stays) if its memory cannot be
        locked (mlock's ENOMEM under RLIMIT_MEMLOCK: fhmon holds no CAP_IPC_LOCK)."""
        try:
            native = keys.native()
        except ValueError as exc:
            from monitor.signing import KeyDirError

            raise KeyDirError(
                f"the native data plane cannot lock the new keys' memory ({exc}; "
                f"{len(keys.key_ids)} keys, a page each): the keys in use stay; retire "
                f"keys, or raise the memlock limit (ulimit -l, LimitMEMLOCK=)") from None
        self._plane.set_keys(native)

    def run(self) -> None:
        """Until stop(): merge the native counters and refusals as they come."""
        while not self._plane.stopped:
            self._plane.wait(0.5)
            self.flush()
        self.flush()

    def stop(self) -> None:
        self._plane.stop()

    def close(self) -> None:
        self._plane.stop()

    def flush(self) -> None:
        """The native counts into CallStats, the native refusals into the audit log."""
        counted = self._plane.take_stats()
        results, refusals = counted.results, counted.refusals
        if results or refusals:  # a refusal is counted before its call's result
            self._stats.merge(
                {(syscall, _result_name(code)): n for syscall, code, n in results},
                dict(counted.seconds), dict(refusals),
                {s: list(c) for s, c in counted.buckets})
        for target_id, n in counted.calls:  # Target.calls: the reference counts its own
            with self._lock:
                entry = self._targets.get(target_id)
            if entry is not None:
                entry[0].calls += n
        if counted.panics:
            log.event("data_plane_panic", logging.ERROR, calls=counted.panics,
                      detail="a native call's work panicked; answered EIO, thread serves on")
        events, dropped = self._plane.drain_events()
        for event in events:
            with self._lock:
                entry = self._targets.get(event.target_id)
            log.audit("call_refused", syscall=event.syscall, errno=_result_name(event.errno),
                      reason=event.reason, code=refusal_code(event.reason), tid=event.tid,
                      tgid=event.tgid,
                      share=entry[0].share.facts.host_path if entry else None,
                      target=event.target_id)
        if dropped:
            log.event("audit_dropped", logging.WARNING, refusals=dropped)

    def _fallback(self, target_id: int, raw: bytes) -> None:
        """On a native thread (with the GIL): the reference answers this call."""
        with self._lock:
            entry = self._targets.get(target_id)
        if entry is None:
            return
        try:
            self._answer(entry[0], kernel.Notification.parse(raw))
        except Exception:
            _log.exception("the reference handler failed")

    def _hung_up(self, target_id: int) -> None:
        with self._lock:
            entry = self._targets.get(target_id)
        if entry is not None:
            entry[1]()


def native_share_root(share: Share) -> _native.ShareRoot:
    """The share as the native plane's add() takes it; its fds stay the share's own (the
    plane duplicates them)."""
    from monitor import _native

    facts = share.facts
    return _native.ShareRoot(share_id=facts.share_id, dir_fd=share.dir_fd,
                             path_fd=share.path_fd, mount_id=facts.mount_id, dev=facts.dev,
                             ino=facts.ino, whole_fs=facts.whole_fs)


def _result_name(code: int) -> str:
    if code == 0:
        return "ok"
    if code < 0:
        return "gone"
    return errno.errorcode.get(code, str(code))


def native_threads(setting: int | str) -> tuple[int, bool]:
    """data_plane_threads as the native plane takes it: (threads per target, auto)."""
    if setting == "auto":
        return 2, True
    return int(setting), False


def make_data_plane(plane: str, answer: Answerer, stats: CallStats, keys: KeyRing, *,
                    signing: bool, threads_per_target: int | str,
                    pidfds_per_target: int = MAX_CACHED_THREADS,
                    shared: SharedReceiveLock | None = None) -> ThreadedPlane:
    """The plane `data_plane` names, for fhmon serve and for each worker alike.

    pidfds_per_target: the native plane's bound on each target's cached thread pidfds (the
    python plane's is each Target's ThreadCache: both come from cached_threads_per_target).
    shared: the lock of workers that all wait on every listener. Only the python plane
    needs it (another process may RECV the call its epoll reported); the native plane's
    threads block in RECV on their own listener, and a call goes to exactly one RECV.
    """
    if plane == "native":
        return NativeDataPlane(answer, stats, keys, signing=signing,
                               threads_per_target=threads_per_target,
                               pidfds_per_target=pidfds_per_target)
    return PythonDataPlane(answer, shared=shared)


__all__ = ["DataPlane", "DataPlaneUnavailable", "NativeDataPlane", "PythonDataPlane",
           "ThreadedPlane", "make_data_plane", "native_share_root", "native_threads"]
