"""What a new operator meets on the command line: clear one-line errors, no tracebacks."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import FHMON, NOBODY, Service, World


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FHMON, *args], capture_output=True, text=True, timeout=60,
                          **kwargs)  # type: ignore[call-overload]


class TestLaunchExecFailure:
    """The command given to `fhmon launch` cannot be executed: say why, exit as a shell."""

    def test_missing_command(self, fhmon: Service, world: World) -> None:
        res = run("launch", "--socket", fhmon.socket, "--share", str(world.main),
                  "--user", str(NOBODY), "--", "/nonexistent/virtiofsd", "--sandbox=none")
        assert res.returncode == 127
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert "ENOENT" in lines[0] and "/nonexistent/virtiofsd" in lines[0]
        assert "PATH" in lines[0] and "virtiofsd" in lines[0]
        assert "Traceback" not in res.stderr

    def test_command_not_on_path(self, fhmon: Service, world: World) -> None:
        res = run("launch", "--socket", fhmon.socket, "--share", str(world.main),
                  "--", "virtiofsd-not-installed-here",
                  env={**os.environ, "PATH": "/usr/bin:/bin"})
        assert res.returncode == 127
        assert "ENOENT" in res.stderr and "virtiofsd-not-installed-here" in res.stderr
        assert "not found on PATH" in res.stderr

    def test_command_not_executable(self, fhmon: Service, world: World) -> None:
        script = world.base / "not-executable.sh"
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o644)
        res = run("launch", "--socket", fhmon.socket, "--share", str(world.main),
                  "--user", str(NOBODY), "--", str(script))
        assert res.returncode == 126
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "EACCES" in res.stderr and str(script) in res.stderr

    def test_a_command_that_runs_keeps_its_status(self, fhmon: Service, world: World) -> None:
        res = run("launch", "--socket", fhmon.socket, "--share", str(world.main),
                  "--user", str(NOBODY), "--", "/bin/sh", "-c", "exit 7")
        assert res.returncode == 7 and res.stderr == ""


