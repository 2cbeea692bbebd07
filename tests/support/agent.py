"""A target program (tests/support/target_agent.py) driven over JSON lines: under fhmon
(`fhmon launch` or an OCI runtime's listenerPath), or straight on the kernel as the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.world import FHMON, NOBODY, REPO, SYSTEM_PYTHON, World, readable


class Agent:
    """A target program; `mode` is how it runs: under fhmon, or straight on the kernel."""

    def __init__(self, world: World, mode: str, share: Path, socket: str | None = None,
                 user: int | None = NOBODY, through: Sequence[str] = (),
                 launcher: Sequence[str] = (FHMON, "launch")) -> None:
        """through: a command the target runs the agent through, e.g. `unshare -Urm` (then
        it is root of its own user and mount namespace, still uid 65534 on the host);
        launcher: what `fhmon launch` is (another install's, or an installed launcher)."""
        self.mode = mode
        agent_argv = [*through, SYSTEM_PYTHON, str(world.agent), str(share)]
        kwargs: dict[str, Any] = {}
        if mode == "fhmon":
            assert socket is not None
            argv = [*launcher, "--socket", socket, "--share", str(share),
                    *(["--user", str(user)] if user is not None else []), "--", *agent_argv]
        elif mode in ("runc", "crun", "runc-nnp-off"):
            assert socket is not None
            argv = [sys.executable, "-m", "tests.support.oci_runtime", mode, socket,
                    str(share), "--", *agent_argv]
            kwargs = {"cwd": str(REPO)}
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
        if answer_within is not None and not readable(self.proc.stdout, answer_within):
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


class NamespaceAgent(Agent):
    """The agent under `fhmon launch`, as uid 65534 through `unshare -Urm`: root of its own
    user and mount namespace, which it may rearrange."""

    def __init__(self, world: World, socket: str, share: Path) -> None:
        super().__init__(world, "fhmon", share, socket, through=["unshare", "-Urm"])
