"""`fhmon serve`'s end of its worker processes (`workers = N`): spawn, talk, stop.

The worker program itself is monitor/worker_program.py (`python -m monitor.worker_program`);
the messages between the two are protocol/worker.py. fhmon serve holds the workers as one
data plane, a WorkerPlane (monitor/dataplane.py's interface, as the in-process planes): it
keeps one WorkerProcess per worker, sends each every registered target and every key
change, merges their reports, notices each target's hang-up, and stops the service if a
worker ends.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from monitor import fdpass, log
from protocol import worker as wire

if TYPE_CHECKING:
    from monitor.calls import Target
    from monitor.metrics import CallStats
    from monitor.signing import KeyRing

WORKER_START_TIMEOUT = 30.0  # seconds for every worker to load its keys and lock down
HANG_UP_POLL = 0.25  # seconds between looks at each target's listener for its hang-up


class WorkerStartError(RuntimeError):
    """A worker process did not get ready."""


class WorkerProcess:
    """`fhmon serve`'s end of one worker: the process and its control socket."""

    def __init__(self, process: trio.Process, control: socket.socket) -> None:
        self.process = process
        self.control = control

    @classmethod
    async def spawn(cls, start: wire.Start, receive_lock_fd: int) -> WorkerProcess:
        """receive_lock_fd: the file behind every worker's SharedReceiveLock."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "monitor.worker_program", str(theirs.fileno()),
                 str(receive_lock_fd)], pass_fds=(theirs.fileno(), receive_lock_fd))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.sendall(wire.encode(start))
        ours.setblocking(False)
        return cls(process, ours)

    def add(self, target: Target) -> None:
        share = target.share
        message = wire.AddTarget(
            target.target_id, target.pid, target.peer.pid, target.peer.uid, target.peer.gid,
            target.convention, share.facts)
        self._send(wire.encode(message), [target.listener.fd, share.path_fd, share.dir_fd])

    def remove(self, target: Target) -> None:
        self._send(wire.encode(wire.RemoveTarget(target.target_id)))

    def reload_keys(self) -> None:
        self._send(wire.encode(wire.ReloadKeys()))

    def _send(self, data: bytes, fds: list[int] | None = None) -> None:
        # Small messages on a socket the worker always reads: blocking briefly is fine.
        self.control.setblocking(True)
        try:
            self.control.sendmsg([data], fdpass.rights(fds) if fds else [])
        finally:
            self.control.setblocking(False)

    async def _next_message(self) -> wire.Message | None:
        """The worker's next message; None once it closed its end, or died with a message
        of ours unread (ECONNRESET)."""
        while True:
            await trio.lowlevel.wait_readable(self.control)
            try:
                data = self.control.recv(wire.MAX_MESSAGE)
            except BlockingIOError:
                continue
            except OSError:
                return None
            return wire.decode(data) if data else None

    async def ready(self) -> None:
        """Wait for the worker's Ready: its keys are loaded and it answers calls.

        Until every worker is ready fhmon serve accepts no registration: a worker whose
        start failed (say the key directory broke in between) must stop the start-up, not
        a service that already serves.
        """
        message = await self._next_message()
        if message is None:
            raise WorkerStartError(f"worker {self.process.pid} ended before it was ready "
                                   f"(its worker_failed event says why)")
        if not isinstance(message, wire.Ready):
            raise WorkerStartError(f"worker {self.process.pid} sent "
                                   f"{type(message).__name__} before Ready")

    async def reports(self, merge: Callable[[wire.Report], None]) -> None:
        """Merge every report until the worker closes its end."""
        while (message := await self._next_message()) is not None:
            if isinstance(message, wire.Report):
                merge(message)

    async def stop(self, grace: float = 5.0) -> None:
        """Close the control socket (the worker finishes its call and exits), then wait."""
        self.control.close()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


class WorkerPlane:
    """The worker processes as fhmon serve's data plane (monitor/dataplane.py DataPlane):
    they answer every call, each from its own copies of the fds; fhmon serve sends them
    the targets and key changes, merges their reports into CallStats and Target.calls,
    and notices each target's hang-up by polling its listener (never RECV here: a
    notification must go to a worker).

    Its life is async, on fhmon serve's trio loop: start() before the sandbox (which
    allows no execve), serve() while fhmon serve serves, aclose() at the end; no thread of
    fhmon serve answers.
    """

    def __init__(self, stats: CallStats) -> None:
        self._stats = stats
        self.workers: list[WorkerProcess] = []
        self._targets: dict[int, Target] = {}  # added and not yet removed
        self._awaiting_hang_up: dict[int, Callable[[], None]] = {}  # by target id

    async def start(self, start: wire.Start, count: int) -> None:
        """Spawn `count` workers and wait until every one is ready (WorkerStartError if one
        is not within WORKER_START_TIMEOUT). Those spawned are in self.workers as they
        come, so that aclose() stops them whatever happens here."""
        receive_lock_fd = os.memfd_create("fhmon-receive-lock", os.MFD_CLOEXEC)
        try:
            for _ in range(count):
                self.workers.append(await WorkerProcess.spawn(start, receive_lock_fd))
        finally:
            os.close(receive_lock_fd)
        with trio.move_on_after(WORKER_START_TIMEOUT) as waiting:
            for worker in self.workers:
                await worker.ready()
        if waiting.cancelled_caught:
            raise WorkerStartError(f"the worker processes were not ready within "
                                   f"{WORKER_START_TIMEOUT:g} s")

    def failure(self) -> str | None:
        """A worker process that ended: the service then stops (serve raises)."""
        if any(w.process.returncode is not None for w in self.workers):
            return "a worker process ended"
        return None

    def worker_pids(self) -> list[int]:
        return [worker.process.pid for worker in self.workers]

    # --- the DataPlane interface --------------------------------------------------------
    def add(self, target: Target, hung_up: Callable[[], None]) -> None:
        self._targets[target.target_id] = target
        self._awaiting_hang_up[target.target_id] = hung_up
        for worker in self.workers:
            worker.add(target)

    def remove(self, target: Target) -> None:
        """Forget the target. The workers were told when its hang-up was seen (in
        _watch_hang_ups); a target removed before its hang-up is one the service stops
        serving as it stops, and the workers keep their copies until aclose() ends them."""
        self._targets.pop(target.target_id, None)
        self._awaiting_hang_up.pop(target.target_id, None)

    def set_keys(self, keys: KeyRing) -> None:
        """Each worker loads the key directory again itself (its ring is its own)."""
        for worker in self.workers:
            worker.reload_keys()

    def flush(self) -> None:
        """Nothing to take now: the workers report every 0.5 s (serve merges it)."""

    def close(self) -> None:
        """Close every control socket: each worker finishes its call and exits at EOF."""
        for worker in self.workers:
            worker.control.close()

    async def serve(self) -> None:
        """While the service serves: merge every worker's reports, notice the targets'
        hang-ups; raise if a worker ends (its calls in flight are recovered by
        `fhmon launch`, as after any restart)."""
        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(self._supervise_worker, worker)
            nursery.start_soon(self._watch_hang_ups)

    async def aclose(self) -> None:
        """Stop every worker: it finishes its call and exits; killed after a grace time."""
        for worker in self.workers:
            await worker.stop()
        self.workers.clear()

    # --- on fhmon serve's trio loop -------------------------------------------------------
    async def _supervise_worker(self, worker: WorkerProcess) -> None:
        """A worker must live as long as the service: if one ends, the service stops."""
        await worker.reports(self._merge_report)
        code = await worker.process.wait()
        log.event("worker_died", logging.ERROR, pid=worker.process.pid, returncode=code)
        raise RuntimeError(f"worker process {worker.process.pid} ended (status {code})")

    def _merge_report(self, report: wire.Report) -> None:
        self._stats.merge(report.results, report.seconds, report.refusals, report.buckets)
        for target_id, calls in report.calls.items():
            target = self._targets.get(target_id)
            if target is not None:
                target.calls += calls

    async def _watch_hang_ups(self) -> None:
        """Each target's hang-up: tell every worker to close its copies (the hang-up woke
        only one worker, if any), then call the target's hung_up, once."""
        while True:
            for target_id, hung_up in list(self._awaiting_hang_up.items()):
                target = self._targets[target_id]
                if target.listener.hung_up():
                    del self._awaiting_hang_up[target_id]
                    for worker in self.workers:
                        worker.remove(target)
                    hung_up()
            await trio.sleep(HANG_UP_POLL)
