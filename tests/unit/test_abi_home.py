"""Kernel ABI numbers have one home in each language: protocol/kernel.py (no module of
monitor/ declares one) and native/src/abi.rs (no other Rust file does), and the two agree."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from protocol import kernel

MONITOR = Path(__file__).resolve().parents[2] / "monitor"
ABI_NAME = re.compile(r"_?(SYS|CAP|PR|FS_IOC|FS_.*_FL|SECCOMP|RESOLVE|STATX|AT|O|KCMP|PIDFD|"
                      r"LINUX_CAPABILITY|[A-Z0-9]+_SUPER|TMPFS)(_[A-Z0-9_]+)?$")


def test_no_module_of_monitor_declares_a_kernel_constant() -> None:
    found = []
    for path in MONITOR.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                if isinstance(target, ast.Name) and ABI_NAME.fullmatch(target.id):
                    found.append(f"{path.relative_to(MONITOR.parent)}:{node.lineno} {target.id}")
    assert not found, found


def test_constants_python_also_knows_agree() -> None:
    assert kernel.PIDFD_THREAD == os.O_EXCL
    assert kernel.O_PATH == os.O_PATH and kernel.O_CLOEXEC == os.O_CLOEXEC
    assert kernel.AT_FDCWD == -100


# --- the native crates: native/src/abi.rs is their home, and it agrees with kernel.py ----

NATIVE = MONITOR.parent / "native"
ABI_RS = NATIVE / "src" / "abi.rs"
RUST_CONST = re.compile(r"^\s*(?:pub(?:\([a-z]+\))? )?const ([A-Z][A-Z0-9_]*): [a-z0-9]+ = (.+);",
                        re.M)
# abi.rs names that Python spells otherwise (os gives it, or kernel.py has no use for it)
PYTHON_SPELLING = {"ST_RDONLY": os.ST_RDONLY}
# fhmon's own names that look like ABI names
NOT_ABI = {"PIDFD_CACHE"}  # plane/thread_cache.rs: cached thread pidfds per target


def _rust_value(expression: str, known: dict[str, int]) -> int:
    """A Rust integer constant expression of abi.rs: literals (0x, 0o, _ separators, a
    leading minus), names defined above it and |."""
    value = 0
    for term in expression.split("|"):
        term = term.strip()
        if term in known:
            value |= known[term]
        else:
            value |= int(term.replace("_", ""), 0)
    return value


def _abi_rs() -> dict[str, int]:
    known: dict[str, int] = {}
    for name, expression in RUST_CONST.findall(ABI_RS.read_text()):
        known[name] = _rust_value(expression, known)
    return known


def test_every_abi_rs_constant_has_kernel_pys_value() -> None:
    constants = _abi_rs()
    assert len(constants) > 40  # the parse found them (a format change would find none)
    wrong = {name: (hex(value), PYTHON_SPELLING.get(name, getattr(kernel, name, None)))
             for name, value in constants.items()
             if PYTHON_SPELLING.get(name, getattr(kernel, name, None)) != value}
    assert not wrong, f"abi.rs against protocol/kernel.py: {wrong}"


def test_no_other_rust_file_declares_a_kernel_constant() -> None:
    found = []
    for path in sorted(NATIVE.rglob("*.rs")):
        if path == ABI_RS or "target" in path.relative_to(NATIVE).parts:
            continue
        for match in RUST_CONST.finditer(path.read_text()):
            name, value = match.groups()
            if ABI_NAME.fullmatch(name) and name not in NOT_ABI and not value.startswith("libc::"):
                found.append(f"{path.relative_to(NATIVE)}: {name}")
    assert not found, found
