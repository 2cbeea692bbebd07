"""The processes a benchmark drives: fhmon services and long-lived target processes.

A Monitor is one `fhmon serve` with its own socket, keys and config (a ReferenceMonitor is
bench/refmon, the minimal monitor to compare fhmon against). A TargetProc is one
bench/target.py, either under `fhmon launch` (uid 65534) or directly as root (the kernel
baseline); it stays alive across runs and is told what to do over stdin. `run_once` arms
every target of a run, samples fhmon's CPU, releases them together and merges what they
measured.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FHMON = str(Path(sys.executable).with_name("fhmon"))
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
NOBODY = "65534"


class BenchError(Exception):
    """A process of the benchmark failed; the message says which and why."""


def all_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def tree(pid: int) -> list[int]:
    """pid and its live descendants (worker processes, if fhmon forks any)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    todo.extend(int(c) for c in
                                Path(f"/proc/{p}/task/{tid}/children").read_text().split())
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time of a whole process (every thread, live or exited), in seconds.

    The process's CPU-time clock (clock_getcpuclockid) has nanosecond resolution; utime +
    stime from /proc/PID/stat (clock ticks) is the fallback.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED, whole process
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pin(pid: int, cpus: list[int]) -> None:
    """Every thread of pid and of its descendants: like `taskset -a -p -c CPUS`."""
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)


def busy_seconds() -> float:
    """CPU time the whole machine spent busy (user, nice, system, irq, softirq), seconds."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / CLK_TCK


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def print_config_keys() -> dict[str, str]:
    """The keys `fhmon serve --print-config` knows, with their default values (as TOML)."""
    out = subprocess.run([FHMON, "serve", "--print-config", "--socket", "/nonexistent/s",
                          "--key-dir", "/nonexistent/k", "--allow", "/nonexistent/shares/*"],
                         capture_output=True, text=True, timeout=30)
    keys = {}
    for line in out.stdout.splitlines():
        name, sep, value = line.partition(" = ")
        if sep and not name.startswith("#"):
            keys[name.strip()] = value.strip()
    return keys


class Monitor:
    """One `fhmon serve`; `settings` are extra TOML lines (signing, sync_wakeup, ...)."""

    def __init__(self, base: Path, name: str, settings: dict[str, str], share: Path,
                 profile: Path | None = None, executable: str = FHMON) -> None:
        """executable: the `fhmon` to serve with (another build's, to compare two in one
        run: bench.run --build)."""
        self.name = name
        self.dir = base / f"mon-{name}"
        self.dir.mkdir(mode=0o755)
        self.socket = str(self.dir / "s.sock")
        keys = self.dir / "keys"
        subprocess.run([executable, "keygen", "--key-dir", str(keys)], check=True,
                       capture_output=True)
        config = self.dir / "c.toml"
        lines = ['log_level = "warning"'] + [f"{k} = {v}" for k, v in settings.items()]
        config.write_text("\n".join(lines) + "\n")
        self.log_path = self.dir / "log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        serve = ["serve", "--config", str(config), "--socket", self.socket, "--key-dir",
                 str(keys), "--allow", str(share)]
        argv = [executable, *serve]
        if profile is not None:  # cProfile writes its stats when serve returns (SIGTERM)
            argv = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "monitor.cli",
                    *serve]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log,
                                     cwd=Path(__file__).resolve().parent.parent)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"fhmon {name} did not start: {self.log_path.read_text()}")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        total = 0.0
        for p in tree(self.pid):
            with contextlib.suppress(OSError):
                total += cpu_seconds(p)
        return total

    def fds(self) -> int:
        return sum(fd_count(p) for p in tree(self.pid))

    def rss(self) -> int:
        return sum(rss_kib(p) for p in tree(self.pid))

    def pin(self, cpus: list[int]) -> None:
        pin(self.pid, cpus)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def compile_c(source: Path, binary: Path, who: str) -> Path:
    """A bench's C helper program built with the machine's cc (-O2), executable by the
    target's uid; `who` names the bench in the error when there is no compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit(f"{who}: needs a C compiler (cc)")
    subprocess.run([cc, "-O2", "-o", str(binary), str(source)], check=True)
    binary.chmod(0o755)
    return binary


REFMON = Path(__file__).resolve().parent / "refmon"


def build_refmon() -> Path | None:
    """Build bench/refmon (release, exactly the locked crates): its binary, or None (with
    the reason on stderr) when cargo is missing or the build fails."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not os.path.exists(cargo):
        print("bench: no cargo: the reference monitor (bench/refmon) is left out",
              file=sys.stderr)
        return None
    built = subprocess.run([cargo, "build", "--quiet", "--release", "--locked"], cwd=REFMON,
                           capture_output=True, text=True)
    if built.returncode != 0:
        print(f"bench: bench/refmon does not build, left out:\n{built.stderr}",
              file=sys.stderr)
        return None
    return REFMON / "target" / "release" / "refmon"


class ReferenceMonitor(Monitor):
    """bench/refmon: the minimal monitor (RECV, the kernel's call, HMAC, SEND or
    ADDFD|SEND, no confinement), registered with by `fhmon launch` like fhmon."""

    def __init__(self, base: Path, name: str, binary: Path, share: Path,
                 threads: int = 2) -> None:
        self.name = name
        self.dir = base / f"mon-{name}"
        self.dir.mkdir(mode=0o755)
        self.socket = str(self.dir / "s.sock")
        self.log_path = self.dir / "log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([str(binary), "--socket", self.socket, "--share",
                                      str(share), "--threads", str(threads)],
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"refmon did not start: {self.log_path.read_text()}")
            time.sleep(0.02)


class TargetProc:
    """One bench/target.py process, kept alive across runs. no_new_privs=False: instead of
    `fhmon launch`, the target's filter is loaded while it is still root and it drops to
    uid 65534 after, without no_new_privs (as runc does for a container that does not ask
    for noNewPrivileges); the bench then registers it itself with a HELLO."""

    def __init__(self, base: Path, monitor: Monitor | None, index: int,
                 timeout: float, no_new_privs: bool = True) -> None:
        share = base / "share"
        argv = [SYSTEM_PYTHON, str(base / "target.py"), str(share)]
        direct = monitor is None or not no_new_privs
        if not direct:
            assert monitor is not None
            argv = [FHMON, "launch", "--socket", monitor.socket, "--share", str(share),
                    "--user", NOBODY, "--", *argv]
        name = monitor.name if monitor else "kernel"
        self.label = f"{name}#{index}"
        self.timeout = timeout
        self.log_path = base / "logs" / f"{name}-{index}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.registration: Any = None
        # what the target must report (the kernel baseline's root target: anything)
        self.expect_no_new_privs = None if monitor is None else int(no_new_privs)
        if monitor is not None and not no_new_privs:
            self.proc, self.registration = _register_without_no_new_privs(
                monitor.socket, str(share), argv, self.log)
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, text=True)
        self.pid = 0

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def wait_ready(self) -> None:
        msg = self.read()
        if not msg.get("ready"):
            raise BenchError(f"target {self.label}: unexpected {msg}")
        self.pid = int(msg["pid"])
        expected = self.expect_no_new_privs
        if expected is not None and msg.get("no_new_privs") != expected:
            raise BenchError(f"target {self.label} runs with no_new_privs "
                             f"{msg.get('no_new_privs')}, the run asked for {expected}")

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.stdin.write(json.dumps(obj) + "\n")
            self.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"target {self.label} died: {self._log_tail()}") from None

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        poller = select.poll()  # not select(): it refuses fds above 1,023
        poller.register(self.proc.stdout, select.POLLIN)
        if not poller.poll(self.timeout * 1000):
            raise BenchError(f"target {self.label}: no answer in {self.timeout:.0f}s "
                             f"(is fhmon answering?) {self._log_tail()}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise BenchError(f"target {self.label} exited with {self.proc.returncode}: "
                             f"{self._log_tail()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def _log_tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stdin.write('{"cmd": "exit"}\n')
            self.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.registration is not None:
            self.registration.close()
        self.log.close()


def _register_without_no_new_privs(socket_path: str, share: str, argv: list[str],
                                   log: IO[bytes]) -> tuple[subprocess.Popen[str], Any]:
    """Start argv with the handle filter loaded as root (no_new_privs left off) and uid
    65534 after, and register it with the monitor at socket_path by a HELLO (the intake
    protocol of `fhmon launch`, which refmon speaks too); returns the process and the
    registration's connection (kept open for the target's life, as the launcher does)."""
    import socket

    from monitor import fdpass, seccomp_filter
    from protocol import intake_wire

    program = seccomp_filter.build_program()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def load_then_drop() -> None:  # in the child, before exec
        listener = seccomp_filter.install(program, no_new_privs=False)
        os.setgroups([])
        os.setresgid(int(NOBODY), int(NOBODY), int(NOBODY))
        os.setresuid(int(NOBODY), int(NOBODY), int(NOBODY))
        fdpass.send_fd(theirs, b"L", listener)
        os.close(listener)

    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            text=True, preexec_fn=load_then_drop, pass_fds=[theirs.fileno()])
    theirs.close()
    _, fds, _ = fdpass.recv_fds(ours, 16, 1)
    ours.close()
    if len(fds) != 1:
        proc.kill()
        raise BenchError("the target sent no listener")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    conn.sendmsg([intake_wire.encode(intake_wire.Hello(proc.pid, share, "bench"))],
                 fdpass.rights(fds))
    os.close(fds[0])
    answer = intake_wire.decode_one(conn.recv(65536))
    if not isinstance(answer, intake_wire.Accept):
        proc.kill()
        raise BenchError(f"the monitor did not accept the target: {answer}")
    return proc, conn


@dataclass
class Pool:
    """Targets of one configuration (None: the kernel baseline), grown on demand."""

    base: Path
    monitor: Monitor | None
    timeout: float
    no_new_privs: bool = True
    targets: list[TargetProc] = field(default_factory=list)

    def ensure(self, count: int) -> list[TargetProc]:
        new = [TargetProc(self.base, self.monitor, i, self.timeout, self.no_new_privs)
               for i in range(len(self.targets), count)]
        for t in new:
            t.wait_ready()
        self.targets.extend(new)
        return self.targets[:count]

    def stop(self) -> None:
        for t in self.targets:
            t.stop()
        self.targets.clear()


def percentile(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    if not sorted_ns:
        return math.nan
    rank = min(len(sorted_ns) - 1, max(0, math.ceil(q / 100 * len(sorted_ns)) - 1))
    return sorted_ns[rank] / 1000


def run_once(targets: list[TargetProc], monitor: Monitor | None, op: str, threads: int,
             per_thread: int, pinned: bool, warmup: int = 20,
             latencies: bool = True, fresh: bool = False) -> dict[str, Any]:
    """One run: every target runs `threads` threads of `per_thread` calls, together."""
    cpus = [0] if pinned else all_cpus()
    if monitor is not None:
        if not monitor.alive():
            raise BenchError(f"fhmon {monitor.name} died: {monitor.log_path.read_text()}")
        monitor.pin(cpus)
    arm = {"cmd": "arm", "op": op, "calls": per_thread, "threads": threads,
           "cpus": [0] if pinned else None, "warmup": warmup, "latencies": latencies,
           "fresh": fresh}
    for t in targets:
        t.send(arm)
    for t in targets:
        if not t.read().get("armed"):
            raise BenchError(f"target {t.label} did not arm")
    def ours() -> float:
        total = monitor.cpu() if monitor else 0.0
        for t in targets:
            with contextlib.suppress(OSError):
                total += cpu_seconds(t.pid)
        return total

    busy0, ours0 = busy_seconds(), ours()
    cpu0 = monitor.cpu() if monitor else 0.0
    for t in targets:
        t.send({"cmd": "go"})
    results = [t.read() for t in targets]
    cpu1 = monitor.cpu() if monitor else 0.0
    busy1, ours1 = busy_seconds(), ours()
    ns: list[int] = []
    errors: dict[str, int] = {}
    calls = 0
    for r in results:
        ns.extend(r["ns"])
        calls += int(r["calls"])
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + int(v)
    ns.sort()
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    # the CPUs that others (other test suites, ...) kept busy meanwhile, on average
    others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall if wall > 0 else math.nan
    return {"p50_us": percentile(ns, 50), "p99_us": percentile(ns, 99),
            "calls_per_s": calls / wall if wall > 0 else math.nan, "calls": calls,
            "wall_s": wall, "errors": errors, "other_cpus": others,
            "cpu_us_per_call": (cpu1 - cpu0) * 1e6 / calls if monitor else None}
