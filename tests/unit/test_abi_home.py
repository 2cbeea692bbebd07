"""Kernel ABI numbers have one home, protocol/kernel.py: no module of monitor/ declares one."""

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
