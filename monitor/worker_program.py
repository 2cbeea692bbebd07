"""Worker processes (`workers = N`): the calls are answered outside `fhmon serve`.

Why: an answer whose process is SIGKILLed in the middle of ADDFD|SEND leaves the target's
open_by_handle_at returning 0 with no fd (docs/semantics.md, "Monitor death"). A worker
answers on the configured data plane (monitor/dataplane.py: native threads by default, or
the Python reference), so that a hard kill of `fhmon serve` alone (the OOM killer, kill -9)
interrupts no answer. With the python plane, workers were also more CPUs for the GIL-bound
reference. Each worker holds its own copies of every listener and share fd and receives
from the listeners like any holder of a listener may (the kernel gives each notification to
exactly one reader). `fhmon serve` keeps registration, the keeper, the metrics endpoint and
the key watcher: it sends each worker every new target and every key change
(protocol/worker.py), and merges what the workers report into its own counters and metrics.

A worker ends when its control socket reaches EOF, that is when `fhmon serve` closes it
or dies (even by SIGKILL: the kernel closes a dead process's fds), or on SIGTERM: it
finishes the call it is answering, then exits, so a hard kill of `fhmon serve` alone never
interrupts an fd injection. (Not PR_SET_PDEATHSIG: it fires when the parent *thread* ends,
and trio starts processes from a short-lived thread.) If a worker dies, `fhmon serve` stops
(and `fhmon launch` recovers the calls it held, as after any restart).

    python -m monitor.worker_program CONTROL_FD RECEIVE_LOCK_FD   (started by `fhmon serve`)

`fhmon serve`'s end of each worker (spawn, messages, supervision) is
monitor/worker_supervisor.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time

from monitor import fdpass, log
from monitor.calls import PeerCred, Target, reference_answerer
from monitor.dataplane import DataPlaneUnavailable, ThreadedPlane, make_data_plane
from monitor.hardening import lock_down
from monitor.listener import Listener, SharedReceiveLock
from monitor.metrics import CallStats
from monitor.plane.thread_cache import ThreadCache
from monitor.policy import Share
from monitor.signing import KeyDirError, KeyRing
from protocol import worker as wire

REPORT_INTERVAL = 0.5  # seconds between reports to fhmon serve


class Worker:
    def __init__(self, control: socket.socket, start: wire.Start, keys: KeyRing,
                 receive_lock: SharedReceiveLock) -> None:
        self.control = control
        self.start = start
        self.receive_lock = receive_lock
        self.keys = keys
        self.stats = CallStats()
        answer = reference_answerer(self.stats, lambda: self.keys, start.signing)
        self.plane: ThreadedPlane = make_data_plane(
            start.data_plane, answer, self.stats, keys, signing=start.signing,
            threads_per_target=start.data_plane_threads,
            pidfds_per_target=start.pidfds_per_target, shared=receive_lock)
        self.targets: dict[int, Target] = {}
        self._hung_up: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._reported_calls: dict[int, int] = {}

    def run(self) -> None:
        thread = threading.Thread(target=self.plane.run, name="fhmon-worker-plane")
        thread.start()
        try:
            self._control_loop()
        finally:
            self.plane.stop()  # each call being answered is answered first
            thread.join()
            with contextlib.suppress(OSError):
                self._report()
            for target_id in list(self.targets):
                self._forget(target_id)
            self.plane.close()
            self.receive_lock.close()

    def _control_loop(self) -> None:
        self.control.settimeout(REPORT_INTERVAL)
        due = time.monotonic() + REPORT_INTERVAL
        while True:
            try:
                data, fds, _ = fdpass.recv_fds(self.control, wire.MAX_MESSAGE,
                                               wire.ADD_TARGET_FDS)
            except TimeoutError:
                data, fds = None, []
            if data == b"":
                return  # fhmon serve closed the control socket: stop
            if data is not None:
                self._handle(wire.decode(data), fds)
            while not self._hung_up.empty():
                self._forget(self._hung_up.get())
            if time.monotonic() >= due:
                self._report()
                due = time.monotonic() + REPORT_INTERVAL

    def _handle(self, message: wire.Message, fds: list[int]) -> None:
        if isinstance(message, wire.AddTarget) and len(fds) == wire.ADD_TARGET_FDS:
            self._add(message, fds)
            return
        for fd in fds:
            os.close(fd)
        if isinstance(message, wire.RemoveTarget):
            self._forget(message.target_id)
        elif isinstance(message, wire.ReloadKeys):
            try:
                keys = KeyRing.load(self.start.key_dir)
                self.plane.set_keys(keys)  # the native plane keeps its own (locked) copy
            except KeyDirError as exc:  # the ring in use stays (in both planes)
                log.event("worker_keys_reload_failed", logging.ERROR, error=str(exc))
                return
            self.keys = keys
        else:
            raise wire.WorkerProtocolError(f"unexpected {type(message).__name__}")

    def _add(self, message: wire.AddTarget, fds: list[int]) -> None:
        listener_fd, path_fd, dir_fd = fds
        target = Target(message.target_id, Listener(listener_fd),
                        Share(message.share, path_fd, dir_fd), message.pid,
                        PeerCred(message.peer_pid, message.peer_uid, message.peer_gid),
                        message.convention,
                        threads=ThreadCache(self.start.pidfds_per_target))
        self.targets[target.target_id] = target
        # on a plane thread: the control loop forgets it (never the plane's own thread,
        # which remove() would wait for)
        self.plane.add(target, lambda: self._hung_up.put(target.target_id))

    def _forget(self, target_id: int) -> None:
        """The filter has no task left: seen by fhmon serve, or by this worker's plane (a
        python-plane listener is armed EPOLLEXCLUSIVE in every worker, so its hang-up wakes
        only one of them). Called on the control loop's thread only: the first call closes
        the target, later ones find it gone."""
        target = self.targets.pop(target_id, None)
        if target is not None:
            self.plane.remove(target)  # waits until no call of it is being answered
            target.close()

    def _report(self) -> None:
        self.plane.flush()  # the native plane's counts and refusals up to now
        results, seconds, refusals, buckets = self.stats.take()
        report = wire.Report(results=results, seconds=seconds, refusals=refusals,
                             buckets=buckets)
        for target_id, target in list(self.targets.items()):
            new = target.calls - self._reported_calls.get(target_id, 0)
            if new:
                report.calls[target_id] = new
                self._reported_calls[target_id] = target.calls
        for target_id in list(self._reported_calls):
            if target_id not in self.targets:
                del self._reported_calls[target_id]
        if not report.empty():
            self.control.sendall(wire.encode(report))


def _stop_on_signal(control: socket.socket) -> None:
    """SIGTERM: shut the control socket down, so that the control loop reads EOF and the
    worker stops after the call its dispatch thread may be answering."""

    def handler(*_: object) -> None:
        with contextlib.suppress(OSError):
            control.shutdown(socket.SHUT_RDWR)

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(arg.isdigit() for arg in argv):
        print("usage: python -m monitor.worker_program CONTROL_FD RECEIVE_LOCK_FD (started "
              "by fhmon serve)", file=sys.stderr)
        return 2
    control = socket.socket(fileno=int(argv[0]))
    receive_lock = SharedReceiveLock.adopt(int(argv[1]))
    _stop_on_signal(control)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C goes to fhmon serve
    if os.getppid() == 1:
        return 1  # fhmon serve is already gone
    control.settimeout(10)
    try:
        start = wire.decode(control.recv(wire.MAX_MESSAGE))
    except (OSError, wire.WorkerProtocolError) as exc:
        print(f"fhmon worker: no start message: {exc}", file=sys.stderr)
        return 2
    if not isinstance(start, wire.Start):
        print("fhmon worker: the first message was not a start message", file=sys.stderr)
        return 2
    log.setup(start.log_level)
    try:
        keys = KeyRing.load(start.key_dir)
    except KeyDirError as exc:
        log.event("worker_failed", logging.ERROR, error=str(exc))
        return 2
    lock_down(drop_caps=start.drop_capabilities, sandbox=start.sandbox)
    try:
        worker = Worker(control, start, keys, receive_lock)
    except DataPlaneUnavailable as exc:
        log.event("worker_failed", logging.ERROR, error=str(exc))
        return 2
    log.event("worker_serving", pid=os.getpid())  # ready: every fd of its own is open
    control.sendall(wire.encode(wire.Ready()))  # fhmon serve says "serving" after this
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
