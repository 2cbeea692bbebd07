"""Entry point of the launcher copied by `fhmon install-launcher`: just `fhmon launch`.

It imports only what launching needs (not the server, not cryptography), and points
ctypes at the copied libraries first: in KubeVirt's image ctypes.util.find_library (which
asks ldconfig or a compiler) would not find libseccomp, which pyseccomp loads by name.

In KubeVirt's container the launcher and virtiofsd run as the same user (107), so a
compromised virtiofsd could ptrace its parent or pidfd_getfd() the listener out of it
(wherever Yama does not forbid it) and answer its own trapped calls. After forking, the
launcher makes itself non-dumpable: a same-user process then needs CAP_SYS_PTRACE to reach
it. The child stays dumpable (fhmon must read its memory) and exec resets it anyway.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

# DIR/lib/pythonX.Y/monitor/kubevirt/bundled.py -> DIR/lib
_LIBRARIES = Path(__file__).resolve().parents[3]


def _bundled_first(original: Callable[[str], str | None]) -> Callable[[str], str | None]:
    def find_library(name: str) -> str | None:
        if (_LIBRARIES.parent / "ld.so").exists():  # running from a bundle
            for entry in sorted(os.listdir(_LIBRARIES)):
                if entry.startswith(f"lib{name}.so"):
                    return str(_LIBRARIES / entry)
        return original(name)

    return find_library


def _install_library_lookup() -> None:
    if not getattr(ctypes.util.find_library, "_fhmon_bundled", False):
        wrapped = _bundled_first(ctypes.util.find_library)
        wrapped._fhmon_bundled = True  # type: ignore[attr-defined]
        ctypes.util.find_library = wrapped  # type: ignore[assignment]


_install_library_lookup()



def _not_dumpable() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(kernel.PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        print("fhmon launch: cannot make the launcher non-dumpable", file=sys.stderr)

# After the lookup (pyseccomp loads at import); loaded here so that install-launcher copies it.
from monitor import launcher  # noqa: E402, F401
from monitor.commands import node  # noqa: E402
from protocol import kernel  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fhmon-launcher")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="run CMD under the filter, registered with fhmon")
    launch.add_argument("--socket", required=True)
    launch.add_argument("--share", required=True)
    launch.add_argument("--user", help="UID[:GID] to run CMD as")
    node.add_launch_options(launch)
    launch.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    os.register_at_fork(after_in_parent=_not_dumpable)
    return node.launch_in_python(args)


if __name__ == "__main__":
    sys.exit(main())
