"""`fhmon device-plugin` spoken to as the kubelet does: over real unix sockets, with grpcio.

A fake kubelet serves the Registration service on kubelet.sock; when the plugin registers,
it dials the plugin's endpoint and calls GetDevicePluginOptions, ListAndWatch and Allocate,
as the kubelet's device manager does. (asyncio, not trio: grpcio's async API is asyncio's;
each test runs its own loop.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from monitor.kubevirt import deviceplugin
from monitor.kubevirt.deviceplugin import PluginConfig
from protocol import deviceplugin as api
from tests.support.kubelet import FakeKubelet

TIMEOUT = 10.0
SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL
LONGEST_SOCKET = "device-plugins/kubelet.sock"


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A directory whose sockets fit in sun_path: pytest's tmp_path when it is short enough,
    else a fresh one under /tmp (a user's long TMPDIR must not fail the suite)."""
    if len(os.fsencode(tmp_path / LONGEST_SOCKET)) <= SUN_PATH_MAX:
        yield tmp_path
        return
    short = Path(tempfile.mkdtemp(prefix="fhmon-dp-", dir="/tmp"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def listening_socket(path: Path) -> socket.socket:
    """fhmon's socket as the DaemonSet leaves it: a bound unix socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def scenario(base: Path, body: Callable[[FakeKubelet, PluginConfig, Path],
                                        Awaitable[None]], refuse: int = 0) -> None:
    plugin_dir = base / "device-plugins"
    socket_dir = base / "fhmon"
    plugin_dir.mkdir()
    socket_dir.mkdir()
    config = PluginConfig(plugin_dir=str(plugin_dir), socket_dir=str(socket_dir), devices=5,
                          poll_interval=0.1)

    async def main() -> None:
        kubelet = FakeKubelet(plugin_dir, refuse)
        await kubelet.start()
        plugin = asyncio.create_task(deviceplugin.run(config))
        try:
            await body(kubelet, config, socket_dir)
        finally:
            plugin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await plugin
            await kubelet.stop()

    asyncio.run(main())


def test_register_list_and_watch_allocate(base: Path) -> None:
    async def body(kubelet: FakeKubelet, config: PluginConfig, socket_dir: Path) -> None:
        fhmon = listening_socket(socket_dir / "fhmon.sock")
        registration = await kubelet.next_registration()
        assert registration.version == "v1beta1"
        assert registration.resource_name == "fhmon.io/virtiofs"
        assert registration.endpoint == "fhmon.sock"
        assert (Path(config.plugin_dir) / registration.endpoint).is_socket()
        async with kubelet.dial(registration.endpoint) as call:
            options = await call("GetDevicePluginOptions", api.Empty(), api.DevicePluginOptions)
            assert not options.pre_start_required
            stream = call("ListAndWatch", api.Empty(), api.ListAndWatchResponse, stream=True)
            first = await asyncio.wait_for(stream.read(), TIMEOUT)
            ids = [d.ID for d in first.devices]
            assert len(ids) == 5 and len(set(ids)) == 5
            assert {d.health for d in first.devices} == {"Healthy"}
            reply = await call("Allocate", api.AllocateRequest(container_requests=[
                api.ContainerAllocateRequest(devices_ids=[ids[0]]),
                api.ContainerAllocateRequest(devices_ids=[ids[1]])]), api.AllocateResponse)
            assert len(reply.container_responses) == 2
            for response in reply.container_responses:
                (mount,) = response.mounts
                assert mount.host_path == mount.container_path == str(socket_dir)
                assert mount.read_only
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call("Allocate", api.AllocateRequest(container_requests=[
                    api.ContainerAllocateRequest(devices_ids=["gpu-0"])]), api.AllocateResponse)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # fhmon's socket goes away: the devices turn Unhealthy, and back; every open
            # stream is told (a kubelet may hold a stale one across a re-registration).
            other = call("ListAndWatch", api.Empty(), api.ListAndWatchResponse, stream=True)
            assert len((await asyncio.wait_for(other.read(), TIMEOUT)).devices) == 5
            fhmon.close()
            os.unlink(socket_dir / "fhmon.sock")
            second = await asyncio.wait_for(stream.read(), TIMEOUT)
            assert {d.health for d in second.devices} == {"Unhealthy"}
            second_other = await asyncio.wait_for(other.read(), TIMEOUT)
            assert {d.health for d in second_other.devices} == {"Unhealthy"}
            other.cancel()
            fhmon = listening_socket(socket_dir / "fhmon.sock")
            third = await asyncio.wait_for(stream.read(), TIMEOUT)
            assert {d.health for d in third.devices} == {"Healthy"}
            stream.cancel()
        fhmon.close()

    scenario(base, body)


def test_registers_again_after_a_kubelet_restart(base: Path) -> None:
    async def body(kubelet: FakeKubelet, config: PluginConfig, socket_dir: Path) -> None:
        first = await kubelet.next_registration()
        # A restarting kubelet empties its device-plugins directory.
        os.unlink(Path(config.plugin_dir) / first.endpoint)
        again = await kubelet.next_registration()
        assert again.resource_name == first.resource_name
        async with kubelet.dial(again.endpoint) as call:
            stream = call("ListAndWatch", api.Empty(), api.ListAndWatchResponse, stream=True)
            devices = (await asyncio.wait_for(stream.read(), TIMEOUT)).devices
            # No fhmon socket in this test: the devices exist but are Unhealthy.
            assert len(devices) == 5 and {d.health for d in devices} == {"Unhealthy"}
            stream.cancel()

    scenario(base, body)


def test_a_refused_registration_is_retried(base: Path) -> None:
    async def body(kubelet: FakeKubelet, config: PluginConfig, socket_dir: Path) -> None:
        registration = await kubelet.next_registration()
        assert kubelet.refuse == 0 and registration.endpoint == "fhmon.sock"

    scenario(base, body, refuse=2)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_plugin_socket_is_private_whatever_the_umask(base: Path, umask: int) -> None:
    """grpcio binds with the umask: 0755 under 022, 0777 under 0 (anyone could allocate)."""
    async def body(kubelet: FakeKubelet, config: PluginConfig, socket_dir: Path) -> None:
        registration = await kubelet.next_registration()
        mode = os.stat(Path(config.plugin_dir) / registration.endpoint).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600, f"{stat.S_IMODE(mode):o}"
        # the process's umask is left as it was
        assert os.umask(umask) == umask

    previous = os.umask(umask)
    try:
        scenario(base, body)
    finally:
        os.umask(previous)


def test_wire_bytes_match_the_kubelet_proto() -> None:
    """Field numbers and types as in deviceplugin/v1beta1/api.proto, checked on the bytes."""
    mount = api.Mount(container_path="/a", host_path="/b", read_only=True)
    # field 1 string "/a", field 2 string "/b", field 3 varint 1
    assert mount.SerializeToString() == bytes.fromhex("0a022f61" "12022f62" "1801")
    response = api.AllocateResponse(container_responses=[
        api.ContainerAllocateResponse(mounts=[mount])])
    # AllocateResponse.container_responses = 1; ContainerAllocateResponse.mounts = 2
    assert response.SerializeToString() == bytes.fromhex("0a0c" "120a") + mount.SerializeToString()
    request = api.RegisterRequest(version="v1beta1", endpoint="e", resource_name="x/y",
                                  options=api.DevicePluginOptions())
    assert request.SerializeToString() == b"\n\x07v1beta1\x12\x01e\x1a\x03x/y\x22\x00"
    device = api.Device(ID="d", health="Healthy")
    assert device.SerializeToString() == b"\n\x01d\x12\x07Healthy"
    # The kubelet's AllocateRequest: container_requests = 1, devices_ids = 1.
    parsed = api.AllocateRequest.FromString(bytes.fromhex("0a07" "0a05") + b"dev-0")
    assert list(parsed.container_requests[0].devices_ids) == ["dev-0"]
    # A field fhmon does not declare (envs = 1 in ContainerAllocateResponse) is skipped.
    assert api.ContainerAllocateResponse.FromString(b"\x0a\x00").mounts == []


# --------------------------------------------------------------------------------------------
# SELinux: the socket directory and socket labelled for containers, as KubeVirt's own socket
# device plugin does. Only a kernel with SELinux enabled can say whether a label took; this
# machine's may not have it (then the real-label test skips, saying so).


def listening_socket_at(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_no_selinux_no_labelling(tmp_path: Path) -> None:
    (tmp_path / "fhmon.sock").write_text("")
    assert deviceplugin.label_for_containers([str(tmp_path)], str(tmp_path / "no-selinuxfs")) == []
    with pytest.raises(OSError):  # nothing was written
        os.getxattr(tmp_path, "security.selinux")


def test_labelling_problems_are_reported_not_raised(tmp_path: Path) -> None:
    """With SELinux said to be on (a stand-in selinuxfs) the plugin sets the label or says
    why it could not, naming the path; a missing path is a problem, never an exception."""
    selinuxfs = tmp_path / "selinuxfs"
    selinuxfs.mkdir()
    (selinuxfs / "enforce").write_text("1")
    socket_dir = tmp_path / "sockets"
    socket_dir.mkdir()
    with contextlib.closing(listening_socket_at(socket_dir / "fhmon.sock")):
        plugin = deviceplugin.DevicePlugin(PluginConfig(socket_dir=str(socket_dir),
                                                        selinuxfs=str(selinuxfs)))
        problems = plugin.label_socket()
        for path in (socket_dir, socket_dir / "fhmon.sock"):
            mentioned = [p for p in problems if p.startswith(f"cannot label {path} ")]
            if not mentioned:  # the kernel took the label
                assert os.getxattr(path, "security.selinux", follow_symlinks=False).rstrip(
                    b"\0") == deviceplugin.CONTAINER_FILE_LABEL
    missing = deviceplugin.label_for_containers([str(tmp_path / "gone")], str(selinuxfs))
    assert len(missing) == 1 and "gone" in missing[0]


@pytest.mark.skipif(not deviceplugin.selinux_enabled(),
                    reason="SELinux is not enabled on this kernel: labels cannot be checked")
def test_socket_directory_labelled_for_containers_under_selinux(tmp_path: Path) -> None:
    socket_dir = tmp_path / "sockets"
    socket_dir.mkdir()
    with contextlib.closing(listening_socket_at(socket_dir / "fhmon.sock")):
        plugin = deviceplugin.DevicePlugin(PluginConfig(socket_dir=str(socket_dir)))
        assert plugin.label_socket() == []
        for path in (socket_dir, socket_dir / "fhmon.sock"):
            assert os.getxattr(path, "security.selinux", follow_symlinks=False).rstrip(
                b"\0") == deviceplugin.CONTAINER_FILE_LABEL
