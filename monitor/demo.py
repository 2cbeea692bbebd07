"""`fhmon demo`: see fhmon work in one command (root, any recent Linux, nothing to set up).

Starts a private fhmon in a temporary directory, runs a small program as uid 65534 under
`fhmon launch`, which gets a signed handle, opens it, and tries a forged handle and an
escape from its share. Everything is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from protocol import kernel

DEMO_PROGRAM = r'''
import ctypes, errno, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def name_to_handle(path):
    buf = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("<Ii", buf, 0, 128, 0)
    mount_id = ctypes.c_int()
    if libc.syscall(SYS_N2H, AT_FDCWD, path.encode(), buf, ctypes.byref(mount_id), 0) != 0:
        return None, ctypes.get_errno()
    size, htype = struct.unpack_from("<Ii", buf)
    return (htype, buf.raw[8:8 + size]), 0

def open_handle(mount_fd, htype, f_handle):
    raw = struct.pack("<Ii", len(f_handle), htype) + f_handle
    fd = libc.syscall(SYS_OBH, mount_fd, ctypes.create_string_buffer(raw, len(raw)), os.O_RDONLY)
    return (fd, 0) if fd >= 0 else (None, ctypes.get_errno())

def errname(e):
    return f"{errno.errorcode[e]} ({os.strerror(e)})"

share = sys.argv[1]
print(f"  running as uid {os.getuid()}, without CAP_DAC_READ_SEARCH")
handle, err = name_to_handle(f"{share}/hello.txt")
if handle is None:
    sys.exit(f"  name_to_handle_at failed: {errname(err)}")
htype, f_handle = handle
kernel, key_id, mac = f_handle[:-20], f_handle[-20:-16], f_handle[-16:]
print(f"  name_to_handle_at({share}/hello.txt): type {htype}, {len(f_handle)} bytes")
print(f"    kernel handle  {kernel.hex()}")
print(f"    key id         {key_id.hex()}")
print(f"    MAC            {mac.hex()}")
mount_fd = os.open(share, os.O_RDONLY | os.O_DIRECTORY)
fd, err = open_handle(mount_fd, htype, f_handle)
if fd is None:
    sys.exit(f"  open_by_handle_at failed: {errname(err)}")
print(f"  open_by_handle_at -> fd {fd}: {os.read(fd, 100).decode().strip()!r}")
forged = bytearray(f_handle); forged[0] ^= 1
fd, err = open_handle(mount_fd, htype, bytes(forged))
result = errname(err) if fd is None else "OPENED?!"
print(f"  a forged handle (one bit flipped)         -> {result}")
_, err = name_to_handle(f"{share}/../outside/secret.txt")
result = errname(err) if err else "GOT A HANDLE?!"
print(f"  name_to_handle_at(share/../outside/...)   -> {result}")
'''
# The target runs on its own (as uid 65534, without fhmon's packages): the ABI numbers it
# needs are written into its text from protocol/kernel.py.
DEMO_PROGRAM = (f"SYS_N2H = {kernel.SYS_NAME_TO_HANDLE_AT}\n"
                f"SYS_OBH = {kernel.SYS_OPEN_BY_HANDLE_AT}\n"
                f"AT_FDCWD = {kernel.AT_FDCWD}\n") + DEMO_PROGRAM



def run_demo() -> int:
    if os.geteuid() != 0:
        print("fhmon demo: run as root (fhmon itself runs as root)", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="fhmon-demo-", dir="/tmp"))
    serve: subprocess.Popen[bytes] | None = None
    try:
        base.chmod(0o755)
        share, outside = base / "share", base / "outside"
        for d in (share, outside):
            d.mkdir(mode=0o755)
        (share / "hello.txt").write_text("hello from the share\n")
        (outside / "secret.txt").write_text("not for the target\n")
        for f in (share / "hello.txt", outside / "secret.txt"):
            f.chmod(0o644)
        program = base / "demo_target.py"
        program.write_text(DEMO_PROGRAM)
        program.chmod(0o644)
        fhmon = [sys.executable, "-m", "monitor.cli"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
        sock = str(base / "fhmon.sock")
        print("1. a private fhmon, with a fresh key and one allowed share")
        subprocess.run([*fhmon, "keygen", "--key-dir", str(base / "keys")], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        log = open(base / "serve.log", "wb")  # noqa: SIM115 - closed with the process
        serve = subprocess.Popen([*fhmon, "serve", "--socket", sock, "--key-dir",
                                  str(base / "keys"), "--allow", str(share)],
                                 stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 20
        while not os.path.exists(sock):
            if serve.poll() is not None or time.monotonic() > deadline:
                print((base / "serve.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)
        print(f"   socket {sock}, share {share}")
        print("2. a program under `fhmon launch --user 65534`")
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        result = subprocess.run([*fhmon, "launch", "--socket", sock, "--share", str(share),
                                 "--user", "65534", "--", python, str(program), str(share)],
                                env=env)
        print("3. what fhmon logged about it (its audit trail of refusals):")
        for line in (base / "serve.log").read_text().splitlines():
            if '"audit":true' in line:
                print(f"   {line}")
        print("Next: README.md (serve, launch), docs/architecture.md, docs/semantics.md")
        return result.returncode
    finally:
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)
