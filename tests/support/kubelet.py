"""The kubelet's side of the device-plugin API, for tests: a Registration server on
kubelet.sock, then a client of the plugin's endpoint (asyncio: grpcio's async API is
asyncio's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from protocol import deviceplugin as api

TIMEOUT = 10.0


class FakeKubelet:
    """The kubelet's side: Registration server, then a client of the plugin's endpoint."""

    def __init__(self, plugin_dir: Path, refuse: int = 0) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: asyncio.Queue[Any] = asyncio.Queue()
        self.refuse = refuse  # refuse this many registrations first
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        async def register(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self.refuse > 0:
                self.refuse -= 1
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resource name taken")
            await self.registrations.put(request)
            return api.Empty()

        handler = grpc.method_handlers_generic_handler(api.REGISTRATION_SERVICE, {
            "Register": grpc.unary_unary_rpc_method_handler(
                register, request_deserializer=api.RegisterRequest.FromString,
                response_serializer=api.Empty.SerializeToString)})
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.plugin_dir / api.KUBELET_SOCKET}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=0)

    async def next_registration(self) -> Any:
        return await asyncio.wait_for(self.registrations.get(), TIMEOUT)

    @contextlib.asynccontextmanager
    async def dial(self, endpoint: str) -> AsyncIterator[Callable[..., Any]]:
        """A channel to the plugin; yields call(method, request, response_type, stream)."""
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}") as channel:
            def call(name: str, request: Any, response: Any, stream: bool = False) -> Any:
                path = api.method(api.DEVICE_PLUGIN_SERVICE, name)
                factory = channel.unary_stream if stream else channel.unary_unary
                return factory(path, request_serializer=type(request).SerializeToString,
                               response_deserializer=response.FromString)(request,
                                                                          timeout=None if stream
                                                                          else TIMEOUT)
            yield call
