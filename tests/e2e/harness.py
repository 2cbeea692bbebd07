"""Runs one end-to-end scenario: virtiofsd (optionally wrapped, e.g. by fhmon launch) serving a
share to a real Linux guest in QEMU, which runs the workload and reports on its serial console.

Why a harness of its own: every scenario (fhmon or not, root or not, prefer or mandatory) has
the same moving parts -- a run directory reachable by an unprivileged virtiofsd, virtiofsd
started through trixie's own ld-linux, QEMU with a vhost-user-fs device, a console to parse,
host-side checks of the share -- and all of them must be cleaned up even when a test fails, so
that no process outlives its test.  The result is returned as data; tests decide what to assert.

Nothing here identifies virtiofsd by executable name: run through the trixie loader it shows up
as ld-linux in /proc/PID/exe and comm.  Processes are found by their process group and by their
command line naming this run's virtiofsd socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import expect
from .env.cpio import CpioWriter

HERE = Path(__file__).resolve().parent

PREPARE = HERE / "env" / "prepare.py"
GUEST = HERE / "guest"
DEFAULT_CACHE = "/var/cache/fhmon-e2e"
NOBODY = 65534
#: Workload size: 366 entries (322 files, 31 directories, 13 symlinks) at the end; its guest
#: part takes 15-25 s under TCG on 2 cores.
DEFAULT_DIRS = 10
DEFAULT_FILES = 30
GUEST_MEMORY = "512M"


class E2EEnvironmentError(RuntimeError):
    """The e2e environment is broken (preparation failed): tests must fail, not skip."""


class QemuUnavailable(RuntimeError):
    """QEMU cannot run on this machine at all: the only reason e2e tests may skip."""


# ------------------------------------------------------------------------------ environment

@dataclass(frozen=True)
class Env:
    """Paths recorded by env/prepare.py in env.json."""

    cache: Path
    qemu: str
    ld_so: str
    library_path: str
    virtiofsd: str
    virtiofsd_version: str
    kernel: str
    kernel_version: str
    base_initramfs: str
    raw: dict[str, str]

    def virtiofsd_argv(self) -> list[str]:
        """virtiofsd through trixie's loader (bookworm's glibc is too old for it)."""
        return [self.ld_so, "--library-path", self.library_path, self.virtiofsd]

    def migration_qemu_argv(self) -> list[str]:
        """Trixie's QEMU 10 (vhost-user-fs migration needs >= 8.2) through its own loader, with
        its own firmware folders; run it with migration_qemu_environ()."""
        raw = self.raw
        firmware = [a for d in raw["migration_qemu_firmware"].split(":") for a in ("-L", d)]
        return [raw["migration_qemu_ld_so"], "--library-path", raw["migration_qemu_library_path"],
                raw["migration_qemu"], *firmware]

    def migration_qemu_environ(self) -> dict[str, str]:
        """Keeps trixie's QEMU away from bookworm's QEMU modules in the compiled-in folder."""
        return {"QEMU_MODULE_DIR": self.raw["migration_qemu_module_dir"]}


def cache_dir() -> Path:
    return Path(os.environ.get("FHMON_E2E_CACHE", DEFAULT_CACHE))


def ensure_env(timeout: float = 1800) -> Env:
    """Runs the (idempotent) preparation script and loads env.json; raises when it fails."""
    cache = cache_dir()
    proc = subprocess.run([sys.executable, str(PREPARE), "--cache", str(cache)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise E2EEnvironmentError(f"{PREPARE} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    raw = json.loads((cache / "env.json").read_text())
    return Env(cache=cache, qemu=raw["qemu"], ld_so=raw["ld_so"], library_path=raw["library_path"],
               virtiofsd=raw["virtiofsd"], virtiofsd_version=raw["virtiofsd_version"],
               kernel=raw["kernel"], kernel_version=raw["kernel_version"],
               base_initramfs=raw["base_initramfs"], raw=raw)


def build_initrd(env: Env, out: Path, init: bytes, extra: dict[str, bytes] | None = None) -> None:
    """Base archive (busybox + modules) with /init, the guest scripts' shared check.sh and
    extra files appended as a second archive."""
    shutil.copyfile(env.base_initramfs, out)
    with open(out, "ab") as fh:
        w = CpioWriter(fh)
        w.file("init", init, 0o755)
        w.file("check.sh", (GUEST / "check.sh").read_bytes(), 0o644)
        for name, data in (extra or {}).items():
            w.file(name, data, 0o755)
        w.trailer()


# ------------------------------------------------------------------------------ processes

def process_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def process_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def pids_mentioning(needle: str) -> list[int]:
    """Live processes whose command line contains needle (e.g. this run's socket path)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and needle in process_cmdline(int(entry)):
            if process_status(int(entry)).get("State", "").startswith("Z"):
                continue
            out.append(int(entry))
    return out


def kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM then SIGKILL a process group started with process_group=0; reaps the leader."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)   # stragglers of the group, even if the leader exited
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)


# ------------------------------------------------------------------------------ accelerator

_ACCEL: str | None = None


def qemu_base_argv(env: Env, accel: str, qemu: Sequence[str] = ()) -> list[str]:
    """QEMU (bookworm's, or the given argv prefix) with the guest's machine and shared memory."""
    cpu = "host" if accel == "kvm" else "max"
    return [*(qemu or [env.qemu]), "-machine", f"q35,accel={accel},memory-backend=mem", "-cpu", cpu,
            "-smp", "2", "-m", GUEST_MEMORY,
            "-object", f"memory-backend-memfd,id=mem,size={GUEST_MEMORY},share=on",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]


def _probe(env: Env, accel: str, timeout: float) -> tuple[bool, str]:
    """Boots the kernel with an /init that only prints a marker; True when the marker shows."""
    with tempfile.TemporaryDirectory(prefix="fhmon-e2e-probe-") as tmp:
        initrd = Path(tmp) / "probe.img"
        build_initrd(env, initrd, b"#!/bin/sh\necho FHMON-E2E-PROBE-OK\n/bin/busybox poweroff -f\n")
        argv = [*qemu_base_argv(env, accel), "-serial", "stdio", "-kernel", env.kernel,
                "-initrd", str(initrd), "-append", "console=ttyS0 panic=-1 quiet"]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, process_group=0)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return False, f"{accel}: no answer within {timeout:.0f}s"
        finally:
            kill_group(proc)
        text = out.decode(errors="replace")
        return "FHMON-E2E-PROBE-OK" in text, f"{accel}: exit {proc.returncode}: {text[-800:]}"


def qemu_starts(env: Env) -> tuple[bool, str]:
    """Can QEMU start at all here (TCG, the q35 machine, a shared memfd backend)?

    It is started paused with QMP on stdio and told to quit; no guest is involved, so a broken
    kernel or initramfs can never be mistaken for "QEMU unavailable".
    """
    argv = [*qemu_base_argv(env, "tcg"), "-S", "-qmp", "stdio"]
    qmp = b'{"execute": "qmp_capabilities"}\n{"execute": "quit"}\n'
    try:
        proc = subprocess.run(argv, input=qmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{argv[0]}: {e}"
    out = proc.stdout.decode(errors="replace")
    return proc.returncode == 0 and '"QMP"' in out, f"exit {proc.returncode}: {out[-1500:]}"


def accelerator(env: Env) -> str:
    """kvm when it really boots the guest (short timeout: it may hang), else tcg.

    $FHMON_E2E_ACCEL=kvm|tcg skips the probe.  Raises QemuUnavailable when QEMU cannot start at
    all, E2EEnvironmentError when QEMU starts but the guest does not boot.
    """
    global _ACCEL
    if _ACCEL is not None:
        return _ACCEL
    ok, why = qemu_starts(env)
    if not ok:
        raise QemuUnavailable(f"QEMU cannot start on this machine: {why}")
    forced = os.environ.get("FHMON_E2E_ACCEL")
    if forced in ("kvm", "tcg"):
        _ACCEL = forced
        return forced
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        ok, why = _probe(env, "kvm", timeout=20)
        if ok:
            _ACCEL = "kvm"
            return "kvm"
        last = why.strip().splitlines()[-1][:200]
        print(f"[e2e] KVM unusable, using TCG ({last})", file=sys.stderr)
    ok, why = _probe(env, "tcg", timeout=120)
    if not ok and "no answer" in why:
        # Seen once in a CI run: a TCG boot that usually answers in seconds hung; a second
        # QEMU booted fine. A guest that never boots still fails here, after two tries.
        print(f"[e2e] the TCG probe hung ({why}); trying once more", file=sys.stderr)
        ok, why = _probe(env, "tcg", timeout=120)
    if not ok:
        raise E2EEnvironmentError(f"the e2e guest does not boot under TCG: {why}")
    _ACCEL = "tcg"
    return "tcg"


# ------------------------------------------------------------------------------ one scenario

@dataclass
class RunDir:
    """A run's files; every ancestor is searchable by virtiofsd's uid (mkdtemp makes 0700 dirs)."""

    base: Path
    share: Path
    sock_dir: Path

    @property
    def socket(self) -> Path:
        return self.sock_dir / "virtiofsd.sock"


def check_reachable(path: Path, uid: int) -> None:
    """Fails early (with the culprit) when uid could not walk down to path."""
    if uid == 0:
        return
    for p in [*reversed(path.parents), path]:
        st = p.stat()
        if st.st_uid == uid:
            continue
        if not st.st_mode & 0o001:
            raise E2EEnvironmentError(
                f"{p} (mode {st.st_mode & 0o7777:o}) is not searchable by uid {uid}")


@contextlib.contextmanager
def run_dir(uid: int, keep: bool | None = None) -> Iterator[RunDir]:
    """Creates the share and socket folders owned by uid; removes everything afterwards.

    $FHMON_E2E_KEEP=1 keeps the folder for inspection.
    """
    parent = Path(os.environ.get("FHMON_E2E_TMP", "/tmp"))
    base = Path(tempfile.mkdtemp(prefix="fhmon-e2e-", dir=parent))
    base.chmod(0o755)
    rd = RunDir(base=base, share=base / "share", sock_dir=base / "sock")
    for d in (rd.share, rd.sock_dir):
        d.mkdir(mode=0o755)
        os.chown(d, uid, uid)
    check_reachable(rd.share, uid)
    try:
        yield rd
    finally:
        if keep is None:
            keep = os.environ.get("FHMON_E2E_KEEP") == "1"
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


@dataclass
class RunResult:
    """Everything a test may assert on; summary() is meant for assertion messages."""

    accel: str
    mode: str
    virtiofsd_argv: list[str]
    virtiofsd_started: bool = False
    virtiofsd_rc: int | None = None
    virtiofsd_stderr: str = ""
    virtiofsd_uid: str = ""        # "real effective saved fs", from /proc/PID/status
    virtiofsd_capeff: str = ""
    qemu_argv: list[str] = field(default_factory=list)
    qemu_rc: int | None = None
    qemu_stderr: str = ""
    qemu_timed_out: bool = False
    console: str = ""
    result: dict[str, str] | None = None
    steps: dict[str, str] = field(default_factory=dict)
    guest_errors: list[str] = field(default_factory=list)
    manifest: list[str] = field(default_factory=list)
    share_problems: list[str] = field(default_factory=list)
    manifest_problems: list[str] = field(default_factory=list)
    count_problems: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def workload_passed(self) -> bool:
        return self.result is not None and self.result.get("status") == "pass"

    @property
    def host_check_passed(self) -> bool:
        return not (self.share_problems or self.manifest_problems or self.count_problems)

    def failed_steps(self) -> set[str]:
        return {s for s, v in self.steps.items() if v != "pass"}

    def summary(self) -> str:
        parts = [
            f"accel={self.accel} mode={self.mode} virtiofsd_rc={self.virtiofsd_rc} "
            f"virtiofsd_uid=[{self.virtiofsd_uid}] qemu_rc={self.qemu_rc} "
            f"timed_out={self.qemu_timed_out}",
            f"timings={json.dumps(self.timings)}",
            f"result={self.result}",
            f"steps={self.steps}",
        ]
        if self.guest_errors:
            parts.append("guest errors:\n  " + "\n  ".join(self.guest_errors[:30]))
        for name in ("share_problems", "manifest_problems", "count_problems", "leftovers"):
            value = getattr(self, name)
            if value:
                parts.append(f"{name}:\n  " + "\n  ".join(value[:30]))
        parts.append("virtiofsd stderr (tail):\n" + self.virtiofsd_stderr[-3000:])
        if self.qemu_stderr.strip():
            parts.append("qemu stderr (tail):\n" + self.qemu_stderr[-1500:])
        if self.result is None:
            parts.append("console (tail):\n" + self.console[-4000:])
        return "\n".join(parts)


_KV = re.compile(r"(\w+)=(\S*)")


def parse_console(text: str, res: RunResult) -> None:
    """Fills the guest-side fields of res from the serial console."""
    res.console = text
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if "FHMON-E2E-" not in line:
            continue
        line = line[line.index("FHMON-E2E-"):]
        tag, _, rest = line.partition(" ")
        if tag == "FHMON-E2E-RESULT":
            res.result = dict(_KV.findall(rest))
        elif tag == "FHMON-E2E-STEP":
            fields = rest.split()
            if len(fields) >= 2:
                res.steps[fields[0]] = fields[1]
                m = re.search(r"seconds=([\d.]+)", rest)
                if m:
                    res.timings[f"step_{fields[0]}_s"] = float(m.group(1))
        elif tag == "FHMON-E2E-ERR":
            res.guest_errors.append(rest)
        elif tag == "FHMON-E2E-M":
            res.manifest.append(rest)
        elif tag == "FHMON-E2E-BOOT":
            m = re.search(r"uptime=([\d.]+)", rest)
            if m:
                res.timings["guest_boot_uptime_s"] = float(m.group(1))
    if res.result:
        for key in ("workload_s",):
            with contextlib.suppress(ValueError, KeyError):
                res.timings[key] = float(res.result[key])


#: virtiofsd logs this (level info) once it has built its filesystem state and listens.
#: The socket file alone is no sign of readiness: virtiofsd binds it before probing file handles.
READY_LINE = "Waiting for vhost-user socket connection"


def wait_ready(proc: subprocess.Popen[bytes], log: Path, sock: Path, timeout: float) -> bool:
    """True once virtiofsd says it waits for QEMU; False when it exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.exists() and READY_LINE in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def run_scenario(
    env: Env,
    rd: RunDir,
    *,
    mode: str,
    uid: int,
    wrapper: Sequence[str] = (),
    extra_virtiofsd_args: Sequence[str] = (),
    dirs: int = DEFAULT_DIRS,
    files: int = DEFAULT_FILES,
    qemu_timeout: float = 300,
    start_timeout: float = 20,
    on_virtiofsd_ready: Callable[[RunResult], None] | None = None,
    on_tick: Callable[[RunResult], None] | None = None,
    tick_seconds: float = 5.0,
    workload: Path = GUEST / "workload.sh",
    check: bool = True,
    argv: Sequence[str] | None = None,
) -> RunResult:
    """Runs virtiofsd (as uid, or under wrapper, which is started as root and must switch to
    uid itself), boots the guest against it, parses the console and checks the share.

    on_virtiofsd_ready runs once virtiofsd listens, on_tick every tick_seconds while the guest
    runs (both for observing a monitor; they must not raise).  Another guest script can be
    given as workload (for experiments); check=False then skips the host-side checks.
    argv replaces the whole virtiofsd command line (e.g. a container's, run by a stand-in
    runtime); it must create rd.socket (or a path rd.socket links to).

    Always returns (never raises for a failing scenario); every process it started is gone
    when it returns, and anything left is listed in result.leftovers.
    """
    accel = accelerator(env)
    vfs_argv = list(argv) if argv is not None else [
        *wrapper, *env.virtiofsd_argv(), f"--socket-path={rd.socket}",
        f"--shared-dir={rd.share}", "--sandbox=none", f"--inode-file-handles={mode}",
        *extra_virtiofsd_args]
    res = RunResult(accel=accel, mode=mode, virtiofsd_argv=vfs_argv)
    vfs_log = rd.base / "virtiofsd.stderr"
    qemu_log = rd.base / "qemu.stderr"
    console_log = rd.base / "console.log"
    initrd = rd.base / "initrd.img"
    build_initrd(env, initrd, (GUEST / "init").read_bytes(),
                 {"workload.sh": workload.read_bytes()})
    clean_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    as_user = uid != 0 and not wrapper and argv is None
    t0 = time.monotonic()
    vfs: subprocess.Popen[bytes] | None = None
    qemu: subprocess.Popen[bytes] | None = None
    try:
        with open(vfs_log, "wb") as vfs_out:
            vfs = subprocess.Popen(
                vfs_argv, stdin=subprocess.DEVNULL, stdout=vfs_out, stderr=subprocess.STDOUT,
                cwd="/", env=clean_env, process_group=0,
                user=uid if as_user else None, group=uid if as_user else None,
                extra_groups=[] if as_user else None)
        res.virtiofsd_started = wait_ready(vfs, vfs_log, rd.socket, start_timeout)
        res.timings["virtiofsd_ready_s"] = round(time.monotonic() - t0, 3)
        if not res.virtiofsd_started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                vfs.wait(5)
            return res
        for pid in pids_mentioning(f"--socket-path={rd.socket}"):
            # virtiofsd itself, not its wrapper: its argv[0] is trixie's loader.
            if process_cmdline(pid).startswith(env.ld_so + " "):
                st = process_status(pid)
                res.virtiofsd_uid = " ".join(st.get("Uid", "").split())
                res.virtiofsd_capeff = st.get("CapEff", "").strip()
        if on_virtiofsd_ready is not None:
            on_virtiofsd_ready(res)

        res.qemu_argv = [
            *qemu_base_argv(env, accel),
            "-chardev", f"socket,id=vfs,path={rd.socket}",
            "-device", "vhost-user-fs-pci,chardev=vfs,tag=e2e",
            "-serial", f"file:{console_log}",
            "-kernel", env.kernel, "-initrd", str(initrd),
            "-append", f"console=ttyS0 panic=-1 quiet e2e_dirs={dirs} e2e_files={files}",
        ]
        tq = time.monotonic()
        with open(qemu_log, "wb") as qemu_out:
            qemu = subprocess.Popen(res.qemu_argv, stdin=subprocess.DEVNULL, stdout=qemu_out,
                                    stderr=subprocess.STDOUT, cwd="/", env=clean_env,
                                    process_group=0)
        deadline = tq + qemu_timeout
        while res.qemu_rc is None and not res.qemu_timed_out:
            try:
                res.qemu_rc = qemu.wait(max(0.0, min(tick_seconds, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                res.qemu_timed_out = time.monotonic() >= deadline
                if on_tick is not None and not res.qemu_timed_out:
                    on_tick(res)   # e.g. what an operator would see in `fhmon status` right now
        res.timings["qemu_s"] = round(time.monotonic() - tq, 3)
        kill_group(qemu)
        # virtiofsd ends by itself when its vhost-user frontend goes away.
        try:
            res.virtiofsd_rc = vfs.wait(15)
        except subprocess.TimeoutExpired:
            res.leftovers.append("virtiofsd still running 15 s after QEMU exited (killed)")
    finally:
        for p in (qemu, vfs):
            if p is not None:
                kill_group(p)
        if vfs is not None and res.virtiofsd_rc is None:
            res.virtiofsd_rc = vfs.returncode
        res.timings["total_s"] = round(time.monotonic() - t0, 3)
        # Everything this function started names the virtiofsd socket (virtiofsd, its wrapper,
        # QEMU's -chardev); a service the caller runs (fhmon serve) does not.
        for pid in pids_mentioning(str(rd.socket)):
            res.leftovers.append(f"pid {pid}: {process_cmdline(pid)[:300]}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        res.virtiofsd_stderr = vfs_log.read_text(errors="replace") if vfs_log.exists() else ""
        res.qemu_stderr = qemu_log.read_text(errors="replace") if qemu_log.exists() else ""
        if console_log.exists():
            parse_console(console_log.read_text(errors="replace"), res)
    if res.result is not None and check:
        res.share_problems = expect.check_share(rd.share, dirs, files)
        res.manifest_problems = expect.check_guest_manifest(rd.share, res.manifest)
        want = expect.expected_counts(dirs, files)
        for key, value in want.items():
            got = res.result.get(key)
            if got != str(value):
                res.count_problems.append(f"guest {key}={got}, want {value}")
    return res


# ------------------------------------------------------------------------------ fhmon

def fhmon_command() -> str:
    """The project's own fhmon, installed next to the interpreter running the tests."""
    return str(Path(sys.executable).with_name("fhmon"))


@dataclass
class FhmonService:
    """A `fhmon serve` (root) for one run: its own key dir, --allow of exactly that run's share."""

    fhmon: str
    socket: Path
    key_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    returncode: int | None = None
    baseline_fds: int = 0
    started: float = field(default_factory=time.monotonic)
    status_snapshots: list[dict[str, object]] = field(default_factory=list)

    def wrapper(self, share: Path, uid: int) -> list[str]:
        """The argv prefix that runs a command as uid under fhmon's filter."""
        return [self.fhmon, "launch", "--socket", str(self.socket), "--share", str(share),
                "--user", str(uid), "--"]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        """fhmon's JSON log lines (one object per line on its stderr)."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out

    def shutdown_event(self) -> dict[str, Any] | None:
        found = [e for e in self.events() if e.get("event") == "shutdown"]
        return found[-1] if found else None

    def status(self) -> dict[str, object]:
        """`fhmon status --json`, as an operator would run it."""
        proc = subprocess.run([self.fhmon, "status", "--socket", str(self.socket), "--json"],
                              capture_output=True, text=True, timeout=15)
        if proc.returncode != 0:
            raise RuntimeError(f"fhmon status failed ({proc.returncode}): {proc.stderr}")
        answer: dict[str, object] = json.loads(proc.stdout)
        return answer

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def snapshot(self, _res: RunResult | None = None) -> None:
        """Records `fhmon status`, t in seconds since serve started (run_scenario's on_tick)."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError):
            elapsed = round(time.monotonic() - self.started, 1)
            self.status_snapshots.append({"t": elapsed, **self.status()})

    def wait_idle(self, timeout: float = 15) -> bool:
        """True once fhmon reports no registered target (it noticed virtiofsd is gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                if not self.status().get("targets"):
                    return True
            time.sleep(0.2)
        return False


@contextlib.contextmanager
def fhmon_service(rd: RunDir, fhmon: str | None = None, *, name: str = "fhmon",
                  key_dir: Path | None = None,
                  serve_args: Sequence[str] = ()) -> Iterator[FhmonService]:
    """Starts `fhmon serve` for rd.share; on exit stops it with SIGTERM (returncode recorded).

    A fresh key is generated unless key_dir is given (e.g. another service's, as two nodes
    sharing one key would); name tells the socket and log of several services apart.
    Raises RuntimeError with fhmon's own output when it does not start.
    """
    fhmon = fhmon or fhmon_command()
    if key_dir is None:
        key_dir = rd.base / f"{name}-keys"
        keygen = subprocess.run([fhmon, "keygen", "--key-dir", str(key_dir)],
                                capture_output=True, text=True, timeout=30)
        if keygen.returncode != 0:
            raise RuntimeError(f"fhmon keygen failed ({keygen.returncode}): {keygen.stderr}")
    sock = rd.base / f"{name}.sock"
    log_path = rd.base / f"{name}-serve.log"
    # FHMON_TEST_CONFIG: the e2e runs against another configuration too (as tests/conftest.py's
    # Service does), e.g. the Python reference data plane; serve_args come later and win.
    base_config = os.environ.get("FHMON_TEST_CONFIG")
    argv = [fhmon, "serve", "--socket", str(sock), "--key-dir", str(key_dir),
            "--allow", str(rd.share), *(["--config", base_config] if base_config else []),
            *serve_args]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd="/", process_group=0)
    svc = FhmonService(fhmon=fhmon, socket=sock, key_dir=key_dir, log_path=log_path, proc=proc)
    try:
        deadline = time.monotonic() + 20
        # The "serving" event, not the socket file: the socket exists before fhmon has
        # opened the rest of its own fds (dispatch thread, workers), the fd baseline.
        while not (sock.exists() and '"event":"serving"' in svc.log_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fhmon serve did not start: {' '.join(argv)}\n"
                                   f"{svc.log_text()[-4000:]}")
            time.sleep(0.05)
        svc.baseline_fds = svc.fd_count()
        yield svc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            svc.returncode = proc.wait(20)
        except subprocess.TimeoutExpired:
            svc.returncode = None   # did not stop on SIGTERM: a failure the test reports
        kill_group(proc)
