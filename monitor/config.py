"""fhmon's configuration: defaults, a TOML file, command-line overrides, validation.

Every option has one name used in the TOML file, in `--print-config` and (with dashes) on the
command line. Unknown or ill-typed keys are refused with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = "/var/lib/fhmon"


class ConfigError(Exception):
    """The configuration is unusable; the message names the key and what is wrong."""


@dataclass
class Config:
    socket: str = ""
    key_dir: str = ""
    allow: list[str] = field(default_factory=list)
    socket_mode: int = 0o600
    socket_owner: int | None = None
    socket_group: int | None = None
    log_level: str = "info"
    registration_timeout: float = 5.0
    max_connections: int = 1024
    max_connections_per_uid: int = 32
    max_targets: int = 4096
    metrics_address: str = ""
    sync_wakeup: bool = True
    signing: bool = True
    state_dir: str = ""
    keeper_socket: str = ""
    drop_capabilities: bool = True
    workers: int = 0
    sandbox: bool = False
    # who answers the calls: "native" (the Rust plane, monitor/dataplane.py) or "python"
    # (monitor/handlers, the reference it is tested against); data_plane_threads native
    # threads per target: "auto" is 2, the second reading only while it may run on another
    # CPU than the first (native/src/plane/spare.rs Spare; docs/performance.md), or a number
    data_plane: str = "native"
    data_plane_threads: int | str = "auto"

    def to_toml(self) -> str:
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                lines.append(f"# {f.name} = (unset)")
            elif f.name == "socket_mode":
                lines.append(f'{f.name} = "{value:04o}"')
            elif isinstance(value, bool):
                lines.append(f"{f.name} = {'true' if value else 'false'}")
            elif isinstance(value, (int, float)):
                lines.append(f"{f.name} = {value}")
            elif isinstance(value, list):
                lines.append(f"{f.name} = [{', '.join(_quote(v) for v in value)}]")
            else:
                lines.append(f"{f.name} = {_quote(str(value))}")
        return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_LEVELS = {"debug", "info", "warning", "error"}


def _expect(key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) and kind is not bool and bool not in (
            kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"config key {key!r}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise ConfigError(f"config key {key!r}: expected {_kind_name(kind)}, "
                          f"got {type(value).__name__} {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def parse_mode(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        # TOML reads `660` as six hundred and sixty (0o1224), not as octal 0660.
        raise ConfigError(f"config key {key!r}: write the mode as a string of octal digits, "
                          f'e.g. {key} = "0660"; the TOML integer {value} is not read as octal')
    if isinstance(value, str):
        try:
            mode = int(value, 8)
        except ValueError:
            raise ConfigError(f"config key {key!r}: {value!r} is not an octal mode") from None
    else:
        mode = _expect(key, value, int)
    if mode & ~0o777:
        raise ConfigError(f"config key {key!r}: mode {mode:o} has bits beyond 0777")
    if mode & 0o007:
        raise ConfigError(f"config key {key!r}: mode {mode:04o} lets any local user connect; "
                          f"use 0600 or 0660 with socket_group")
    return mode


def _parse_id(key: str, value: Any, kind: str, lookup: Callable[[str], int]) -> int:
    """A numeric id, or a name looked up in the user or group database."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        try:
            return lookup(value)
        except KeyError:
            raise ConfigError(f"config key {key!r}: no {kind} {value!r}") from None
    raise ConfigError(f"config key {key!r}: expected a {kind} name or {kind[0]}id")


def parse_user(key: str, value: Any) -> int:
    return _parse_id(key, value, "user", lambda name: pwd.getpwnam(name).pw_uid)


def parse_group(key: str, value: Any) -> int:
    return _parse_id(key, value, "group", lambda name: grp.getgrnam(name).gr_gid)


# Answering modes that lost their measurements (docs/performance.md): refused, not ignored,
# so that a config written for one does not silently run another.
RETIRED_KEYS = {
    "recv_thread": "a thread per listener asleep in RECV gained nothing at one caller and, "
                   "contending for the GIL, cost 126.8 vs 35.1 us of CPU per call at 8 "
                   "targets",
    "dispatch_thread": "answering from trio's event loop (dispatch_thread = false) cost "
                       "49.8 vs 34.3 us of CPU per name_to_handle_at, 68.2 vs 47.1 per "
                       "open_by_handle_at; the data plane (data_plane, workers) answers",
}


def apply(config: Config, values: dict[str, Any], source: str) -> Config:
    """Validate `values` (from TOML or flags) and set them on config."""
    known = {f.name for f in dataclasses.fields(Config)}
    for key, value in values.items():
        if key in RETIRED_KEYS:
            raise ConfigError(f"{source}: config key {key!r} was retired: {RETIRED_KEYS[key]}; "
                              f"remove it (docs/performance.md, \"Retired answering modes\")")
        if key not in known:
            raise ConfigError(f"{source}: unknown config key {key!r}; known keys: "
                              f"{', '.join(sorted(known))}")
        try:
            setattr(config, key, _validate(key, value))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return config


def _validate(key: str, value: Any) -> Any:
    match key:
        case "socket" | "key_dir" | "metrics_address" | "state_dir" | "keeper_socket":
            text = _expect(key, value, str)
            if key != "metrics_address" and text and not text.startswith("/"):
                raise ConfigError(f"config key {key!r}: {text!r} must be an absolute path")
            if key == "metrics_address" and text and ":" not in text:
                raise ConfigError(f"config key {key!r}: {text!r} must be HOST:PORT")
            return text
        case "allow":
            items = _expect(key, value, list)
            for item in items:
                _expect(key, item, str)
                if not item.startswith("/"):
                    raise ConfigError(f"config key 'allow': {item!r} must be an absolute glob")
                refuse_protected_glob(item, ())
            return list(items)
        case "socket_mode":
            return parse_mode(key, value)
        case "socket_owner":
            return parse_user(key, value)
        case "socket_group":
            return parse_group(key, value)
        case "log_level":
            level = _expect(key, value, str).lower()
            if level not in _LEVELS:
                raise ConfigError(f"config key 'log_level': {value!r} is not one of "
                                  f"{sorted(_LEVELS)}")
            return level
        case "registration_timeout":
            number = float(_expect(key, value, (int, float)))
            if not 0 < number <= 300:
                raise ConfigError("config key 'registration_timeout': must be in (0, 300] s")
            return number
        case "workers":
            number = _expect(key, value, int)
            if not 0 <= number <= 64:
                raise ConfigError("config key 'workers': must be in [0, 64] (0: fhmon serve "
                                  "answers the calls itself)")
            return number
        case "data_plane":
            plane = _expect(key, value, str)
            if plane not in ("python", "native"):
                raise ConfigError(f"config key 'data_plane': {plane!r} is not 'python' or "
                                  f"'native'")
            return plane
        case "data_plane_threads":
            if value == "auto":
                return value
            if isinstance(value, str):
                raise ConfigError(f"config key 'data_plane_threads': {value!r} is not "
                                  f"'auto' or a number of threads per target in [1, 64]")
            number = _expect(key, value, int)
            if not 1 <= number <= 64:
                raise ConfigError("config key 'data_plane_threads': must be 'auto' or in "
                                  "[1, 64] (threads per target)")
            return number
        case "max_connections" | "max_connections_per_uid" | "max_targets":
            number = _expect(key, value, int)
            if number < 1:
                raise ConfigError(f"config key {key!r}: must be at least 1")
            return number
        case "sync_wakeup" | "signing" | "drop_capabilities" | "sandbox":
            return _expect(key, value, bool)
    raise ConfigError(f"unknown config key {key!r}")


# Share roots here would hand a guest the host's system files or kernel interfaces: an allow
# glob that could name one of these, a directory above one, or anything inside one is refused.
SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/usr", "/bin", "/sbin",
               "/lib", "/lib64")


def _glob_may_name(pattern: str, protected: str, *, inside: bool) -> bool:
    """Could `pattern` (per-component shell glob) match `protected`, a directory above it
    or (when `inside`) a path below it?"""
    import fnmatch

    pat = [c for c in pattern.split("/") if c]
    path = [c for c in protected.split("/") if c]
    if len(pat) > len(path) and not inside:
        return False
    return all(fnmatch.fnmatchcase(p, g) for g, p in zip(pat, path, strict=False))


def refuse_protected_glob(pattern: str, key_dirs: tuple[str, ...]) -> None:
    """Refuse an allow glob that would let a share cover /, a system directory, fhmon's
    state directory or a key directory."""
    checks = [(d, True) for d in SYSTEM_DIRS] + [(DEFAULT_STATE_DIR, False)]
    checks += [(d, True) for d in key_dirs if d]
    for protected, inside in checks:
        if _glob_may_name(pattern, protected, inside=inside):
            what = ("the whole filesystem" if not pattern.strip("/")
                    else f"{protected} (or a directory in or above it)")
            raise ConfigError(f"config key 'allow': {pattern!r} would allow sharing {what}; "
                              f"allow only the directories meant for virtiofs shares, e.g. "
                              f"/srv/virtiofs/*")


def unmatched_globs(allow: list[str]) -> list[str]:
    """The allow globs that name no existing directory now (typos, or shares not yet made)."""
    import glob

    return [pattern for pattern in allow
            if not any(os.path.isdir(m) for m in glob.glob(pattern))]


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None


def embedded_default(state_dir: str = DEFAULT_STATE_DIR) -> Config:
    base = Path(state_dir)
    return Config(socket=str(base / "fhmon.sock"), key_dir=str(base / "keys"),
                  allow=[str(base / "shares" / "*")], state_dir=str(base))


def finish(config: Config) -> Config:
    missing = [k for k in ("socket", "key_dir") if not getattr(config, k)]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}: give --socket and --key-dir (or a "
                          f"config file), or run plain `fhmon serve` for the embedded default")
    if not config.allow:
        raise ConfigError("no --allow globs: nothing could ever be registered")
    for pattern in config.allow:
        refuse_protected_glob(pattern, (config.key_dir,))
    if config.socket_mode & 0o070 and config.socket_group is None:
        raise ConfigError("socket_mode gives group access but no socket_group is set")
    return config
