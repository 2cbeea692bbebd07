"""The kubelet device-plugin API (deviceplugin/v1beta1), the part fhmon's plugin speaks.

Messages are declared here field by field (names, numbers and types as the kubelet's
api.proto has them) and built by protobuf's runtime, instead of generated code: the subset
is small, and this keeps it readable and checkable against the wire bytes (tests). Only
what the plugin sends or reads is declared; unknown fields the kubelet may add are skipped
by protobuf as usual.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE: Final = "v1beta1"
VERSION: Final = "v1beta1"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
KUBELET_SOCKET: Final = "kubelet.sock"
REGISTRATION_SERVICE: Final = f"{PACKAGE}.Registration"
DEVICE_PLUGIN_SERVICE: Final = f"{PACKAGE}.DevicePlugin"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BOOL, _INT32, _INT64, _MESSAGE = (_F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT32,
                                            _F.TYPE_INT64, _F.TYPE_MESSAGE)
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message name -> [(field name, number, type, label, message type or "")]
_MESSAGES: Final[dict[str, list[tuple[str, int, int, int, str]]]] = {
    "Empty": [],
    "DevicePluginOptions": [("pre_start_required", 1, _BOOL, _ONE, ""),
                            ("get_preferred_allocation_available", 2, _BOOL, _ONE, "")],
    "RegisterRequest": [("version", 1, _STRING, _ONE, ""), ("endpoint", 2, _STRING, _ONE, ""),
                        ("resource_name", 3, _STRING, _ONE, ""),
                        ("options", 4, _MESSAGE, _ONE, "DevicePluginOptions")],
    "NUMANode": [("ID", 1, _INT64, _ONE, "")],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "Device": [("ID", 1, _STRING, _ONE, ""), ("health", 2, _STRING, _ONE, ""),
               ("topology", 3, _MESSAGE, _ONE, "TopologyInfo")],
    "ListAndWatchResponse": [("devices", 1, _MESSAGE, _MANY, "Device")],
    "ContainerAllocateRequest": [("devices_ids", 1, _STRING, _MANY, "")],
    "AllocateRequest": [("container_requests", 1, _MESSAGE, _MANY, "ContainerAllocateRequest")],
    "Mount": [("container_path", 1, _STRING, _ONE, ""), ("host_path", 2, _STRING, _ONE, ""),
              ("read_only", 3, _BOOL, _ONE, "")],
    # envs (1), devices (3), annotations (4) and cdi_devices (5) are never sent by fhmon.
    "ContainerAllocateResponse": [("mounts", 2, _MESSAGE, _MANY, "Mount")],
    "AllocateResponse": [("container_responses", 1, _MESSAGE, _MANY,
                          "ContainerAllocateResponse")],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, _STRING, _MANY, ""),
        ("must_include_deviceIDs", 2, _STRING, _MANY, ""),
        ("allocation_size", 3, _INT32, _ONE, "")],
    "PreferredAllocationRequest": [("container_requests", 1, _MESSAGE, _MANY,
                                    "ContainerPreferredAllocationRequest")],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, _STRING, _MANY, "")],
    "PreferredAllocationResponse": [("container_responses", 1, _MESSAGE, _MANY,
                                     "ContainerPreferredAllocationResponse")],
    "PreStartContainerRequest": [("devices_ids", 1, _STRING, _MANY, "")],
    "PreStartContainerResponse": [],
}


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="fhmon/deviceplugin_v1beta1.proto",
                                              package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES}


_CLASSES: Final = _build()

Empty: Any = _CLASSES["Empty"]
DevicePluginOptions: Any = _CLASSES["DevicePluginOptions"]
RegisterRequest: Any = _CLASSES["RegisterRequest"]
Device: Any = _CLASSES["Device"]
ListAndWatchResponse: Any = _CLASSES["ListAndWatchResponse"]
AllocateRequest: Any = _CLASSES["AllocateRequest"]
ContainerAllocateRequest: Any = _CLASSES["ContainerAllocateRequest"]
AllocateResponse: Any = _CLASSES["AllocateResponse"]
ContainerAllocateResponse: Any = _CLASSES["ContainerAllocateResponse"]
Mount: Any = _CLASSES["Mount"]
PreferredAllocationRequest: Any = _CLASSES["PreferredAllocationRequest"]
PreferredAllocationResponse: Any = _CLASSES["PreferredAllocationResponse"]
ContainerPreferredAllocationResponse: Any = _CLASSES["ContainerPreferredAllocationResponse"]
PreStartContainerRequest: Any = _CLASSES["PreStartContainerRequest"]
PreStartContainerResponse: Any = _CLASSES["PreStartContainerResponse"]


def method(service: str, name: str) -> str:
    """The gRPC method path, e.g. /v1beta1.Registration/Register."""
    return f"/{service}/{name}"
