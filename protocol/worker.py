"""Messages between `fhmon serve` and its worker processes (sans-IO: bytes in, objects out).

One JSON object per SOCK_SEQPACKET message, with "op" naming it; fds travel as SCM_RIGHTS
beside the message that says what they are. Both ends are fhmon's own processes, so the
checks here are for robustness (a clear error instead of a crash), not a trust boundary.

    serve -> worker   Start      the worker's settings, its data plane's too (once, first)
                      AddTarget  a registered listener: fds = [listener, share O_PATH fd,
                                 share directory fd]
                      RemoveTarget  its filter has no task left: close the copies
                      ReloadKeys the key directory changed: load it again
    worker -> serve   Ready      keys loaded and locked down: it answers calls (once, first)
                      Report     what the worker answered since its last report
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.share import ShareFacts

MAX_MESSAGE: Final = 160 * 1024  # below a unix socket's default send buffer (~208 KiB)
ADD_TARGET_FDS: Final = 3


class WorkerProtocolError(ValueError):
    """A message that is not one of these."""


@dataclass(frozen=True, slots=True)
class Start:
    key_dir: str
    signing: bool
    log_level: str
    drop_capabilities: bool
    sandbox: bool
    # the configuration's data plane (monitor/dataplane.py): a worker answers on the same
    # plane fhmon serve would have used itself
    data_plane: str = "native"
    data_plane_threads: int | str = "auto"
    # each target's bound on cached thread pidfds (monitor/plane/thread_cache.py)
    pidfds_per_target: int = 1024


@dataclass(frozen=True, slots=True)
class AddTarget:
    target_id: int
    pid: int
    peer_pid: int
    peer_uid: int
    peer_gid: int
    convention: str
    share: ShareFacts  # the fds that pin it travel beside the message


@dataclass(frozen=True, slots=True)
class RemoveTarget:
    target_id: int


@dataclass(frozen=True, slots=True)
class ReloadKeys:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    pass


@dataclass(slots=True)
class Report:
    """Counts since the last report. buckets: per syscall, how many calls fell in each
    latency bucket (fhmon's fixed bounds, monitor/metrics.py), so that a report's size does
    not grow with the calls it covers."""

    results: dict[tuple[str, str], int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    calls: dict[int, int] = field(default_factory=dict)  # by target id
    buckets: dict[str, list[int]] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.results or self.refusals or self.calls)


Message = Start | AddTarget | RemoveTarget | ReloadKeys | Ready | Report


def encode(message: Message) -> bytes:
    match message:
        case Start():
            body: dict[str, Any] = {"op": "start", "key_dir": message.key_dir,
                                    "signing": message.signing, "log_level": message.log_level,
                                    "drop_capabilities": message.drop_capabilities,
                                    "sandbox": message.sandbox,
                                    "data_plane": message.data_plane,
                                    "data_plane_threads": message.data_plane_threads,
                                    "pidfds_per_target": message.pidfds_per_target}
        case AddTarget():
            s = message.share
            body = {"op": "add", "target_id": message.target_id, "pid": message.pid,
                    "peer": [message.peer_pid, message.peer_uid, message.peer_gid],
                    "convention": message.convention,
                    "share": {"mount_id": s.mount_id, "dev": s.dev, "ino": s.ino,
                              "share_id": s.share_id.hex(), "host_path": s.host_path,
                              "target_path": s.target_path, "is_mount_root": s.is_mount_root,
                              "whole_fs": s.whole_fs}}
        case RemoveTarget():
            body = {"op": "remove", "target_id": message.target_id}
        case ReloadKeys():
            body = {"op": "keys"}
        case Ready():
            body = {"op": "ready"}
        case Report():
            body = {"op": "report",
                    "results": [[sc, res, n] for (sc, res), n in message.results.items()],
                    "seconds": message.seconds, "refusals": message.refusals,
                    "calls": [[tid, n] for tid, n in message.calls.items()],
                    "buckets": message.buckets}
    data = json.dumps(body, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise WorkerProtocolError(f"message of {len(data)} bytes is over {MAX_MESSAGE}")
    return data


def decode(data: bytes) -> Message:
    try:
        body = json.loads(data)
        op = body["op"]
        if op == "start":
            return Start(_str(body["key_dir"]), _bool(body["signing"]),
                         _str(body["log_level"]), _bool(body["drop_capabilities"]),
                         _bool(body["sandbox"]), _plane(body["data_plane"]),
                         _threads(body["data_plane_threads"]),
                         _pidfds(body["pidfds_per_target"]))
        if op == "add":
            s = body["share"]
            peer_pid, peer_uid, peer_gid = (_int(v) for v in body["peer"])
            share = ShareFacts(bytes.fromhex(_str(s["share_id"])), _int(s["mount_id"]),
                               _int(s["dev"]), _int(s["ino"]), _str(s["host_path"]),
                               _str(s["target_path"]), _bool(s["is_mount_root"]),
                               _bool(s.get("whole_fs", False)))
            return AddTarget(_int(body["target_id"]), _int(body["pid"]), peer_pid, peer_uid,
                             peer_gid, _str(body["convention"]), share)
        if op == "remove":
            return RemoveTarget(_int(body["target_id"]))
        if op == "keys":
            return ReloadKeys()
        if op == "ready":
            return Ready()
        if op == "report":
            return Report(
                {(_str(sc), _str(res)): _int(n) for sc, res, n in body["results"]},
                {_str(sc): float(sec) for sc, sec in body["seconds"].items()},
                {_str(note): _int(n) for note, n in body["refusals"].items()},
                {_int(tid): _int(n) for tid, n in body["calls"]},
                {_str(sc): [_count(n) for n in counts] for sc, counts in body["buckets"].items()})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WorkerProtocolError(f"malformed worker message: {exc}") from None
    raise WorkerProtocolError(f"unknown worker message {op!r}")


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _threads(value: Any) -> int | str:
    """data_plane_threads: "auto" or a count (monitor/config.py checked its range)."""
    if value == "auto":
        return "auto"
    return _int(value)


def _pidfds(value: Any) -> int:
    """pidfds_per_target: a positive count."""
    count = _int(value)
    if count < 1:
        raise ValueError(f"pidfds_per_target must be positive, not {count}")
    return count


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _count(value: Any) -> int:
    count = _int(value)
    if count < 0:
        raise ValueError(f"a count cannot be negative: {value}")
    return count


def _plane(value: Any) -> str:
    if value not in ("native", "python"):
        raise ValueError(f"unknown data plane {value!r}")
    return str(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value
