"""The trio service, fhmon serve's composition root: it builds the pieces (intake,
registration checks, the data plane: in-process or worker processes, keeper client,
metrics, key watch)
and owns their lifetimes; one task per registered listener waits for its hang-up.

All emulation work is synchronous and short; trio multiplexes the intake connections and
the listeners. One nursery owns everything, so a stop (SIGTERM/SIGINT) cancels every task
and the finally blocks close every fd.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import resource
import time
from typing import Any

import trio

from monitor import log
from monitor.calls import PeerCred, Target, reference_answerer
from monitor.config import Config
from monitor.dataplane import DataPlane, make_data_plane
from monitor.hardening import lock_down
from monitor.intake import Intake
from monitor.intake_socket import open_intake_socket
from monitor.keeper_client import KeeperClient
from monitor.key_watch import key_dir_fingerprint, watch_key_dir
from monitor.listener import Listener
from monitor.metrics import CallStats
from monitor.plane.thread_cache import ThreadCache, cached_threads_per_target
from monitor.policy import RegistrationRefused
from monitor.proc_status import Credentials
from monitor.prom import Metrics
from monitor.registration import (
    TargetClaim,
    check_registration,
    hello_listener,
    oci_listener,
)
from monitor.signing import KeyDirError, KeyRing
from monitor.stuck_calls import restart_stuck_calls_of
from monitor.worker_supervisor import WorkerPlane
from protocol import intake_wire, oci
from protocol import worker as worker_wire


class MetricsAddressError(OSError):
    """The --metrics-address cannot be bound; the message names it."""


class Service:
    def __init__(self, config: Config, keys: KeyRing,
                 keys_loaded_from: tuple[Any, ...] | None = None) -> None:
        """keys_loaded_from: the key directory's fingerprint taken before `keys` were
        loaded (taken now when not given), so that a change made since is reloaded."""
        self.config = config
        self.keys = keys
        self.keys_loaded_from = (key_dir_fingerprint(config.key_dir)
                                 if keys_loaded_from is None else keys_loaded_from)
        self.stats = CallStats()
        self.targets: dict[int, Target] = {}
        self._ids = itertools.count(1)
        self.metrics = Metrics(self)
        self.keeper = (KeeperClient(config.keeper_socket, self.metrics,
                                    lambda: self.targets.values())
                       if config.keeper_socket else None)
        self._answer = reference_answerer(self.stats, lambda: self.keys, config.signing)
        self.started = time.time()
        self.key_error: str | None = None
        self.intake = Intake(config, self)
        self._plane: DataPlane | None = None  # in-process, or the worker processes
        # each target's fair share of the fd limit for its threads' pidfds (set again
        # once serve() has raised the limit)
        self.pidfds_per_target = cached_threads_per_target(config.max_targets)

    # --- keys -------------------------------------------------------------------------
    def reload_keys(self) -> bool:
        self.keys_loaded_from = key_dir_fingerprint(self.config.key_dir)  # before reading
        try:
            ring = KeyRing.load(self.config.key_dir)
            if self._plane is not None:
                # the native plane keeps its own (locked) copy: made before anything is
                # swapped, so that a ring whose memory cannot be locked changes nothing;
                # each worker process loads the directory itself
                self._plane.set_keys(ring)
        except KeyDirError as exc:
            self.key_error = str(exc)
            log.event("keys_reload_failed", logging.ERROR, error=str(exc))
            return False
        changed = (ring.key_ids, ring.signer) != (self.keys.key_ids, self.keys.signer)
        self.keys = ring  # one reference swap: every call sees the old ring or the new one
        self.key_error = None
        if changed:
            log.event("keys_reloaded", keys=[f"{k:08x}" for k in ring.key_ids],
                      signer=f"{ring.signer:08x}")
        return True

    async def sweep_threads(self, interval: float = 1.0) -> None:
        """Close the cached pidfds of target threads that exited (fd count back to base)."""
        while True:
            await trio.sleep(interval)
            for target in list(self.targets.values()):
                target.threads.sweep()

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        _raise_fd_limit()
        self.pidfds_per_target = cached_threads_per_target(self.config.max_targets)
        intake_socket = open_intake_socket(self.config)
        try:
            # The worker processes before the sandbox (it allows no execve), an in-process
            # plane after it.
            if self.config.workers:
                workers = self._plane = WorkerPlane(self.stats)
                await workers.start(self._worker_start(), self.config.workers)
            for event, fields in lock_down(drop_caps=self.config.drop_capabilities,
                                           sandbox=self.config.sandbox).items():
                log.event(event, **fields)
            if self._plane is None:
                c = self.config
                self._plane = make_data_plane(c.data_plane, self._answer, self.stats,
                                              self.keys, signing=c.signing,
                                              threads_per_target=c.data_plane_threads,
                                              pidfds_per_target=self.pidfds_per_target)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._plane.serve)
                nursery.start_soon(watch_key_dir, self.config.key_dir, self.reload_keys,
                                   lambda: self.keys_loaded_from)
                nursery.start_soon(self.sweep_threads)
                if self.config.metrics_address:
                    from monitor.prom import serve_http

                    try:
                        await nursery.start(serve_http, self.metrics,
                                            self.config.metrics_address)
                    except OSError as exc:  # the socket above is removed in `finally`
                        raise MetricsAddressError(
                            f"metrics address {self.config.metrics_address} (--metrics-address)"
                            f": {exc.strerror or exc}") from None
                if self.keeper is not None:
                    await self.restore_from_keeper(nursery)
                    nursery.start_soon(self.keeper.sync)
                log.event("serving", socket=self.config.socket, key_dir=self.config.key_dir,
                          allow=self.config.allow, keys=[f"{k:08x}" for k in self.keys.key_ids],
                          signer=f"{self.keys.signer:08x}", pid=os.getpid(),
                          pidfds_per_target=self.pidfds_per_target)
                task_status.started()
                await self.intake.serve(intake_socket.sock, nursery)
        finally:
            intake_socket.close()
            if self._plane is not None:
                await self._plane.aclose()
                self._plane = None
            log.event("shutdown", counters=self.stats.as_dict(),
                      refusals=dict(self.stats.refusals),
                      registrations=dict(self.stats.registrations),
                      targets=len(self.targets))

    # --- registration (the intake, monitor/intake.py, carries the bytes) -------------------
    @property
    def accepting(self) -> bool:
        return self.intake.accepting

    def intake_full(self) -> bool:
        return self.intake.admission.full()

    def plane_failure(self) -> str | None:
        """Why the data plane can no longer answer (the service then stops), or None."""
        return self._plane.failure() if self._plane is not None else None

    def count_registration(self, outcome: str) -> None:
        self.stats.registrations[outcome] += 1

    def register_native(self, hello: intake_wire.Hello, fds: list[int], peer: PeerCred,
                        nursery: trio.Nursery,
                        peer_pidfd: int | None = None) -> intake_wire.Accept | intake_wire.Refuse:
        """A HELLO and the fds that came with it (all of them ours to keep or close);
        peer_pidfd: the client's (SO_PEERPIDFD), borrowed."""
        try:
            listener_fd, claim = hello_listener(hello, fds)
            target = self._register(listener_fd, claim, hello.share, peer, "native", nursery,
                                    expected_share_id=hello.share_id, peer_pidfd=peer_pidfd)
        except RegistrationRefused as exc:
            self._refused(peer, exc.reason)
            return intake_wire.Refuse(exc.errno, exc.reason)
        return intake_wire.Accept(target.target_id, target.share.facts.share_id,
                                  f"registered: share {target.share.facts.host_path}")

    def pong(self) -> intake_wire.Pong:
        return intake_wire.Pong(json.dumps({
            "ok": self.key_error is None, "key_error": self.key_error,
            "keys": len(self.keys.key_ids), "targets": len(self.targets),
            "uptime": round(time.time() - self.started, 3)}))

    def _refused(self, peer: PeerCred, reason: str) -> None:
        self.stats.registrations["refused"] += 1
        self.metrics.registrations.labels("refused").inc()
        log.audit("registration_refused", peer_pid=peer.pid, peer_uid=peer.uid, reason=reason)

    def register_oci(self, peer: PeerCred, state: oci.ContainerProcessState,
                     fds: list[int], nursery: trio.Nursery,
                     peer_pidfd: int | None = None) -> None:
        try:
            listener_fd, share = oci_listener(state, fds)
            self._register(listener_fd, TargetClaim(state.pid), share, peer, "oci", nursery,
                           peer_pidfd=peer_pidfd)
            if self.keeper is not None:
                self.keeper.target_added()  # KeeperClient.sync deposits it
        except oci.OciStateError as exc:
            self._refused(peer, str(exc))
        except RegistrationRefused as exc:
            self._refused(peer, exc.reason)

    def _register(self, listener_fd: int, claim: TargetClaim, share_path: str, peer: PeerCred,
                  convention: str, nursery: trio.Nursery,
                  peer_credentials: Credentials | None = None,
                  expected_share_id: bytes | None = None,
                  peer_pidfd: int | None = None) -> Target:
        """Register and serve a listener that passes every check (monitor/registration.py);
        takes ownership of listener_fd and the claim's pidfd in all cases."""
        admitted = check_registration(listener_fd, claim, share_path, peer,
                                      self.targets.values(), self.config,
                                      peer_credentials=peer_credentials,
                                      expected_share_id=expected_share_id,
                                      peer_pidfd=peer_pidfd)
        share, target_pid = admitted.share, admitted.pid
        listener = Listener(listener_fd)
        if self.config.sync_wakeup:
            listener.set_sync_wakeup()
        target = Target(next(self._ids), listener, share, target_pid, peer, convention,
                        threads=ThreadCache(self.pidfds_per_target))
        self.targets[target.target_id] = target
        self.stats.registrations["accepted"] += 1
        self.metrics.registrations.labels("accepted").inc()
        log.event("target_registered", target=target.target_id, pid=target_pid,
                  share=share.facts.host_path, share_in_target=share_path, convention=convention,
                  peer_uid=peer.uid, peer_pid=peer.pid, mount_root=share.facts.is_mount_root,
                  whole_fs=share.facts.whole_fs)
        nursery.start_soon(self._serve_target, target)
        return target

    # --- the keeper (listeners that must outlive this process: monitor/keeper_client.py) ----
    async def before_stop(self) -> None:
        """A graceful stop: make sure the keeper holds every runtime-registered listener
        before ours close (it may be back since moments only: KeeperClient.sync)."""
        if self.keeper is not None:
            await self.keeper.deposit_before_exit()

    async def restore_from_keeper(self, nursery: trio.Nursery) -> int:
        """Withdraw every listener the keeper holds; restart their stuck calls; serve them."""
        assert self.keeper is not None
        restored = 0
        entries = await self.keeper.withdraw()
        for fd, record in entries:
            pid, uid, gid = (int(record.get(key, 0)) for key in ("pid", "uid", "gid"))
            if not record.get("_restarted"):  # a keeper without pidfds (older version)
                # nobody answers them yet: a clean restart (best effort by pid: such a
                # keeper kept no pidfd of the target)
                await restart_stuck_calls_of(pid)
            # the client that registered it is gone: its recorded ids stand in for it
            creds = Credentials(uid, gid, (), -1 if uid == 0 else 0)
            try:
                try:  # the share the listener was first registered with, if recorded
                    expected = bytes.fromhex(str(record["share_id"]))
                except (KeyError, ValueError):
                    expected = None
                target = self._register(fd, TargetClaim(pid), str(record.get("share", "")),
                                        PeerCred(0, uid, gid),
                                        str(record.get("convention", "oci")), nursery,
                                        peer_credentials=creds, expected_share_id=expected)
                restored += 1
                self.metrics.count_restored()
                log.event("target_restored", target=target.target_id, pid=pid)
            except RegistrationRefused as exc:
                log.event("restore_refused", logging.WARNING, pid=pid, reason=exc.reason)
        return restored

    # --- one registered listener --------------------------------------------------------
    def _worker_start(self) -> worker_wire.Start:
        """What each worker process is told first (workers = N): its plane's settings."""
        c = self.config
        return worker_wire.Start(c.key_dir, c.signing, c.log_level, c.drop_capabilities,
                                 c.sandbox, c.data_plane, c.data_plane_threads,
                                 self.pidfds_per_target)

    async def _serve_target(self, target: Target) -> None:
        """The data plane answers the calls; this task waits for the hang-up."""
        assert self._plane is not None  # serve() made it before taking registrations
        plane = self._plane
        gone = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def hung_up() -> None:  # on a data plane thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(gone.set)

        plane.add(target, hung_up)
        try:
            await gone.wait()
        finally:
            plane.remove(target)
            self._release(target)

    def _release(self, target: Target) -> None:
        """Forget a target whose filter has no task left (or that we stop serving)."""
        del self.targets[target.target_id]
        if self.keeper is not None:
            self.keeper.forget(target.target_id)
        target.close()
        log.event("target_gone", target=target.target_id, pid=target.pid, calls=target.calls)

    def status(self) -> dict[str, Any]:
        return {"targets": [t.describe() for t in self.targets.values()],
                **self._status_summary()}

    def status_page(self, after: int) -> intake_wire.StatusReply:
        """One frame of the status: the summary and the targets past `after` that fit."""
        targets = sorted((t for t in self.targets.values() if t.target_id > after),
                         key=lambda t: t.target_id)
        return intake_wire.status_page(self._status_summary(), [t.describe() for t in targets],
                                       after, total=len(self.targets))

    def flush_counters(self) -> None:
        """Bring CallStats up to date with every call answered so far (the native plane
        merges its own counts every 0.5 s otherwise)."""
        if self._plane is not None:
            self._plane.flush()

    def _status_summary(self) -> dict[str, Any]:
        self.flush_counters()
        return {"counters": self.stats.as_dict(),
                "registrations": dict(self.stats.registrations),
                "keys": [f"{k:08x}" for k in self.keys.key_ids],
                "signer": f"{self.keys.signer:08x}", "pid": os.getpid(),
                "workers": self._plane.worker_pids() if self._plane is not None else [],
                "fds": len(os.listdir("/proc/self/fd"))}


# --- small I/O helpers ------------------------------------------------------------------

def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
