"""The live migration scenario: a running guest moves from one QEMU process to another, each
with its own virtiofsd under its own `fhmon serve`, while it keeps files of the share open.

Why a module of its own: run_scenario (harness.py) drives one VM from boot to power-off.  A
migration has two of everything -- fhmon, virtiofsd, QEMU -- standing for two nodes that share
the key directory and the shared directory, and a choreography in between: wait until the
guest holds its files, migrate over QMP, then wake the guest up on the destination.  It reuses
the harness's pieces and, like run_scenario, returns data and leaves no process behind.

QEMU is trixie's 10.x (bookworm's 7.2 refuses to migrate vhost-user-fs); virtiofsd is the same
1.13.2 as in the other tests, with one of its --migration-mode settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import harness
from .qmp import Qmp, QmpError

GUEST_SCRIPT = harness.GUEST / "migrate.sh"
#: held/data.txt: a header line and HELD_LINES - 1 numbered lines (~300 KiB, several reads).
HELD_LINES = 20000
SIBLING_TEXT = "sibling of the journal"
FRESH_TEXT = "created on the host after the migration"
MADE_AFTER_TEXT = "written by the guest after the migration"
JOURNAL_TEXT = "before-migration\nafter-migration\n"
#: What the guest checks after the migration (guest/migrate.sh), in order.
GUEST_STEPS = ("drop_caches", "held_fd_read", "journal_fd_append", "cwd_list",
               "cwd_read_new_name", "lookup_after_migration", "held_path_read",
               "create_after_migration", "close_fds")
#: The same with the share's symlinks (populate_share(symlinks=True)).
GUEST_STEPS_WITH_SYMLINKS = ("symlinks_migrated", *GUEST_STEPS, "symlinks_looked_up")
FINAL_STATES = {"completed", "failed", "cancelled"}


@dataclass
class Side:
    """One node of the migration: its fhmon, virtiofsd and QEMU, as observed."""

    name: str
    virtiofsd_started: bool = False
    virtiofsd_uid: str = ""           # "real effective saved fs", from /proc/PID/status
    virtiofsd_capeff: str = ""
    virtiofsd_cmdline: str = ""       # as it runs (what the launcher exec'ed)
    virtiofsd_rc: int | None = None
    virtiofsd_log: str = ""
    qemu_rc: int | None = None
    qemu_log: str = ""
    console: str = ""
    #: fhmon's counters (`fhmon status`) once the guest holds its files, i.e. just before
    #: `migrate`, and once the destination runs, before the guest is woken up.
    counters_before: dict[str, dict[str, int]] = field(default_factory=dict)
    counters_after: dict[str, dict[str, int]] = field(default_factory=dict)
    fhmon_rc: int | None = None
    fhmon_shutdown: dict[str, Any] | None = None
    fhmon_problems: list[str] = field(default_factory=list)   # error-level log lines

    def calls_during_migration(self, syscall: str) -> int:
        """Calls of syscall (any outcome) fhmon made for this node while the guest migrated."""
        before = sum(self.counters_before.get(syscall, {}).values())
        return sum(self.counters_after.get(syscall, {}).values()) - before


@dataclass
class MigrationResult:
    """Everything the test asserts on; summary() is meant for assertion messages."""

    accel: str
    migration_args: list[str]
    source: Side = field(default_factory=lambda: Side("source"))
    destination: Side = field(default_factory=lambda: Side("destination"))
    qemu_version: str = ""
    guest_ready: bool = False
    migration: dict[str, Any] = field(default_factory=dict)   # final query-migrate answer
    source_status_after: str = ""        # query-status on the source after the migration
    destination_status: str = ""         # query-status on the destination after the migration
    guest: harness.RunResult | None = None   # the destination's console, parsed
    journal: str = ""                    # cwd/journal.txt, read on the host at the end
    made_after: str = ""                 # cwd/made-after.txt, read on the host at the end
    problems: list[str] = field(default_factory=list)   # the choreography's own failures
    leftovers: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return str(self.migration.get("status", ""))

    def summary(self) -> str:
        parts = [f"accel={self.accel} qemu={self.qemu_version!r} args={self.migration_args}",
                 f"problems={self.problems}", f"timings={json.dumps(self.timings)}",
                 f"migration={json.dumps(self.migration)}",
                 f"status source={self.source_status_after!r} "
                 f"destination={self.destination_status!r}"]
        if self.guest is not None:
            parts += [f"guest result={self.guest.result} steps={self.guest.steps}",
                      "guest errors: " + "; ".join(self.guest.guest_errors)]
        parts.append(f"journal={self.journal!r} made_after={self.made_after!r}")
        for side in (self.source, self.destination):
            parts += [
                f"--- {side.name}: virtiofsd started={side.virtiofsd_started} "
                f"rc={side.virtiofsd_rc} uid=[{side.virtiofsd_uid}] qemu_rc={side.qemu_rc} "
                f"fhmon_rc={side.fhmon_rc}", f"virtiofsd cmdline={side.virtiofsd_cmdline}",
                f"fhmon counters before={side.counters_before} after={side.counters_after}",
                f"fhmon problems={side.fhmon_problems}",
                "virtiofsd log (tail):\n" + side.virtiofsd_log[-2000:],
                "qemu log (tail):\n" + side.qemu_log[-1500:],
                "console (tail):\n" + side.console[-1500:],
            ]
        if self.leftovers:
            parts.append("leftovers:\n  " + "\n  ".join(self.leftovers))
        return "\n".join(parts)


def populate_share(share: Path, symlinks: bool = False) -> None:
    """What the guest finds on the share at boot; owned by virtiofsd's uid like the share.
    symlinks: also held/link -> data.txt and held/cwd-link -> ../cwd (no file handle of
    their own is needed for find-paths to carry them)."""
    held = share / "held"
    cwd = share / "cwd"
    held.mkdir()
    cwd.mkdir()
    lines = [f"fhmon-e2e held {HELD_LINES}"] + [f"held line {i}" for i in range(2, HELD_LINES + 1)]
    (held / "data.txt").write_text("\n".join(lines) + "\n")
    (cwd / "sibling.txt").write_text(SIBLING_TEXT + "\n")
    if symlinks:
        (held / "link").symlink_to("data.txt")
        (held / "cwd-link").symlink_to("../cwd")
    chown_tree(share, harness.NOBODY)


def chown_tree(root: Path, uid: int) -> None:
    for dirpath, dirs, files in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirs + files)]:
            os.chown(name, uid, uid, follow_symlinks=False)


def _counters(svc: harness.FhmonService) -> dict[str, dict[str, int]]:
    """fhmon's per-syscall outcome counters, as `fhmon status --json` shows them."""
    counters = svc.status().get("counters")
    return dict(counters) if isinstance(counters, dict) else {}


def _wait_console(path: Path, needle: str, proc: subprocess.Popen[bytes],
                  timeout: float) -> bool:
    """True once needle shows on a console log; False when QEMU exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def _wait_migration(qmp: Qmp, timeout: float) -> dict[str, Any]:
    """Polls query-migrate on the source until the migration has ended (or time runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        info: dict[str, Any] = qmp.command("query-migrate")
        if info.get("status") in FINAL_STATES or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def _wait_running(qmp: Qmp, timeout: float) -> str:
    """The destination's run state once it is no longer "inmigrate" (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        status = str(qmp.command("query-status").get("status"))
        if status != "inmigrate" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


class _Processes:
    """Everything the scenario starts; stopped in reverse order, each whole process group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], log: Path,
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        environ = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **(extra_env or {})}
        with open(log, "wb") as out:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd="/", env=environ,
                                    process_group=0)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            harness.kill_group(proc)


@contextlib.contextmanager
def _qmp(path: Path) -> Iterator[Qmp]:
    conn = Qmp(path)
    try:
        yield conn
    finally:
        conn.close()


class _Run:
    """The host's side of one migration; see run_migration."""

    def __init__(self, env: harness.Env, rd: harness.RunDir, res: MigrationResult,
                 migration_args: Sequence[str], mode: str | None,
                 launch_options: Sequence[str], destination_plain: bool) -> None:
        self.env, self.rd, self.res = env, rd, res
        self.migration_args = list(migration_args)
        self.mode = mode
        self.launch_options = list(launch_options)
        self.destination_plain = destination_plain
        self.procs = _Processes()
        self.virtiofsd: dict[str, subprocess.Popen[bytes]] = {}
        self.initrd = rd.base / "initrd.img"
        self.migration_socket = rd.base / "migration.sock"
        self.wake_socket = rd.base / "destination-wake.sock"
        self.t0 = time.monotonic()

    def mark(self, name: str) -> None:
        self.res.timings[name] = round(time.monotonic() - self.t0, 3)

    def virtiofsd_socket(self, side: Side) -> Path:
        return self.rd.sock_dir / f"virtiofsd-{side.name}.sock"

    def start_virtiofsd(self, side: Side, svc: harness.FhmonService | None) -> None:
        """virtiofsd as uid 65534 under `fhmon launch` (with launch_options), registered with
        this node's fhmon; with svc None, a plain unprivileged virtiofsd as KubeVirt runs it
        without fhmon (no capabilities, no filter, no handle flags)."""
        sock = self.virtiofsd_socket(side)
        if svc is None:
            prefix = ["setpriv", f"--reuid={harness.NOBODY}", f"--regid={harness.NOBODY}",
                      "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
            handles = []
        else:
            wrapper = svc.wrapper(self.rd.share, harness.NOBODY)
            prefix = [*wrapper[:-1], *self.launch_options, wrapper[-1]]
            handles = [] if self.mode is None else [f"--inode-file-handles={self.mode}"]
        argv = [*prefix, *self.env.virtiofsd_argv(),
                f"--socket-path={sock}", f"--shared-dir={self.rd.share}", "--sandbox=none",
                *handles, *self.migration_args]
        log = self.rd.base / f"virtiofsd-{side.name}.log"
        proc = self.virtiofsd[side.name] = self.procs.start(argv, log)
        side.virtiofsd_started = harness.wait_ready(proc, log, sock, timeout=20)
        if not side.virtiofsd_started:
            raise RuntimeError(f"virtiofsd ({side.name}) did not start")
        for pid in harness.pids_mentioning(f"--socket-path={sock}"):
            if harness.process_cmdline(pid).startswith(self.env.ld_so + " "):
                side.virtiofsd_cmdline = harness.process_cmdline(pid)
                st = harness.process_status(pid)
                side.virtiofsd_uid = " ".join(st.get("Uid", "").split())
                side.virtiofsd_capeff = st.get("CapEff", "").strip()

    def start_qemu(self, side: Side, *extra: str) -> subprocess.Popen[bytes]:
        """Trixie's QEMU with the same machine on both sides; QMP on a socket of its own."""
        argv = [
            *harness.qemu_base_argv(self.env, self.res.accel, self.env.migration_qemu_argv()),
            "-chardev", f"socket,id=vfs,path={self.virtiofsd_socket(side)}",
            "-device", "vhost-user-fs-pci,chardev=vfs,tag=e2e",
            "-serial", f"file:{self.console_log(side)}",
            "-kernel", self.env.kernel, "-initrd", str(self.initrd),
            "-append", "console=ttyS0 panic=-1 quiet",
            "-qmp", f"unix:{self.rd.base / f'qmp-{side.name}.sock'},server=on,wait=off",
            *extra,
        ]
        return self.procs.start(argv, self.rd.base / f"qemu-{side.name}.log",
                                self.env.migration_qemu_environ())

    def console_log(self, side: Side) -> Path:
        return self.rd.base / f"console-{side.name}.log"

    def run(self, svc_a: harness.FhmonService, svc_b: harness.FhmonService,
            boot_timeout: float, migrate_timeout: float, guest_timeout: float) -> None:
        res, src, dst = self.res, self.res.source, self.res.destination
        self.start_virtiofsd(src, svc_a)
        self.start_virtiofsd(dst, None if self.destination_plain else svc_b)
        self.mark("nodes_ready_s")   # both fhmon and both virtiofsd
        # The destination waits for the migration stream.  The guest's second serial port
        # (ttyS1) is where it waits for the wake-up line: nothing on the source, a socket the
        # host writes to on the destination.
        dst_qemu = self.start_qemu(
            dst, "-chardev", f"socket,id=wake,path={self.wake_socket},server=on,wait=off",
            "-serial", "chardev:wake", "-incoming", f"unix:{self.migration_socket}")
        src_qemu = self.start_qemu(src, "-serial", "null")
        with _qmp(self.rd.base / "qmp-source.sock") as qmp_src, \
                _qmp(self.rd.base / "qmp-destination.sock") as qmp_dst:
            # The source fails the migration when the destination cannot load the state.
            for conn in (qmp_src, qmp_dst):
                conn.command("migrate-set-capabilities",
                             capabilities=[{"capability": "return-path", "state": True}])
            res.guest_ready = _wait_console(self.console_log(src), "FHMON-E2E-MIG ready",
                                            src_qemu, boot_timeout)
            self.mark("guest_ready_s")
            if not res.guest_ready:
                raise RuntimeError("the guest never said it holds its files")
            src.counters_before, dst.counters_before = _counters(svc_a), _counters(svc_b)
            t_migrate = time.monotonic()
            qmp_src.command("migrate", uri=f"unix:{self.migration_socket}")
            res.migration = _wait_migration(qmp_src, migrate_timeout)
            res.timings["migrate_wall_s"] = round(time.monotonic() - t_migrate, 3)
            res.source_status_after = str(qmp_src.command("query-status").get("status"))
            if res.status == "completed":
                res.destination_status = _wait_running(qmp_dst, 30)
                self.mark("destination_running_s")
            src.counters_after, dst.counters_after = _counters(svc_a), _counters(svc_b)
            if res.status != "completed":
                # A destination that could not load the state exits; the source runs on.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    dst.qemu_rc = dst_qemu.wait(30)
                return
            # The source is done: quitting it disconnects (and so ends) its virtiofsd.
            qmp_src.command("quit")
        src.qemu_rc = src_qemu.wait(30)
        # New names, created on the host while the guest runs on the destination.
        fresh = self.rd.share / "fresh" / "deep"
        fresh.mkdir(parents=True)
        (fresh / "file.txt").write_text(FRESH_TEXT + "\n")
        chown_tree(self.rd.share / "fresh", harness.NOBODY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
            wake.connect(str(self.wake_socket))
            wake.sendall(b"go\n")
            self.mark("guest_woken_s")
            try:
                dst.qemu_rc = dst_qemu.wait(guest_timeout)   # the guest powers off
            except subprocess.TimeoutExpired:
                res.problems.append(f"the guest did not power off within {guest_timeout:.0f}s")
        self.mark("destination_exit_s")
        # Each virtiofsd ends by itself once its QEMU has gone.
        for side in (src, dst):
            try:
                side.virtiofsd_rc = self.virtiofsd[side.name].wait(15)
            except subprocess.TimeoutExpired:
                res.problems.append(f"virtiofsd ({side.name}) still running 15 s after QEMU")


def run_migration(env: harness.Env, rd: harness.RunDir, *, migration_args: Sequence[str],
                  mode: str | None = "mandatory", shared_key: bool = True,
                  launch_options: Sequence[str] = (), destination_plain: bool = False,
                  symlinks: bool = False, boot_timeout: float = 180,
                  migrate_timeout: float = 120, guest_timeout: float = 180) -> MigrationResult:
    """Boots the guest on the source, migrates it to the destination once it holds its files,
    lets it run its checks there, and collects what both nodes saw.

    migration_args go to both virtiofsd (the source's --migration-mode decides how inodes are
    sent; the destination ignores it).  shared_key=False gives the destination's fhmon a key of
    its own, as a node outside the source's trust domain would have.  mode None gives
    virtiofsd no --inode-file-handles (as KubeVirt renders it; launch_options such as
    --virtiofsd-handles=prefer then decide).  destination_plain: the destination's virtiofsd
    runs without fhmon, as on a node or pod fhmon did not reach.  symlinks: the share has
    symlinks the guest uses across the migration.  Never raises for a
    failing scenario: what went wrong is in result.problems.  Every process it started is gone
    when it returns.
    """
    res = MigrationResult(accel=harness.accelerator(env), migration_args=list(migration_args),
                          qemu_version=env.raw.get("migration_qemu_version", ""))
    populate_share(rd.share, symlinks)
    run = _Run(env, rd, res, migration_args, mode, launch_options, destination_plain)
    harness.build_initrd(env, run.initrd, (harness.GUEST / "init").read_bytes(),
                         {"workload.sh": GUEST_SCRIPT.read_bytes()})
    with contextlib.ExitStack() as stack:
        svc_a = stack.enter_context(harness.fhmon_service(rd, name="fhmon-a"))
        svc_b = stack.enter_context(harness.fhmon_service(
            rd, name="fhmon-b", key_dir=svc_a.key_dir if shared_key else None))
        stack.callback(run.procs.stop_all)   # unwinds first: processes before their fhmon
        try:
            run.run(svc_a, svc_b, boot_timeout, migrate_timeout, guest_timeout)
        except (QmpError, OSError, RuntimeError, subprocess.SubprocessError) as e:
            res.problems.append(f"{type(e).__name__}: {e}")
    run.mark("total_s")
    for side, svc in ((res.source, svc_a), (res.destination, svc_b)):
        side.fhmon_rc = svc.returncode
        side.fhmon_shutdown = svc.shutdown_event()
        side.fhmon_problems = [json.dumps(e) for e in svc.events()
                               if e.get("level") in ("error", "critical")]
        side.virtiofsd_log = _read(rd.base / f"virtiofsd-{side.name}.log")
        side.qemu_log = _read(rd.base / f"qemu-{side.name}.log")
        side.console = _read(run.console_log(side))
    res.guest = harness.RunResult(accel=res.accel, mode=mode or "", virtiofsd_argv=[])
    harness.parse_console(res.destination.console, res.guest)
    m = re.search(r"FHMON-E2E-BOOT uptime=([\d.]+)", res.source.console)
    if m:
        res.timings["guest_boot_uptime_s"] = float(m.group(1))
    res.journal = _read(rd.share / "cwd" / "journal.txt")
    res.made_after = _read(rd.share / "cwd" / "made-after.txt")
    # Everything started here names the run folder on its command line.
    for pid in harness.pids_mentioning(str(rd.base)):
        res.leftovers.append(f"pid {pid}: {harness.process_cmdline(pid)[:300]}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return res


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
