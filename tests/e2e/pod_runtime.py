"""A stand-in for the kubelet + container runtime: runs one container of a pod spec.

    python3 pod_runtime.py SPEC.json

SPEC: {"root": DIR, "host": [paths shared from the host, e.g. /usr], "links": {name: target},
"mounts": [{"source": HOST, "target": PATH, "readonly": bool}], "files": {PATH: [TEXT, MODE]},
"uid": N, "gid": N, "groups": [N], "argv": [...], "env": {...}}

What it does is what runc does for a Kubernetes container, reduced to what virtiofsd's
container needs: a private mount namespace; a new root (tmpfs) with the host's /usr (the
image's files) and the pod's volume mounts bound at their mount paths (read-only where the
pod says so, as the device plugin's mount is); chroot; setgroups/setresgid/setresuid to the
container's user (which clears every capability); no_new_privs (allowPrivilegeEscalation:
false); exec of command + args with the container's environment. Not isolated: pid and
network namespaces, cgroups (not needed for this test).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV = 0x1, 0x2, 0x4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(source.encode(), target.encode(),
                       fstype.encode() if fstype else None, flags, None), f"mount {target}")


def bind(source: str, target: str, readonly: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if readonly:
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    root = spec["root"]
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV)
    for path in spec["host"]:
        bind(path, root + path, readonly=path not in ("/dev", "/proc"))
    for name, target in spec["links"].items():
        os.symlink(target, os.path.join(root, name))
    for m in spec["mounts"]:
        bind(m["source"], root + m["target"], m["readonly"])
    for path, (text, mode) in spec["files"].items():
        # Files of the image that the host lacks: a tmpfs over their directory.
        directory = root + os.path.dirname(path)
        if not os.path.ismount(directory):
            os.makedirs(directory, exist_ok=True)
            mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV)
        with open(root + path, "w") as out:
            out.write(text)
        os.chmod(root + path, mode)
    os.chroot(root)
    os.chdir("/")
    os.setgroups(spec["groups"])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    argv = spec["argv"]
    os.execve(argv[0], argv, spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
