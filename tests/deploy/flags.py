"""The command lines the deploy files pass: fhmon's flag parser as the manifests use it, the
containers and mounts they name, and the real `fhmon` CLI to run them through.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, cast

import pytest

# `fhmon serve` flags; each takes one value, --allow may repeat.
SERVE_FLAGS = {
    "--socket",
    "--key-dir",
    "--allow",
    "--config",
    "--socket-mode",
    "--socket-group",
    "--metrics-address",
    "--log-level",
    "--keeper",
}
SERVE_REQUIRED = {"--socket", "--key-dir", "--allow"}


def fhmon_container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "fhmon"]
    return cast(dict[str, Any], c)


def parse_flags(argv: list[str], allowed: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Parse `--flag value` pairs; return the values per flag and the problems found."""
    flags: dict[str, list[str]] = {}
    problems: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg not in allowed:
            problems.append(f"unknown or misplaced argument {arg!r}")
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            problems.append(f"{arg} has no value")
            i += 1
            continue
        flags.setdefault(arg, []).append(argv[i + 1])
        i += 2
    for flag, values in flags.items():
        if flag != "--allow" and len(values) > 1:
            problems.append(f"{flag} given {len(values)} times")
    return flags, problems


def serve_flags(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    if argv[:1] != ["serve"]:
        return {}, [f"expected `serve` first, got {argv[:1]}"]
    flags, problems = parse_flags(argv[1:], SERVE_FLAGS)
    missing = SERVE_REQUIRED - set(flags)
    if missing:
        problems.append(f"missing required flags {sorted(missing)}")
    return flags, problems


def ds_flags(ds: dict[str, Any]) -> dict[str, list[str]]:
    flags, problems = serve_flags(fhmon_container(ds)["args"])
    assert problems == []
    return flags


def ds_socket(ds: dict[str, Any]) -> str:
    return ds_flags(ds)["--socket"][0]


Mount = tuple[dict[str, Any], dict[str, Any]]


def mount_for(container: dict[str, Any], spec: dict[str, Any], path: str) -> Mount | None:
    """The (volumeMount, volume) whose mountPath is `path` or the deepest one containing it."""
    best: Mount | None = None
    target = PurePosixPath(path)
    for m in container.get("volumeMounts", []):
        mp = PurePosixPath(m["mountPath"])
        inside = target == mp or mp in target.parents
        if inside and (best is None or len(str(mp)) > len(best[0]["mountPath"])):
            vols = [v for v in spec.get("volumes", []) if v["name"] == m["name"]]
            best = (m, vols[0] if vols else {})
    return best


def glob_root(pattern: str) -> str:
    """The directory part of a glob before its first wildcard."""
    parts = []
    for part in PurePosixPath(pattern).parts:
        if any(ch in part for ch in "*?["):
            break
        parts.append(part)
    return str(PurePosixPath(*parts))


def split_launch(command: list[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """`fhmon launch FLAGS -- CMD...` -> (flags, wrapped command, problems)."""
    if command[:2] != ["fhmon", "launch"] or "--" not in command:
        return {}, [], [f"not a `fhmon launch ... -- CMD` command: {command[:3]}"]
    sep = command.index("--")
    flags, problems = parse_flags(command[2:sep], {"--socket", "--share", "--user"})
    for required in ("--socket", "--share"):
        if required not in flags:
            problems.append(f"launch lacks {required}")
    return flags, command[sep + 1 :], problems


def virtiofsd_options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)


def find_fhmon() -> str | None:
    beside = Path(sys.executable).with_name("fhmon")
    return str(beside) if beside.exists() else shutil.which("fhmon")


FHMON = find_fhmon()
needs_cli = pytest.mark.skipif(FHMON is None, reason="the fhmon command is not installed")
# Subcommand -> the flags the deploy files and docs give it.
CLI_USES = {
    "serve": sorted(SERVE_FLAGS),
    "probe": ["--socket"],
    "launch": ["--socket", "--share"],
    "keygen": ["--key-dir"],
    "check": [],
}


def run_fhmon(*args: str) -> subprocess.CompletedProcess[str]:
    assert FHMON is not None
    return subprocess.run([FHMON, *args], capture_output=True, text=True, timeout=60)


def effective_config(argv: list[str]) -> dict[str, Any]:
    result = run_fhmon(*argv, "--print-config")
    assert result.returncode == 0, result.stderr
    return tomllib.loads(result.stdout)


def assert_effective(effective: dict[str, Any], flags: dict[str, list[str]]) -> None:
    assert effective["socket"] == flags["--socket"][0]
    assert effective["key_dir"] == flags["--key-dir"][0]
    assert effective["allow"] == flags["--allow"]
    for flag in ("--socket-mode", "--socket-group", "--metrics-address", "--log-level"):
        if flag in flags:
            assert str(effective[flag[2:].replace("-", "_")]) == flags[flag][0], flag
