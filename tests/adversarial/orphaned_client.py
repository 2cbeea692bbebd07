"""An intake client whose connection outlives it, run as any uid (65534).

    python -m tests.adversarial.orphaned_client SOCKET SHARE

Starts a filtered child, connects to fhmon, prints {"peer": its pid}, hands the connection
to a child and exits: the connection's SO_PEERCRED pid is then free for the kernel to give
another process. The child reads a target pid from stdin and sends a HELLO naming it (by
pid) with the filtered child's listener; it prints one JSON line: what fhmon said.

Every process of ours is started before the pid is printed: one started after it could
take that pid itself while the test hands it to another process, and hold it for good.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from protocol import intake_wire
from tests.adversarial.hostile_client import filtered_child, hello_answer


def main(argv: list[str]) -> int:
    sock_path, share = argv[:2]
    _, listener = filtered_child()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    print(json.dumps({"peer": os.getpid()}), flush=True)
    if os.fork():
        os._exit(0)
    target = int(sys.stdin.readline())
    sock.settimeout(10)
    result = hello_answer(sock, intake_wire.Hello(target, share, "orphaned"), [listener])
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
