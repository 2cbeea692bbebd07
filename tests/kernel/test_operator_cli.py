"""What a new operator meets on the command line: clear one-line errors, no tracebacks."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor import config as cfg
from monitor.cli import build_parser
from tests.support import FHMON, NOBODY, Runner, Service, World


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




def serve_argv(base: Path, *extra: str) -> list[str]:
    keys = base / "keys"
    if not keys.exists():
        run("keygen", "--key-dir", str(keys), check=True)
    return ["serve", "--socket", str(base / "run" / "fhmon.sock"), "--key-dir", str(keys),
            *extra]


def assert_one_clear_line(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.strip().splitlines()
             if not line.startswith("{")]  # JSON log lines aside
    assert len(lines) == 1, res.stderr
    for word in words:
        assert word in lines[0], res.stderr


class TestServe:
    def test_print_config_creates_nothing(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        res = run("serve", "--print-config", "--state-dir", str(state))
        assert res.returncode == 0, res.stderr
        assert f'socket = "{state}/fhmon.sock"' in res.stdout
        assert not state.exists(), "print-config made the state directory"
        assert res.stderr == ""

    def test_non_root_is_told_it_needs_root(self, unprivileged: Runner) -> None:
        res = subprocess.run(unprivileged.fhmon("serve"), user=NOBODY, group=NOBODY,
                             extra_groups=[], env=unprivileged.env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2
        assert_one_clear_line(res, "must run as root")

    def test_metrics_address_in_use(self, tmp_path: Path) -> None:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            address = f"127.0.0.1:{busy.getsockname()[1]}"
            res = run(*serve_argv(tmp_path, "--allow", str(tmp_path / "shares" / "*"),
                                  "--metrics-address", address))
        assert res.returncode == 1
        assert_one_clear_line(res, "metrics address", address, "Address already in use")
        assert not (tmp_path / "run").exists(), "the socket directory was left behind"

    def test_integer_socket_mode_in_toml(self, tmp_path: Path) -> None:
        config = tmp_path / "fhmon.toml"
        config.write_text(f'socket = "{tmp_path}/fhmon.sock"\nkey_dir = "{tmp_path}/keys"\n'
                          f'allow = ["{tmp_path}/shares/*"]\nsocket_mode = 660\nsocket_group = 0\n')
        res = run("serve", "--config", str(config), "--print-config")
        assert res.returncode == 2
        assert_one_clear_line(res, "socket_mode", '"0660"')
        assert "1224" not in res.stderr

    @pytest.mark.parametrize("glob", ["/", "/*", "/etc", "/e*/ssl", "/proc/*/root", "/var/lib",
                                      "/var/lib/fhmon", "/dev/shm"])
    def test_allow_of_a_system_directory_is_refused(self, glob: str, tmp_path: Path) -> None:
        res = run(*serve_argv(tmp_path, "--allow", glob, "--print-config"))
        assert res.returncode == 2
        assert_one_clear_line(res, repr(glob), "would allow sharing")
        check = run("check", "--allow", glob)
        assert check.returncode == 1
        assert any(line.startswith("FAIL allow " + glob) for line in check.stdout.splitlines())

    def test_allow_of_the_key_directory_is_refused(self, tmp_path: Path) -> None:
        res = run(*serve_argv(tmp_path, "--allow", str(tmp_path / "*"), "--print-config"))
        assert res.returncode == 2
        assert_one_clear_line(res, str(tmp_path / "keys"))

    def test_allow_that_matches_nothing_is_warned_about(self, tmp_path: Path) -> None:
        (tmp_path / "shares" / "vm1").mkdir(parents=True)
        typo = str(tmp_path / "sahres" / "*")
        proc = subprocess.Popen([FHMON, *serve_argv(tmp_path, "--allow", typo, "--allow",
                                                    str(tmp_path / "shares" / "*"))],
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            events = []
            for line in proc.stderr:
                events.append(json.loads(line))
                if events[-1]["event"] == "serving":
                    break
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        warned = [e for e in events if e["event"] == "allow_matches_nothing"]
        assert [e["glob"] for e in warned] == [typo]
        assert warned[0]["level"] == "warning"
        check = run("check", "--allow", typo, "--allow", str(tmp_path / "shares" / "*"))
        lines = check.stdout.splitlines()
        assert any(line.startswith(f"warn allow {typo}") and "matches no directory" in line
                   for line in lines), check.stdout
        assert any(line.startswith(f"ok   allow {tmp_path}/shares/*") for line in lines)


    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
    def test_stopping_removes_the_socket(self, sig: int, tmp_path: Path) -> None:
        sock = tmp_path / "run" / "fhmon.sock"
        with serving(tmp_path) as proc:
            proc.send_signal(sig)
            assert proc.wait(timeout=60) == 0
        assert not sock.exists() and not (tmp_path / "run").exists()  # the dir it made too

    def test_stopping_leaves_a_successors_socket(self, tmp_path: Path) -> None:
        """A rolling upgrade: the new fhmon replaced the path with its own socket before the
        old one stops; the old one must not remove the new one's."""
        sock = tmp_path / "run" / "fhmon.sock"
        with serving(tmp_path) as proc, socket.socket(socket.AF_UNIX) as successor:
            sock.unlink()
            successor.bind(str(sock))
            successor.listen()
            ours = os.stat(sock).st_ino
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            assert sock.exists() and os.stat(sock).st_ino == ours


@contextlib.contextmanager
def serving(base: Path) -> Iterator[subprocess.Popen[str]]:
    """`fhmon serve` on base/run/fhmon.sock until its status answers; killed if still alive."""
    (base / "s").mkdir()
    sock = str(base / "run" / "fhmon.sock")
    proc = subprocess.Popen([FHMON, *serve_argv(base, "--allow", str(base / "s" / "*"))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        while run("status", "--socket", sock).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "fhmon did not start"
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


class TestKeys:
    def test_key_id_that_is_not_hex(self, tmp_path: Path) -> None:
        run("keygen", "--key-dir", str(tmp_path), check=True)
        for action in ("use", "retire"):
            res = run("key", action, "xyz", "--key-dir", str(tmp_path))
            assert res.returncode == 2
            assert_one_clear_line(res, "'xyz' is not a valid key id", "8 hex digits")
            assert "int()" not in res.stderr

    def test_unknown_key_id(self, tmp_path: Path) -> None:
        run("keygen", "--key-dir", str(tmp_path), check=True)
        known = run("key", "list", "--key-dir", str(tmp_path)).stdout.split()[0]
        unknown = "%08x" % ((int(known, 16) + 1) & 0xFFFFFFFF)
        for action in ("use", "retire"):
            res = run("key", action, unknown, "--key-dir", str(tmp_path))
            assert res.returncode == 1
            assert_one_clear_line(res, f"unknown key id {unknown}")

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
    def test_key_readable_by_others_is_refused(self, mode: int, tmp_path: Path) -> None:
        keys = tmp_path / "keys"
        key_id = run("keygen", "--key-dir", str(keys), check=True).stdout.strip()
        key_file = keys / f"{key_id}.key"
        key_file.chmod(mode)
        check = run("check", "--key-dir", str(keys))
        assert check.returncode == 1
        failed = [line for line in check.stdout.splitlines() if "key directory" in line]
        assert failed and failed[0].startswith("FAIL"), check.stdout
        assert f"chmod 0600 {key_file}" in failed[0]
        res = run(*serve_argv(tmp_path, "--allow", str(tmp_path / "shares" / "*")))
        assert res.returncode == 2
        assert_one_clear_line(res, "readable by group or others", f"chmod 0600 {key_file}")


class TestClients:
    def test_status_into_a_closed_pipe(self, fhmon: Service) -> None:
        for args in (["status", "--socket", fhmon.socket], ["serve", "--print-config"],
                     ["probe", "--socket", fhmon.socket]):
            read_end, write_end = os.pipe()
            os.close(read_end)  # `| head -1` that already exited
            try:
                res = subprocess.run([FHMON, *args], stdout=write_end, stderr=subprocess.PIPE,
                                     text=True, timeout=60)
            finally:
                os.close(write_end)
            assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
            assert res.stderr == ""
            assert res.returncode == 128 + signal.SIGPIPE

    @pytest.mark.parametrize("command", [["status"], ["probe"],
                                         ["launch", "--share", "/srv", "--", "true"]])
    def test_clients_default_to_serves_socket(self, command: list[str]) -> None:
        default = cfg.embedded_default().socket
        res = run(*command)
        assert "required" not in res.stderr and "usage:" not in res.stderr, res.stderr
        if os.path.lexists(default):
            # Only a live fhmon there excuses this test; a stale socket is a defect (a
            # stopped fhmon must remove its socket), not a reason to skip.
            if run("status", "--socket", default).returncode == 0:
                pytest.skip(f"a live fhmon serves {default} on this machine (`fhmon status "
                            f"--socket {default}` answers)")
            pytest.fail(f"{default} exists but no fhmon answers there: a stale socket, left "
                        f"by an fhmon that did not remove it when it stopped")
        assert res.returncode != 0 and default in res.stderr, res.stderr
        assert default in run(command[0], "--help").stdout


def test_every_option_has_help() -> None:
    missing = []
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help: {missing}"


def test_daemonset_capabilities_suffice_for_a_group_socket(tmp_path: Path) -> None:
    """The DaemonSet grants no CAP_CHOWN, yet passes --socket-group: fhmon must create its
    socket with that group (fsgid at bind) instead of chown()ing it."""
    import yaml

    ds = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "base"
                         / "daemonset.yaml").read_text())
    (server,) = [c for c in ds["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "fhmon"]
    args = server["args"]
    group = int(args[args.index("--socket-group") + 1])
    mode = args[args.index("--socket-mode") + 1]
    caps = server["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"] and "CHOWN" not in caps["add"]
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in caps["add"])])
    sock = tmp_path / "run" / "fhmon.sock"
    proc = subprocess.Popen(["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all",
                             FHMON, *serve_argv(tmp_path, "--allow", str(tmp_path / "s" / "*"),
                                                "--socket-mode", mode, "--socket-group",
                                                str(group))],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if '"event":"serving"' in line or not line.startswith("{"):
                break
        assert proc.poll() is None, line
        st = sock.stat()
        assert (st.st_gid, oct(st.st_mode & 0o777)) == (group, oct(int(mode, 8)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
