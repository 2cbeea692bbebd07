"""A running `fhmon serve` (root) and how to run fhmon's code as uid 65534."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.support.world import FHMON, NOBODY, REPO, SYSTEM_PYTHON, World


@dataclass
class Runner:
    """How to run fhmon's Python code as an unprivileged uid (argv prefix and environment)."""

    python: list[str]
    env: dict[str, str]

    def fhmon(self, *args: str) -> list[str]:
        return [*self.python, "-m", "monitor.cli", *args]


def unprivileged_runner(world: World) -> Runner:
    """The venv as it is if uid 65534 can run it; else a world-readable copy of what it needs.

    (A checkout under a 0700 directory, or a venv whose interpreter lives under /root, is
    unreachable for uid 65534; the copy keeps those tests independent of where CI clones.)
    """
    repo = REPO
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
    """A running `fhmon serve` (root) with its own socket and key dir.

    `with Service(...) as svc:` stops it with SIGTERM at the end of the block; call stop()
    yourself for its exit code or another signal.
    """

    def __init__(self, base: Path, allow: list[str], name: str = "fhmon",
                 key_dir: Path | None = None, extra: list[str] | None = None,
                 command: str = FHMON) -> None:
        """command: the `fhmon` executable (another install's, e.g. a wheel's venv)."""
        self.command = command
        self.dir = base / name
        self.dir.mkdir(mode=0o755, exist_ok=True)
        self.socket = str(self.dir / "fhmon.sock")
        self.key_dir = key_dir or self.dir / "keys"
        if not self.key_dir.exists():
            subprocess.run([command, "keygen", "--key-dir", str(self.key_dir)], check=True,
                           capture_output=True)
        self.log_path = self.dir / "serve.log"
        # FHMON_TEST_CONFIG: run the whole suite against another configuration (e.g.
        # recv_thread = true); explicit --config in `extra` comes later and wins.
        base_config = os.environ.get("FHMON_TEST_CONFIG")
        self.argv = [command, "serve", "--socket", self.socket, "--key-dir", str(self.key_dir),
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """stop() with SIGTERM; a failure to stop never hides the block's own exception."""
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except Exception as stopping:
            exc.add_note(f"and then stopping fhmon serve failed: {stopping!r}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def status(self) -> dict[str, Any]:
        res = subprocess.run([self.command, "status", "--socket", self.socket, "--json"],
                             capture_output=True, text=True, timeout=10)
        assert res.returncode == 0, res.stderr
        status: dict[str, Any] = json.loads(res.stdout)
        return status

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
