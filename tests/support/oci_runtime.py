"""A stand-in for a container runtime using the OCI seccomp listenerPath convention.

    python -m tests.support.oci_runtime STYLE SOCKET SHARE -- CMD...

Like runc (STYLE=runc: compact JSON, then close) or crun (STYLE=crun: pretty JSON,
ociVersion 0.2.0, connection left open); STYLE=runc-nnp-off is runc for a container without
noNewPrivileges (the filter loaded while still root, no_new_privs left off). It forks the
"container process" (uid 65534, handle filter installed), sends the ContainerProcessState
with the listener fd, closes its own copy of the listener, lets the process exec CMD and
waits for it like a shim.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from monitor import fdpass, seccomp_filter


def main() -> int:
    style, sock_path, share = sys.argv[1:4]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    pid, listener, channel = seccomp_filter.fork_under_filter(
        (65534, 65534), argv, no_new_privs=style != "runc-nnp-off")
    state = {"ociVersion": "0.2.0" if style == "crun" else "1.0.2", "fds": ["seccompFd"],
             "pid": pid, "metadata": f"share={share};owner=test",
             "state": {"ociVersion": "1.0.2", "id": f"{style}-container", "status": "creating",
                       "pid": pid, "bundle": "/tmp/bundle", "annotations": {"a": "b"}}}
    text = json.dumps(state, indent=2) if style == "crun" else json.dumps(state,
                                                                          separators=(",", ":"))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    conn.sendmsg([text.encode()], fdpass.rights([listener]))
    os.close(listener)  # like runc: from now on only fhmon holds the listener
    if style.startswith("runc"):
        conn.close()
    seccomp_filter.go(channel)
    _, status = os.waitpid(pid, 0)
    conn.close()
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
