"""`fhmon install-launcher`: the copied native launcher runs with none of the installer's files
(no /usr, no checkout, no venv, empty environment), in KubeVirt's container under runc."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from monitor.kubevirt import containers, inject
from tests.support import cri_spec, runc
from tests.support.kubevirt import LAUNCHER_POD, launcher_argv, needs_root, steal_from_launcher

CLONE_NEWNS = 0x20000
MS_REC, MS_PRIVATE = 0x4000, 0x40000


def _hide_the_installer() -> None:
    """In the child: a mount namespace where /usr (so the system's libraries and Python,
    /lib and /bin being links into it) and this checkout are empty tmpfs mounts."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    here = Path(__file__).resolve().parents[2]
    hidden = [Path("/usr"), here]
    if not Path(sys.prefix).resolve().is_relative_to(here):
        hidden.append(Path(sys.prefix).resolve())
    for path in hidden:
        if libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {path!r}")


def _program_headers(path: Path) -> list[int]:
    """The p_type of every program header of an ELF64 file."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF, 64-bit
    phoff = int.from_bytes(data[32:40], "little")
    size = int.from_bytes(data[54:56], "little")
    count = int.from_bytes(data[56:58], "little")
    return [int.from_bytes(data[phoff + i * size:phoff + i * size + 4], "little")
            for i in range(count)]


def test_layout(bundle: Path) -> None:
    """One static executable: no PT_INTERP (3), so the kernel runs it without a loader and
    it loads no shared library of the image it runs in (a static-pie keeps a PT_DYNAMIC for
    its own relocation, with no DT_NEEDED)."""
    assert sorted(p.name for p in bundle.iterdir()) == [containers.LAUNCHER_BINARY]
    binary = bundle / containers.LAUNCHER_BINARY
    assert binary.stat().st_mode & 0o777 == 0o755
    headers = _program_headers(binary)
    assert headers and 3 not in headers, headers


@needs_root
def test_runs_with_the_installer_hidden(bundle: Path) -> None:
    # No /usr, no checkout, no venv, empty environment: only the launcher.
    result = subprocess.run(launcher_argv(bundle, "launch", "--help"), env={},
                            preexec_fn=_hide_the_installer, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--socket" in result.stdout


@needs_root
def test_unreachable_fhmon_is_a_message_not_a_traceback(bundle: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        launcher_argv(bundle, "launch", "--socket", str(tmp_path / "none.sock"), "--share",
                      str(tmp_path), "--", "/bin/true"),
        env={}, preexec_fn=_hide_the_installer, capture_output=True, text=True, timeout=60)
    assert result.returncode == 125
    assert result.stderr.startswith("fhmon launch: cannot reach fhmon at "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_reinstall_starts_clean(tmp_path: Path) -> None:
    from monitor import launcher

    root = tmp_path / "again"
    (root / "old" / "lib").mkdir(parents=True)
    (root / "stale").write_text("x")
    installed = launcher.install(root)
    assert sorted(p.name for p in root.iterdir()) == [containers.LAUNCHER_BINARY]
    assert installed.read_bytes() == launcher.NATIVE_LAUNCHER.read_bytes()


@needs_root
def test_the_launched_command_cannot_take_fds_from_the_launcher(bundle: Path) -> None:
    """Same uid (KubeVirt's 107) for launcher and virtiofsd: the launcher is non-dumpable after
    its fork, so its child cannot pidfd_getfd() (nor ptrace) it. A fake fhmon accepts."""
    assert steal_from_launcher(bundle) == ["pidfd_getfd", "-1", "EPERM"]


def _accept_hello(server: Any) -> Any:
    """One registration on the fake fhmon: the Hello (its fd closed), answered Accept."""
    import socket as so

    from protocol import intake_wire

    conn, _ = server.accept()
    conn.settimeout(30)
    decoder = intake_wire.FrameDecoder()
    while (hello := decoder.next_message()) is None:
        data, fds, _, _ = so.recv_fds(conn, 65536, 4)
        for fd in fds:
            os.close(fd)
        assert data, "the launcher hung up"
        decoder.feed(data)
    conn.sendall(intake_wire.encode(intake_wire.Accept(1, bytes(32), "ok")))
    return conn, hello


@needs_root
def test_registers_again_through_the_read_only_socket_directory(bundle: Path) -> None:
    """A rolling upgrade of fhmon, as the injected container sees it: the device plugin's
    read-only mount of the socket directory shows the socket the new fhmon creates, and the
    launcher (the injected container under runc: the host's /usr as the image, uid 107, its
    own pid namespace) registers with it."""
    import signal
    import socket as so

    from protocol import intake_wire

    base = Path(tempfile.mkdtemp(prefix="fhmon-upgrade-", dir="/tmp"))
    base.chmod(0o755)
    host_dir = base / "host-fhmon"
    share = base / "share"
    for d in (host_dir, share, base / "root"):
        d.mkdir(mode=0o755)
    os.chown(share, 107, 107)
    sock_path = host_dir / "fhmon.sock"

    def listen() -> so.socket:
        server = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        server.bind(str(sock_path))
        sock_path.chmod(0o777)
        server.listen()
        server.settimeout(30)
        return server

    # The injected virtiofs container under runc, as the kubelet and containerd would run
    # it, its virtiofsd replaced by a sleep.
    settings = containers.Settings()
    pod = yaml.safe_load(inject.inject(LAUNCHER_POD, settings))
    virtiofs = cri_spec.find_container(pod, "virtiofs-data")
    # Without --fail-open: this fake fhmon accepts but cannot answer the start-up probe,
    # after which a failing-open launcher would (rightly) run sleep unserved; and sleep
    # takes no virtiofsd flags.
    virtiofs["command"] = [*(arg for arg in containers.launcher_command(settings, "/data")
                             if arg != "--fail-open" and not arg.startswith("--virtiofsd-")),
                           "/usr/bin/sleep"]
    virtiofs["args"] = ["60"]
    rt = runc.Runtime()
    server = listen()
    proc = None
    try:
        context = cri_spec.NodeContext(
            rootfs=str(rt.rootfs("virtiofs", runc.Image())),
            volume_paths={"data": str(share), "virtiofs-containers": str(base / "root"),
                          containers.LAUNCHER_VOLUME: str(bundle)},
            device_mounts=[cri_spec.DeviceMount(settings.socket.rpartition("/")[0],
                                                str(host_dir), True)])
        container_id, oci_bundle = rt.bundle(
            "virtiofs", cri_spec.translate(pod, "virtiofs-data", context))
        proc = subprocess.Popen(rt.run_argv(container_id, oci_bundle), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, process_group=0)
        first_conn, first = _accept_hello(server)
        # The old fhmon goes away (its pod is replaced); the new one makes a new socket.
        server.close()
        sock_path.unlink()
        first_conn.close()
        server = listen()
        second_conn, second = _accept_hello(server)
        second_conn.close()
    finally:
        err = ""
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
        server.close()
        rt.close()   # the container (runc run was killed, not it), its mounts
        shutil.rmtree(base, ignore_errors=True)
    assert isinstance(first, intake_wire.Hello) and isinstance(second, intake_wire.Hello), err
    assert (second.target_pid, second.share) == (first.target_pid, "/data"), err
    assert "registering again" in err, err


@needs_root
def test_injected_launcher_without_fhmon_runs_kubevirts_command_unchanged(
        bundle: Path, tmp_path: Path) -> None:
    """The copied launcher with exactly the injected options, and no fhmon behind the socket
    path: KubeVirt's command line runs as given (fail open), at once, after one line."""
    import time

    prefix = containers.launcher_command(containers.Settings(), str(tmp_path))
    options = prefix[prefix.index("launch") + 1:]
    options[options.index("--socket") + 1] = str(tmp_path / "no-fhmon" / "fhmon.sock")
    kubevirt = ["--socket-path=/var/run/kubevirt/virtiofs-containers/d.sock",
                f"--shared-dir={tmp_path}", "--cache=auto", "--sandbox=none",
                "--migration-mode=find-paths", "--migration-on-error=guest-error"]
    start = time.monotonic()
    result = subprocess.run(launcher_argv(bundle, "launch", *options, "/usr/bin/printf",
                                          "%s\\n", *kubevirt),
                            env={}, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == kubevirt
    (line,) = result.stderr.splitlines()
    assert "without fhmon" in line and "cannot reach fhmon" in line
    print(f"the copied launcher ran KubeVirt's command {seconds:.3f}s after it started")
    assert seconds < 20  # generous: the target is a second
