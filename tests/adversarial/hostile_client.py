"""A hostile intake client, run as any uid (often 65534, sometimes inside `unshare -Ur[m]`).

    python -m tests.adversarial.hostile_client SOCKET SHARE [pidfd:](child|self|PID) [LISTENER_FD]

Sends one HELLO for SHARE with a seccomp listener: LISTENER_FD if given (inherited), else
the listener of a child it forks under the handle filter (as its own uid). The target pid
is the child's ("child"), its own ("self") or PID; with "pidfd:" the HELLO has the
TARGET_PIDFD flag and carries a pidfd of that process after the listener, as `fhmon
launch` sends. Prints one JSON line: what fhmon said.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import sys

from monitor import seccomp_filter
from protocol import intake_wire


def filtered_child() -> tuple[int, int]:
    """(pid, listener fd) of a child of ours that sleeps under the filter."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            parent.close()
            fd = seccomp_filter.install(seccomp_filter.build_program())
            child.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))])
            os.close(fd)
            child.recv(1)
        finally:
            os._exit(0)
    child.close()
    _, ancdata, _, _ = parent.recvmsg(16, socket.CMSG_SPACE(4))
    parent.detach()  # the child waits on its end until we exit
    return pid, array.array("i", ancdata[0][2][:4])[0]


def hello_answer(sock: socket.socket, hello: intake_wire.Hello,
                 fds: list[int]) -> dict[str, object]:
    """Send HELLO with fds on a connected socket; what fhmon answered, as one JSON object."""
    sock.sendmsg([intake_wire.encode(hello)],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    decoder = intake_wire.FrameDecoder()
    message = None
    while message is None:
        chunk = sock.recv(65536)
        if not chunk:
            break
        decoder.feed(chunk)
        message = decoder.next_message()
    if isinstance(message, intake_wire.Refuse):
        return {"kind": "refuse", "errno": message.errno, "reason": message.reason}
    if isinstance(message, intake_wire.Accept):
        return {"kind": "accept", "message": message.message}
    return {"kind": "closed"}


def main(argv: list[str]) -> int:
    sock_path, share, who = argv[:3]
    child_pid = 0
    if len(argv) > 3:
        listener = int(argv[3])
    else:
        child_pid, listener = filtered_child()
    by_pidfd = who.startswith("pidfd:")
    who = who.removeprefix("pidfd:")
    target = child_pid if who == "child" else os.getpid() if who == "self" else int(who)
    fds = [listener]
    if by_pidfd:
        fds.append(os.pidfd_open(target))
    result: dict[str, object]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            try:
                sock.connect(sock_path)
            except OSError as exc:
                result = {"kind": "connect_error", "errno": exc.errno}
            else:
                flags = intake_wire.HELLO_TARGET_PIDFD if by_pidfd else 0
                result = hello_answer(sock, intake_wire.Hello(target, share, "hostile", flags), fds)
    finally:
        if child_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
            os.waitpid(child_pid, 0)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
