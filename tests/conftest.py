"""Shared fixtures: a real fhmon service (root) and target agents (uid 65534) on the real kernel.

Nothing here mocks the kernel: fhmon runs as a separate root process, targets run under the
real seccomp filter installed by `fhmon launch`, and oracles are the same agent program
calling the kernel directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NOBODY = 65534
HERE = Path(__file__).resolve().parent
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
FHMON = str(Path(sys.executable).with_name("fhmon"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Root only where root is needed: the sans-IO unit tests run as any user; every other
    suite starts fhmon (root) and targets as uid 65534, so as non-root it refuses to run
    rather than fail test by test."""
    if os.geteuid() == 0:
        return
    needs_root = sorted({i.nodeid.split("::")[0] for i in items
                         if not i.nodeid.startswith("tests/unit/")})
    if needs_root:
        raise pytest.UsageError(
            "these tests need root (fhmon runs as root, its targets as uid 65534): "
            + ", ".join(needs_root[:5]) + (" ..." if len(needs_root) > 5 else "")
            + "; as another user run only tests/unit")


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    """Poll predicate until true or timeout: fhmon frees resources asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def thread_syscalls(pid: int) -> dict[int, list[str]]:
    """Each live thread of pid and its /proc/PID/task/TID/syscall fields: the syscall number
    it is in (or "running"), then its arguments in hex (what a thread sleeps in)."""
    syscalls = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            syscalls[int(tid)] = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
    return syscalls


@dataclass
class World:
    """A directory tree every test shares: shares, an outside area, the agent program."""

    base: Path
    shares: Path
    main: Path  # the main share
    other: Path  # a second share on the same filesystem
    outside: Path  # host files no share contains
    agent: Path


def _build_world(base: Path) -> World:
    base.chmod(0o755)
    shares = base / "shares"
    main = shares / "main"
    other = shares / "other"
    outside = base / "outside"
    for d in (shares, main, other, outside, main / "dir", main / "dir" / "deep",
              main / "emptydir", main / "noexec", other / "sub"):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    (main / "file").write_text("main file\n")
    (main / "dir" / "inner").write_text("inner file\n")
    (main / "dir" / "deep" / "leaf").write_text("leaf\n")
    (main / "readonly").write_text("read only\n")
    (main / "readonly").chmod(0o444)
    (main / "rootonly").write_text("root secret\n")
    (main / "rootonly").chmod(0o600)
    (main / "writeonly").write_text("write only\n")
    (main / "writeonly").chmod(0o222)
    (main / "nobodys").write_text("owned by nobody\n")
    os.chown(main / "nobodys", NOBODY, NOBODY)
    (main / "noexec" / "hidden").write_text("behind a dir without x\n")
    (main / "noexec").chmod(0o666)
    (other / "sub" / "theirs").write_text("other share\n")
    (outside / "secret").write_text("host secret\n")
    (outside / "secret").chmod(0o644)
    os.symlink("file", main / "link_in")
    os.symlink("dir/inner", main / "link_deep")
    os.symlink("../../outside/secret", main / "link_out")
    os.symlink("/etc/passwd", main / "link_abs")
    os.symlink("loop_b", main / "loop_a")
    os.symlink("loop_a", main / "loop_b")
    os.symlink("dir", main / "link_dir")
    os.mkfifo(main / "fifo")
    os.mknod(main / "null", 0o666 | 0o020000, os.makedev(1, 3))
    os.link(outside / "secret", main / "hardlink_out")
    for p in main.rglob("*"):
        if not p.is_symlink() and p.name not in ("rootonly", "readonly", "writeonly",
                                                   "noexec", "null", "fifo"):
            p.chmod(0o755 if p.is_dir() else 0o644)
    agent = base / "agent.py"
    shutil.copy(HERE / "agent.py", agent)
    agent.chmod(0o644)
    return World(base, shares, main, other, outside, agent)


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="fhmon-test-", dir="/tmp"))
    try:
        yield _build_world(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Runner:
    """How to run fhmon's Python code as an unprivileged uid (argv prefix and environment)."""

    python: list[str]
    env: dict[str, str]

    def fhmon(self, *args: str) -> list[str]:
        return [*self.python, "-m", "monitor.cli", *args]


@pytest.fixture(scope="session")
def unprivileged(world: World) -> Runner:
    """The venv as it is if uid 65534 can run it; else a world-readable copy of what it needs.

    (A checkout under a 0700 directory, or a venv whose interpreter lives under /root, is
    unreachable for uid 65534; the copy keeps those tests independent of where CI clones.)
    """
    repo = HERE.parent
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo)}
    probe = [sys.executable, "-c", "import monitor.cli, trio, pyseccomp, cryptography"]
    try:
        if subprocess.run(probe, user=NOBODY, group=NOBODY, extra_groups=[], env=env,
                          capture_output=True).returncode == 0:
            return Runner([sys.executable], env)
    except PermissionError:
        pass
    import sysconfig
    copy = world.base / "pylib"
    shutil.copytree(sysconfig.get_paths()["purelib"], copy, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "_pytest", "hypothesis"))
    for package in ("monitor", "protocol", "tests"):
        shutil.copytree(repo / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__", "e2e", "deploy"))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)}
    runner = Runner([SYSTEM_PYTHON], env)
    check = subprocess.run([*runner.python, "-c", "import monitor.cli, trio, pyseccomp"],
                           user=NOBODY, group=NOBODY, extra_groups=[], env=env,
                           capture_output=True, text=True)
    assert check.returncode == 0, f"cannot run fhmon as uid {NOBODY}: {check.stderr}"
    return runner


class Service:
    """A running `fhmon serve` (root) with its own socket and key dir."""

    def __init__(self, base: Path, allow: list[str], name: str = "fhmon",
                 key_dir: Path | None = None, extra: list[str] | None = None) -> None:
        self.dir = base / name
        self.dir.mkdir(mode=0o755, exist_ok=True)
        self.socket = str(self.dir / "fhmon.sock")
        self.key_dir = key_dir or self.dir / "keys"
        if not self.key_dir.exists():
            subprocess.run([FHMON, "keygen", "--key-dir", str(self.key_dir)], check=True,
                           capture_output=True)
        self.log_path = self.dir / "serve.log"
        # FHMON_TEST_CONFIG: run the whole suite against another configuration (e.g.
        # recv_thread = true); explicit --config in `extra` comes later and wins.
        base_config = os.environ.get("FHMON_TEST_CONFIG")
        self.argv = [FHMON, "serve", "--socket", self.socket, "--key-dir", str(self.key_dir),
                     *[arg for a in allow for arg in ("--allow", a)],
                     *(["--config", base_config] if base_config else []), *(extra or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        # Ready once this run logs "serving" (the log is kept across restarts): its socket
        # file exists a little earlier, before fhmon has opened all of its own fds (which
        # fd-count checks take as the baseline).
        serving = '"event":"serving"'
        runs = self.log_text().count(serving) if self.log_path.exists() else 0
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + 15
        while not (os.path.exists(self.socket) and self.log_text().count(serving) > runs):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fhmon serve did not start:\n{self.log_text()}")
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=15)
        self._log.close()
        if sig == signal.SIGKILL:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def status(self) -> dict[str, Any]:
        res = subprocess.run([FHMON, "status", "--socket", self.socket, "--json"],
                             capture_output=True, text=True, timeout=10)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


@pytest.fixture(scope="session")
def fhmon(world: World) -> Iterator[Service]:
    service = Service(world.base, [str(world.shares / "*")])
    try:
        yield service
    finally:
        code = service.stop()
        assert code == 0, service.log_text()[-4000:]


class Agent:
    """A target program; `mode` is how it runs: under fhmon, or straight on the kernel."""

    def __init__(self, world: World, mode: str, share: Path, socket: str | None = None,
                 user: int | None = NOBODY, through: Sequence[str] = ()) -> None:
        """through: a command the target runs the agent through, e.g. `unshare -Urm` (then
        it is root of its own user and mount namespace, still uid 65534 on the host)."""
        self.mode = mode
        agent_argv = [*through, SYSTEM_PYTHON, str(world.agent), str(share)]
        kwargs: dict[str, Any] = {}
        if mode == "fhmon":
            assert socket is not None
            argv = [FHMON, "launch", "--socket", socket, "--share", str(share),
                    *(["--user", str(user)] if user is not None else []), "--", *agent_argv]
        elif mode in ("runc", "crun"):
            assert socket is not None
            argv = [sys.executable, "-m", "tests.oci_runtime", mode, socket, str(share), "--",
                    *agent_argv]
            kwargs = {"cwd": str(HERE.parent)}
        else:
            argv = agent_argv
            if user is not None:
                kwargs = {"user": user, "group": user, "extra_groups": []}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, **kwargs)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.hello = json.loads(line)

    @property
    def pid(self) -> int:
        return int(self.hello["pid"])

    def call(self, op: str, *, answer_within: float | None = None,
             **cmd: Any) -> dict[str, Any]:
        """One command; answer_within: fail instead of hanging if a call is never answered
        (each answer is one line, so nothing is buffered before the wait)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **cmd}) + "\n")
        self.proc.stdin.flush()
        if answer_within is not None and not select.select([self.proc.stdout], [], [],
                                                           answer_within)[0]:
            raise TimeoutError(f"agent {op} got no answer in {answer_within} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent died: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                return self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture
def spawn(world: World, fhmon: Service) -> Iterator[Any]:
    agents: list[Agent] = []

    def make(mode: str = "fhmon", share: Path | None = None, **kw: Any) -> Agent:
        agent = Agent(world, mode, share or world.main, kw.pop("socket", fhmon.socket), **kw)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.close()
