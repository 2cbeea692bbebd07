"""`fhmon device-plugin`: a kubelet device plugin that mounts fhmon's socket directory.

virt-launcher pods must not carry a hostPath, so the injected virtiofs container requests
one `fhmon.io/virtiofs`, and this plugin's Allocate answer tells the kubelet to
bind-mount the host's socket directory (read-only: connecting to a unix socket needs no
write access to the mount, and the container must not be able to plant files there) into
the container at the same path. The directory rather than the socket is mounted, so that
a socket fhmon re-creates after a restart is seen by running containers.

The devices are interchangeable tokens (the socket serves any number of clients); they are
Healthy while fhmon's socket exists, so that the scheduler stops sending VMs to a node
whose fhmon is gone. The plugin registers again when the kubelet removes its socket (a
kubelet restart empties the device-plugins directory).

gRPC is grpcio's asyncio API: grpcio has no trio binding, and this process does nothing
else, so it runs its own asyncio loop (no threads of ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import grpc

from monitor import log
from monitor.kubevirt import containers
from protocol import deviceplugin as api

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_RESOURCE = containers.DEFAULT_RESOURCE  # fhmon.io/virtiofs
DEFAULT_SOCKET_DIR = "/var/run/kubevirt/fhmon"
DEFAULT_DEVICES = 1000
REGISTER_TIMEOUT = 10.0
# What KubeVirt's socket device plugin labels its sockets with (virt-handler's selinux
# RelabelFilesUnprivileged): files every container_t process may use. Under SELinux a
# virtiofs container (container_t) may not write a socket labelled for the host's /run.
CONTAINER_FILE_LABEL = b"system_u:object_r:container_file_t:s0"
SELINUX_FS = "/sys/fs/selinux"
# Only the kubelet (root) dials the plugin's socket: whoever can connect may list and
# allocate devices. grpcio binds it with the process's umask (0755 under 022, 0777 under 0).
PLUGIN_SOCKET_MODE: Final = 0o600


@dataclass(frozen=True, slots=True)
class PluginConfig:
    resource: str = DEFAULT_RESOURCE
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    endpoint: str = "fhmon.sock"  # our socket's name in plugin_dir
    socket_dir: str = DEFAULT_SOCKET_DIR  # mounted into containers at the same path
    fhmon_socket: str = "fhmon.sock"  # in socket_dir: its presence is the devices' health
    devices: int = DEFAULT_DEVICES
    poll_interval: float = 1.0
    selinuxfs: str = SELINUX_FS  # its `enforce` file exists where SELinux is enabled

    @property
    def plugin_socket(self) -> str:
        return os.path.join(self.plugin_dir, self.endpoint)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, api.KUBELET_SOCKET)


class DevicePlugin:
    """The DevicePlugin service; one instance serves one registration at a time."""

    def __init__(self, config: PluginConfig) -> None:
        self.config = config
        self.ids = [f"fhmon-{n}" for n in range(config.devices)]
        # Every ListAndWatch stream (a stale one may outlive a re-registration) waits for the
        # generation to move; one Event per change wakes them all.
        self._changed = asyncio.Event()
        self.generation = 0
        self.healthy = self.fhmon_present()
        self.allocations = 0
        if self.healthy:
            self.label_socket()

    def fhmon_present(self) -> bool:
        try:
            mode = os.stat(os.path.join(self.config.socket_dir, self.config.fhmon_socket)).st_mode
        except OSError:
            return False
        return stat.S_ISSOCK(mode)

    def label_socket(self) -> list[str]:
        """Label the socket directory and fhmon's socket for containers where SELinux is
        enabled, as KubeVirt's socket device plugin does; problems are logged, not raised
        (fhmon is an improvement, not a gate: a VM whose launcher cannot connect starts
        without handles)."""
        directory = self.config.socket_dir
        problems = label_for_containers(
            [directory, os.path.join(directory, self.config.fhmon_socket)],
            self.config.selinuxfs)
        for problem in problems:
            log.event("device_plugin_selinux_label_failed", logging.WARNING, error=problem)
        return problems

    def poll_health(self) -> None:
        healthy = self.fhmon_present()
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:  # fhmon (re)created its socket
                self.label_socket()
            self.generation += 1
            log.event("device_plugin_health", healthy=healthy)
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def device_list(self) -> Any:
        health = api.HEALTHY if self.healthy else api.UNHEALTHY
        return api.ListAndWatchResponse(devices=[api.Device(ID=i, health=health)
                                                 for i in self.ids])

    # ---- the RPCs

    async def get_options(self, request: Any, context: Any) -> Any:
        return api.DevicePluginOptions(pre_start_required=False,
                                       get_preferred_allocation_available=False)

    async def list_and_watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        while True:
            changed = self._changed
            yield self.device_list()
            await changed.wait()

    async def allocate(self, request: Any, context: Any) -> Any:
        known = set(self.ids)
        responses = []
        for container in request.container_requests:
            unknown = [i for i in container.devices_ids if i not in known]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"unknown device ids {unknown[:3]}")
            responses.append(api.ContainerAllocateResponse(mounts=[api.Mount(
                container_path=self.config.socket_dir, host_path=self.config.socket_dir,
                read_only=True)]))
        self.allocations += len(responses)
        return api.AllocateResponse(container_responses=responses)

    async def preferred_allocation(self, request: Any, context: Any) -> Any:
        # Advertised as unavailable (GetDevicePluginOptions); any choice is as good.
        return api.PreferredAllocationResponse(container_responses=[
            api.ContainerPreferredAllocationResponse(deviceIDs=list(
                (list(r.must_include_deviceIDs) + [i for i in r.available_deviceIDs
                                                   if i not in r.must_include_deviceIDs])
                [:r.allocation_size]))
            for r in request.container_requests])

    async def pre_start(self, request: Any, context: Any) -> Any:
        return api.PreStartContainerResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=request.FromString,
                response_serializer=response.SerializeToString)

        return grpc.method_handlers_generic_handler(api.DEVICE_PLUGIN_SERVICE, {
            "GetDevicePluginOptions": unary(self.get_options, api.Empty, api.DevicePluginOptions),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.list_and_watch, request_deserializer=api.Empty.FromString,
                response_serializer=api.ListAndWatchResponse.SerializeToString),
            "GetPreferredAllocation": unary(self.preferred_allocation,
                                            api.PreferredAllocationRequest,
                                            api.PreferredAllocationResponse),
            "Allocate": unary(self.allocate, api.AllocateRequest, api.AllocateResponse),
            "PreStartContainer": unary(self.pre_start, api.PreStartContainerRequest,
                                       api.PreStartContainerResponse),
        })


def selinux_enabled(selinuxfs: str = SELINUX_FS) -> bool:
    return os.path.exists(os.path.join(selinuxfs, "enforce"))


def label_for_containers(paths: list[str], selinuxfs: str = SELINUX_FS) -> list[str]:
    """Give each path CONTAINER_FILE_LABEL (unless it has it) where SELinux is enabled;
    the problems met, one line each (none where SELinux is off).

    The socket directory's label is inherited by the sockets fhmon creates in it later; the
    socket is labelled too, for a directory that was labelled after the socket was made.
    """
    if not selinux_enabled(selinuxfs):
        return []
    problems = []
    for path in paths:
        try:
            current = os.getxattr(path, "security.selinux", follow_symlinks=False)
            if current.rstrip(b"\0") == CONTAINER_FILE_LABEL:
                continue
            os.setxattr(path, "security.selinux", CONTAINER_FILE_LABEL, follow_symlinks=False)
        except OSError as exc:
            problems.append(f"cannot label {path} {CONTAINER_FILE_LABEL.decode()}: "
                            f"{exc.strerror or exc}")
    return problems


class RegistrationError(Exception):
    """The kubelet refused the registration (or could not be reached)."""


async def register(config: PluginConfig) -> None:
    """Register with the kubelet's Registration service (after our server listens)."""
    request = api.RegisterRequest(version=api.VERSION, endpoint=config.endpoint,
                                  resource_name=config.resource,
                                  options=api.DevicePluginOptions())
    async with grpc.aio.insecure_channel(f"unix://{config.kubelet_socket}") as channel:
        call = channel.unary_unary(api.method(api.REGISTRATION_SERVICE, "Register"),
                                   request_serializer=api.RegisterRequest.SerializeToString,
                                   response_deserializer=api.Empty.FromString)
        try:
            await call(request, timeout=REGISTER_TIMEOUT, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(f"{config.kubelet_socket}: {exc.code().name}: "
                                    f"{exc.details()}") from None


def _bind_private(server: grpc.aio.Server, path: str) -> None:
    """Bind the plugin's socket with PLUGIN_SOCKET_MODE whatever the umask: grpcio binds in
    add_insecure_port, so a umask held around that call makes the socket private from its
    first instant (umask is process-wide, but a stricter one only makes grpcio's own files
    stricter meanwhile), and the chmod states the mode outright."""
    previous = os.umask(0o777 & ~PLUGIN_SOCKET_MODE)
    try:
        server.add_insecure_port(f"unix://{path}")
    finally:
        os.umask(previous)
    os.chmod(path, PLUGIN_SOCKET_MODE)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def serve_once(config: PluginConfig, plugin: DevicePlugin,
                     started: asyncio.Event | None = None) -> None:
    """Listen, register, serve until our socket disappears (a kubelet restart)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(config.plugin_socket)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((plugin.handler(),))
    _bind_private(server, config.plugin_socket)
    await server.start()
    try:
        ours = _identity(config.plugin_socket)
        await register(config)
        log.event("device_plugin_registered", resource=config.resource,
                  endpoint=config.plugin_socket, devices=config.devices)
        if started is not None:
            started.set()
        while _identity(config.plugin_socket) == ours:
            plugin.poll_health()
            await asyncio.sleep(config.poll_interval)
        log.event("device_plugin_socket_removed", logging.WARNING, endpoint=config.plugin_socket)
    finally:
        await server.stop(grace=0.5)


async def run(config: PluginConfig, started: asyncio.Event | None = None) -> None:
    """Serve and register again whenever the kubelet loses us; retry a failed registration."""
    plugin = DevicePlugin(config)
    while True:
        try:
            await serve_once(config, plugin, started)
        except RegistrationError as exc:
            log.event("device_plugin_registration_failed", logging.WARNING, error=str(exc))
        await asyncio.sleep(config.poll_interval)
