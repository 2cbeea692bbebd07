"""A stand-in for a container runtime using the OCI seccomp listenerPath convention.

    python oci_runtime.py STYLE SOCKET SHARE -- CMD...

Like runc (STYLE=runc: compact JSON, then close) or crun (STYLE=crun: pretty JSON,
ociVersion 0.2.0, connection left open): forks the "container process" (uid 65534, handle
filter installed), sends the ContainerProcessState with the listener fd, closes its own copy
of the listener, lets the process exec CMD and waits for it like a shim.
"""

from __future__ import annotations

import array
import json
import os
import socket
import sys

from monitor import seccomp_filter


def main() -> int:
    style, sock_path, share = sys.argv[1:4]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        program = seccomp_filter.build_program()
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        fd = seccomp_filter.install(program)
        child.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        os.close(fd)
        if child.recv(1) != b"G":
            os._exit(126)
        os.execvp(argv[0], argv)
    child.close()
    _, ancdata, _, _ = parent.recvmsg(16, socket.CMSG_SPACE(4))
    listener = array.array("i", ancdata[0][2][:4])[0]
    state = {"ociVersion": "0.2.0" if style == "crun" else "1.0.2", "fds": ["seccompFd"],
             "pid": pid, "metadata": f"share={share};owner=test",
             "state": {"ociVersion": "1.0.2", "id": f"{style}-container", "status": "creating",
                       "pid": pid, "bundle": "/tmp/bundle", "annotations": {"a": "b"}}}
    text = json.dumps(state, indent=2) if style == "crun" else json.dumps(state,
                                                                          separators=(",", ":"))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    conn.sendmsg([text.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [listener]))])
    os.close(listener)  # like runc: from now on only fhmon holds the listener
    if style == "runc":
        conn.close()
    parent.sendall(b"G")
    _, status = os.waitpid(pid, 0)
    conn.close()
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
