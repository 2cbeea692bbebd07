"""Where fhmon's CPU goes, by layer: `perf record` samples of `fhmon serve`, split into the
kernel (by syscall), the Python interpreter, the libraries it calls and libc.

cProfile (`--profile`) sees Python functions only, and slows them down; a sampling profiler
of the whole process answers the question a compiled hot path raises: how much of a call is
the interpreter at all. Needs `perf` (Debian's linux-perf). The parsing is pure and tested
on text (tests/unit/test_cpu_split.py).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_HZ = 2_000
# `perf script -F pid,tid,ip,sym,dso`: a sample's header line is "PID/TID"; with -g the
# frames follow on lines of their own (a tab first), innermost first, as "ip sym (dso)".
_FRAME = re.compile(r"^\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
_SYSCALL_PREFIX = re.compile(r"^(?:__x64_sys_|__do_sys_|__se_sys_|__sys_|do_sys_|ksys_)")
# syscalls whose entry function (inlined wrappers aside) is named otherwise
_SYSCALL_ALIASES = {"do_handle_open": "open_by_handle_at", "do_epoll_wait": "epoll_wait",
                    "do_sys_open": "openat", "x64_sys_call": "(syscall entry and exit)"}

LAYERS = ("kernel", "interpreter", "cryptography", "ctypes + libffi", "libc", "other")


def layer_of(dso: str) -> str:
    """The layer a shared object belongs to."""
    name = dso.rsplit("/", 1)[-1]
    if name.startswith("[kernel"):
        return "kernel"
    if name.startswith("[vdso"):
        return "libc"  # the vDSO: user-space code the kernel maps, called like libc
    if name.startswith("libpython") or re.fullmatch(r"python3(\.\d+)?", name):
        return "interpreter"
    if name.startswith("_native."):
        return "native plane"  # fhmon's Rust data plane, monitor._native
    if name.startswith(("_rust.abi3", "libcrypto", "libssl", "_hashlib", "_openssl")):
        return "cryptography"
    if name.startswith(("_ctypes", "libffi")):
        return "ctypes + libffi"
    if name.startswith(("libc.so", "libc-", "ld-linux", "libm.so")):
        return "libc"
    return "other"


@dataclass
class Split:
    """Sample counts: per layer, per syscall (kernel samples under a syscall entry), and the
    innermost symbols."""

    samples: int = 0
    layers: Counter[str] = field(default_factory=Counter)
    syscalls: Counter[str] = field(default_factory=Counter)
    symbols: Counter[str] = field(default_factory=Counter)

    def add(self, frames: list[tuple[str, str]]) -> None:
        if not frames:
            return
        sym, dso = frames[0]
        layer = layer_of(dso)
        self.samples += 1
        self.layers[layer] += 1
        self.symbols[f"{sym} ({dso.rsplit('/', 1)[-1]})"] += 1
        if layer == "kernel":
            self.syscalls[syscall_of(frames)] += 1


def syscall_of(frames: list[tuple[str, str]]) -> str:
    """The syscall a kernel sample ran in: the function do_syscall_64 called (innermost
    first, so the frame just before do_syscall_64's), its wrapper prefix removed."""
    syms = [sym for sym, _ in frames]
    if "do_syscall_64" not in syms:
        return "(outside syscalls: irqs, scheduler)"
    at = syms.index("do_syscall_64")
    if at == 0:
        return "(syscall entry and exit)"
    entry = syms[at - 1]
    if entry == "x64_sys_call" and at >= 2:
        entry = syms[at - 2]
    if entry in _SYSCALL_ALIASES:
        return _SYSCALL_ALIASES[entry]
    stripped = _SYSCALL_PREFIX.sub("", entry)
    return stripped if stripped != entry else f"(syscall exit work: {entry})"


def _sample_owner(line: str) -> tuple[tuple[int, int] | None, str]:
    """(pid, tid) from a sample's header line, and what follows them on the line."""
    head, _, rest = line.strip().partition(" ")
    pid, _, tid = head.partition("/")
    if pid.isdigit() and tid.isdigit():
        return (int(pid), int(tid)), rest
    return None, rest


def parse(perf_script: str, pids: set[int] | None = None) -> Split:
    """Fold `perf script -F pid,tid,ip,sym,dso` output into a Split, keeping the samples of
    `pids` (all if None): a line that starts with a tab is a frame of the current sample
    (-g); any other line starts a sample, followed by its one frame when perf recorded no
    call chains."""
    split = Split()
    owner: tuple[int, int] | None = None
    frames: list[tuple[str, str]] = []

    def flush() -> None:
        if owner is not None and (pids is None or owner[0] in pids):
            split.add(frames)

    for line in perf_script.splitlines():
        if not line.strip():
            continue
        if not line.startswith("\t"):
            flush()
            owner, line = _sample_owner(line)
            frames = []
        frame = _FRAME.match(line)
        if frame and owner is not None:
            frames.append((frame.group(2), frame.group(3)))
    flush()
    return split


class Recorder:
    """`perf record` of every CPU for the duration of a `with` block.

    System-wide rather than attached to fhmon (-p): per-task events make the kernel switch
    perf's context on every context switch, and fhmon switches several times per call.
    parse() then keeps fhmon's samples. kernel_chains: record kernel call chains (which
    syscall a kernel sample is in), and only kernel samples. Measured on open_by_handle_at,
    fhmon's CPU per call: 49 us unsampled; 74 attached with all call chains, 67 system-wide
    with all call chains, 55 system-wide without chains, 51 with kernel chains only."""

    def __init__(self, out: Path, hz: int = SAMPLE_HZ, kernel_chains: bool = False) -> None:
        self.out = out
        self.hz = hz
        self.kernel_chains = kernel_chains
        self._proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> str | None:
        """None if perf can sample here, else why not."""
        if shutil.which("perf") is None:
            return "perf is not installed (apt-get install linux-perf)"
        probe = subprocess.run(["perf", "stat", "-e", "cpu-clock", "true"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            return f"perf cannot sample here: {probe.stderr.strip()[-200:]}"
        return None

    def __enter__(self) -> Recorder:
        """Start perf with its events disabled, then enable them and wait for its ack: perf
        takes a while to set up on every CPU, and a short run would otherwise be over before
        the first sample."""
        chains = ["-g", "--kernel-callchains"] if self.kernel_chains else []
        ctl, ack = self.out.with_suffix(".ctl"), self.out.with_suffix(".ack")
        for fifo in (ctl, ack):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo, 0o600)
        self._proc = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(self.hz), *chains, "-a",
             "-D", "-1", "--control", f"fifo:{ctl},{ack}", "--no-buildid", "-o",
             str(self.out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._command(ctl, ack, "enable")
        except BaseException:
            self._proc.kill()
            self._proc.wait()
            raise
        return self

    def _command(self, ctl: Path, ack: Path, command: str, timeout: float = 60) -> None:
        """Send perf a control command and wait for its ack. perf opens its end of the
        control fifo as it starts; until then a non-blocking open finds no reader (ENXIO),
        and a perf that exits instead is reported, not waited for."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            if self._proc.poll() is not None:
                err = self._proc.stderr.read() if self._proc.stderr else b""
                raise RuntimeError(f"perf record exited: {err.decode(errors='replace')[-300:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("perf record did not start")
            time.sleep(0.01)
        with open(fd, "w") as ctl_file, open(ack) as ack_file:
            ctl_file.write(command + "\n")
            ctl_file.flush()
            if ack_file.readline().strip() != "ack":
                raise RuntimeError(f"perf did not acknowledge {command!r}")

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGINT)
        _, err = self._proc.communicate(timeout=120)
        if self._proc.returncode not in (0, -signal.SIGINT) and not self.out.exists():
            raise RuntimeError(f"perf record failed: {err.decode(errors='replace')[-300:]}")

    def script(self) -> str:
        return subprocess.run(["perf", "script", "-i", str(self.out), "-F", "pid,tid,ip,sym,dso"],
                              capture_output=True, text=True, check=True).stdout


def render(layers: Split, kernel: Split, calls: tuple[int, int], hz: int = SAMPLE_HZ,
           top: int = 12) -> str:
    """A text report in us per call: each layer (from a run without call chains), then the
    kernel's time by syscall and the hottest kernel symbols (from a run with kernel call
    chains). calls: the calls of each run."""
    us_per_sample = 1e6 / hz

    def rows(split: Split, counter: Counter[str], n_calls: int,
             names: list[str] | None = None) -> list[str]:
        items = [(n, counter[n]) for n in names] if names else counter.most_common(top)
        return [f"  {name[:44]:<44} {n / max(split.samples, 1) * 100:5.1f}%  "
                f"{n * us_per_sample / n_calls:6.2f} us/call" for name, n in items if n]

    lines = [f"fhmon's CPU by layer ({layers.samples} samples at {hz} Hz, "
             f"{layers.samples * us_per_sample / calls[0]:.1f} us per call):"]
    lines += rows(layers, layers.layers, calls[0], list(LAYERS))
    lines.append(f"its kernel time by syscall ({kernel.samples} samples, "
                 f"{kernel.samples * us_per_sample / calls[1]:.1f} us per call):")
    lines += rows(kernel, kernel.syscalls, calls[1])
    lines.append("the hottest kernel symbols:")
    lines += rows(kernel, kernel.symbols, calls[1])
    return "\n".join(lines)
