"""What each lever of the issue is worth, measured apart from fhmon.

    python -m bench.levers [--quick] [--json OUT]

Two parts, both run as root in this process:

* primitives: the cost in Python of each step a call can be built from, and of its
  alternatives (process_vm_readv through ctypes vs os.pread on a cached /proc/PID/mem fd,
  a cached pidfd vs pidfd_open each time, struct vs construct, HMAC state copied vs rebuilt,
  ...), measured against a live child process.
* floor: a do-nothing Python monitor (RECV, then SEND or ADDFD|SEND, no other work) against a
  child whose threads call name_to_handle_at / open_by_handle_at under a filter of its own:
  the round trip that every design pays, by way of waiting (trio's wait_readable, poll, a
  thread blocked in RECV), SYNC_WAKE_UP on/off, pinned/unpinned, and one monitor vs two
  threads vs two processes receiving from one listener.

fhmon's own code is not used (except KeyRing and the memory wrappers of monitor/linux.py, each
timed "as shipped" next to the alternatives): these numbers stay comparable while monitor/
changes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# --- kernel ABI (x86_64) -----------------------------------------------------------------
RECV, SEND, ID_VALID, ADDFD, SET_FLAGS = (0xC0502100, 0xC0182101, 0x40082102, 0x40182103,
                                          0x40082104)
ADDFD_FLAG_SEND = 2
SYNC_WAKE_UP = 1
N2H, OBH = 303, 304
SYS_SECCOMP, SYS_PROCESS_VM_READV, SYS_PROCESS_VM_WRITEV = 317, 310, 311
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438
PIDFD_THREAD = os.O_EXCL
STOP_MAGIC = 0x5EED  # arg0 of the call that tells one monitor worker to stop

NOTIF = struct.Struct("<QIIiIQ6Q")
RESP = struct.Struct("<QqiI")
ADDFD_S = struct.Struct("<QIIII")
U64 = struct.Struct("<Q")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
SYS_KCMP = 312


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def all_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def per_op_us(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    """The best over `rounds` of the mean time of one call of fn, in microseconds.

    The minimum, as timeit advises: other load on the machine only ever adds time, so the
    fastest round is the cost of the operation itself.
    """
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return min(samples)


# --- a live child to read, write and take fds from ---------------------------------------
@contextlib.contextmanager
def sleeper() -> Iterator[tuple[int, int]]:
    """A forked child blocked on a pipe; yields (pid, address of a 4 KiB buffer in it)."""
    buf = ctypes.create_string_buffer(b"x" * 4096, 4096)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        yield pid, ctypes.addressof(buf)
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def vm_read(pid: int, addr: int, length: int) -> bytes:
    """process_vm_readv through ctypes, one iovec, a fresh buffer (fhmon's original way)."""
    buf = ctypes.create_string_buffer(length)
    local = _IoVec(ctypes.addressof(buf), length)
    remote = _IoVec(addr, length)
    got = _syscall(SYS_PROCESS_VM_READV, ctypes.c_int(pid), ctypes.byref(local),
                   ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    if got < 0:
        raise OSError(ctypes.get_errno(), "process_vm_readv")
    return buf.raw[:got]


def vm_write(pid: int, addr: int, data: bytes) -> int:
    buf = ctypes.create_string_buffer(data, len(data))
    local = _IoVec(ctypes.addressof(buf), len(data))
    remote = _IoVec(addr, len(data))
    got = int(_syscall(SYS_PROCESS_VM_WRITEV, ctypes.c_int(pid), ctypes.byref(local),
                       ctypes.c_ulong(1), ctypes.byref(remote), ctypes.c_ulong(1),
                       ctypes.c_ulong(0)))
    if got < 0:
        raise OSError(ctypes.get_errno(), "process_vm_writev")
    return got


def pidfd_open(pid: int, flags: int = 0) -> int:
    fd = int(_syscall(SYS_PIDFD_OPEN, ctypes.c_int(pid), ctypes.c_uint(flags)))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    return fd


def pidfd_getfd(pidfd: int, fd: int) -> int:
    got = int(_syscall(SYS_PIDFD_GETFD, ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0)))
    if got < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return got


_STATUS = re.compile(rb"^(Tgid|Uid|Gid|Groups|CapEff):[ \t]*([^\n]*)$", re.MULTILINE)


def read_status(pid: int) -> dict[bytes, bytes]:
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return dict(_STATUS.findall(os.read(fd, 65536)))
    finally:
        os.close(fd)


def primitives(n: int) -> list[dict[str, Any]]:
    """Each step and its alternatives, in microseconds per operation."""
    rows: list[dict[str, Any]] = []

    def add(group: str, name: str, fn: Callable[[], object], count: int = n) -> None:
        rows.append({"group": group, "name": name, "us": per_op_us(fn, count)})

    with sleeper() as (pid, addr):
        mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        payload = b"y" * 136
        add("read target memory (136 B)", "process_vm_readv via ctypes, new buffer",
            lambda: vm_read(pid, addr, 136))
        add("read target memory (136 B)", "os.pread on a cached /proc/PID/mem fd",
            lambda: os.pread(mem, 136, addr))

        def open_read_close() -> bytes:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return os.pread(fd, 136, addr)
            finally:
                os.close(fd)

        add("read target memory (136 B)", "open + pread + close /proc/PID/mem", open_read_close)
        add("write target memory (136 B)", "process_vm_writev via ctypes",
            lambda: vm_write(pid, addr, payload))
        add("write target memory (136 B)", "os.pwrite on a cached /proc/PID/mem fd",
            lambda: os.pwrite(mem, payload, addr))

        cached = pidfd_open(pid)

        def getfd_cached() -> None:
            os.close(pidfd_getfd(cached, 0))

        def getfd_fresh() -> None:
            pfd = pidfd_open(pid, PIDFD_THREAD)
            try:
                os.close(pidfd_getfd(pfd, 0))
            finally:
                os.close(pfd)

        add("take a target fd", "pidfd_open + pidfd_getfd + 2 close", getfd_fresh)
        add("take a target fd", "cached pidfd: pidfd_getfd + close", getfd_cached)

        def cwd() -> None:
            os.close(os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_CLOEXEC))

        add("target cwd", "open /proc/PID/cwd O_PATH + close", cwd)
        rows.extend(_mount_fd_rows(pid, cached, n))
        add("target credentials", "read + parse /proc/PID/status", lambda: read_status(pid))
        rows.extend(_ctypes_rows(cached, n))
        rows.extend(_shipped_memory_rows(pid, addr, payload, n))
        os.close(cached)
        os.close(mem)

    rows.extend(_own_fd_rows(n))
    raw = bytes(range(80))
    rows.extend(_parse_rows(raw, n))
    rows.extend(_mac_rows(n))
    rows.append({"group": "per-call allocation", "name": "ctypes.create_string_buffer(136)",
                 "us": per_op_us(lambda: ctypes.create_string_buffer(136), n)})
    rows.append({"group": "per-call allocation", "name": "bytearray(136)",
                 "us": per_op_us(lambda: bytearray(136), n)})
    rows.extend(_sigmask_rows(n))
    return rows


def _ctypes_rows(pidfd: int, n: int) -> list[dict[str, Any]]:
    """One cheap syscall (pidfd_send_signal, signal 0) through ctypes, three ways, and through
    the standard library's C wrapper: what a ctypes call costs around the kernel's own."""
    group = "a syscall through ctypes (pidfd_send_signal 0)"
    with_errno = ctypes.CDLL(None, use_errno=True).syscall
    with_errno.restype = ctypes.c_long
    gil_held = ctypes.PyDLL(None).syscall
    gil_held.restype = ctypes.c_long
    c_int, c_uint = ctypes.c_int, ctypes.c_uint
    return [
        {"group": group, "name": "CDLL(use_errno=True), c_int-wrapped arguments",
         "us": per_op_us(lambda: with_errno(424, c_int(pidfd), c_int(0), None, c_uint(0)), n)},
        {"group": group, "name": "CDLL(use_errno=True), plain ints",
         "us": per_op_us(lambda: with_errno(424, pidfd, 0, None, 0), n)},
        {"group": group, "name": "PyDLL (GIL held, no errno swap), plain ints",
         "us": per_op_us(lambda: gil_held(424, pidfd, 0, None, 0), n)},
        {"group": group, "name": "signal.pidfd_send_signal (the stdlib's C wrapper, as "
         "shipped)", "us": per_op_us(lambda: signal.pidfd_send_signal(pidfd, 0), n)},
        {"group": group, "name": "os.getppid() (a syscall from C, for scale)",
         "us": per_op_us(os.getppid, n)},
    ]


def _shipped_memory_rows(pid: int, addr: int, payload: bytes, n: int) -> list[dict[str, Any]]:
    """fhmon's own wrappers (monitor/linux.py), next to the alternatives above."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from monitor import linux
    except Exception as exc:  # a lever table must not die of it
        return [{"group": "read target memory (136 B)",
                 "name": f"fhmon linux.process_vm_read: unavailable ({exc})", "us": None}]
    return [
        {"group": "read target memory (136 B)", "name": "fhmon linux.process_vm_read (as shipped)",
         "us": per_op_us(lambda: linux.process_vm_read_regions(pid, ((addr, 136),)), n)},
        {"group": "write target memory (136 B)",
         "name": "fhmon linux.process_vm_write (as shipped)",
         "us": per_op_us(lambda: linux.process_vm_write(pid, [(addr, payload)]), n)},
    ]


def _sigmask_rows(n: int) -> list[dict[str, Any]]:
    """Blocking every signal around ADDFD and restoring the mask, three ways."""
    import _signal

    group = "block + restore all signals"
    sig_all = signal.valid_signals()
    ints = {int(s) for s in sig_all}

    def enums() -> None:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sig_all)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def plain() -> None:
        old = _signal.pthread_sigmask(signal.SIG_BLOCK, ints)
        _signal.pthread_sigmask(signal.SIG_SETMASK, old)

    full = (ctypes.c_ulong * 16)(*([0xFFFFFFFFFFFFFFFF] * 16))
    saved = (ctypes.c_ulong * 16)()
    sigmask = _libc.pthread_sigmask

    def raw() -> None:
        sigmask(signal.SIG_BLOCK, full, saved)
        sigmask(signal.SIG_SETMASK, saved, None)

    return [{"group": group, "name": "signal.pthread_sigmask (returns a set of enums)",
             "us": per_op_us(enums, max(n // 20, 100))},
            {"group": group, "name": "_signal.pthread_sigmask (a set of ints)",
             "us": per_op_us(plain, n)},
            {"group": group, "name": "libc pthread_sigmask via ctypes, prebuilt sigset",
             "us": per_op_us(raw, n)}]


def _mount_fd_rows(pid: int, pidfd: int, n: int) -> list[dict[str, Any]]:
    """open_by_handle_at's mount_fd: take and inspect it each call, or ask kcmp whether it
    is still the open file a kept duplicate names (fhmon remembers the last one)."""
    group = "check the target's mount_fd (its fd 0 here)"
    kept = pidfd_getfd(pidfd, 0)

    def take_and_inspect() -> None:
        fd = pidfd_getfd(pidfd, 0)
        try:
            fcntl.fcntl(fd, fcntl.F_GETFL)
            os.fstat(fd)
        finally:
            os.close(fd)

    def ask_kcmp() -> None:
        if _syscall(SYS_KCMP, pid, os.getpid(), 0, 0, kept) != 0:
            raise OSError(ctypes.get_errno(), "kcmp")

    try:
        return [{"group": group, "name": "pidfd_getfd + fcntl + fstat + close",
                 "us": per_op_us(take_and_inspect, n)},
                {"group": group, "name": "kcmp against a kept duplicate (as shipped)",
                 "us": per_op_us(ask_kcmp, n)}]
    finally:
        os.close(kept)


def _own_fd_rows(n: int) -> list[dict[str, Any]]:
    """The path of one of fhmon's own fds (the inside-the-share check once readlinked the
    object and the share root on a plain-directory share; now it walks '..' by fd, and only
    the share root's path and a file on a filesystem without a generic handle layout are
    still read this way)."""
    group = "path of one of fhmon's fds (plain-directory share: 2 per name_to_handle_at)"
    tree = tempfile.mkdtemp(prefix="fhmon-levers-", dir="/tmp")
    deep = os.path.join(tree, "share", "dir", "inner")
    os.makedirs(deep)
    fd = os.open(deep, os.O_PATH | os.O_CLOEXEC)
    proc_fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return [{"group": group, "name": "readlink /proc/self/fd/N",
                 "us": per_op_us(lambda: os.readlink(f"/proc/self/fd/{fd}"), n)},
                {"group": group, "name": "readlinkat on an open /proc/self/fd (as shipped)",
                 "us": per_op_us(lambda: os.readlink(str(fd), dir_fd=proc_fd), n)}]
    finally:
        os.close(fd)
        os.close(proc_fd)
        shutil.rmtree(tree, ignore_errors=True)


def _parse_rows(raw: bytes, n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    group = "parse seccomp_notif (80 B)"
    rows.append({"group": group, "name": "struct.Struct.unpack",
                 "us": per_op_us(lambda: NOTIF.unpack(raw), n)})
    try:
        from protocol.kernel import Notification

        rows.append({"group": group,
                     "name": "protocol.kernel.Notification.parse (NamedTuple, as shipped)",
                     "us": per_op_us(lambda: Notification.parse(raw), n)})
        rows.append({"group": group, "name": "the same fields in a frozen dataclass",
                     "us": per_op_us(lambda: _FrozenNotification.parse(raw), n)})
    except ImportError:
        pass
    try:
        import construct as c

        notif = c.Struct("id" / c.Int64ul, "pid" / c.Int32ul, "flags" / c.Int32ul,
                         "nr" / c.Int32sl, "arch" / c.Int32ul, "ip" / c.Int64ul,
                         "args" / c.Array(6, c.Int64ul))
        compiled = notif.compile()
        rows.append({"group": group, "name": "construct Struct.parse",
                     "us": per_op_us(lambda: notif.parse(raw), max(n // 10, 100))})
        rows.append({"group": group, "name": "construct compiled parse",
                     "us": per_op_us(lambda: compiled.parse(raw), n)})
    except ImportError:
        pass
    return rows


@dataclasses.dataclass(frozen=True, slots=True)
class _FrozenNotification:
    """protocol.kernel.Notification as it was before it became a NamedTuple."""

    id: int
    pid: int
    flags: int
    nr: int
    arch: int
    instruction_pointer: int
    args: tuple[int, ...]

    @classmethod
    def parse(cls, raw: bytes) -> _FrozenNotification:
        v = NOTIF.unpack(raw)
        return cls(v[0], v[1], v[2], v[3], v[4], v[5], v[6:])


def _mac_rows(n: int) -> list[dict[str, Any]]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import hmac as chmac

    key = os.urandom(32)
    msg = os.urandom(64)  # domain tag + share id + type/len + 8 kernel bytes + key id ~ 64
    group = "MAC of one handle (64 B message)"
    keyed = chmac.HMAC(key, hashes.SHA256())
    std_keyed = hmac.new(key, digestmod=hashlib.sha256)

    def crypto_new() -> bytes:
        h = chmac.HMAC(key, hashes.SHA256())
        h.update(msg)
        return h.finalize()

    def crypto_copy() -> bytes:
        h = keyed.copy()
        h.update(msg)
        return h.finalize()

    def std_copy() -> bytes:
        h = std_keyed.copy()
        h.update(msg)
        return h.digest()

    rows: list[dict[str, Any]] = [
        {"group": group, "name": "cryptography HMAC built per call",
         "us": per_op_us(crypto_new, n)},
        {"group": group, "name": "cryptography HMAC keyed state .copy()",
         "us": per_op_us(crypto_copy, n)},
        {"group": group, "name": "stdlib hmac.new(key, msg, sha256).digest()",
         "us": per_op_us(lambda: hmac.new(key, msg, hashlib.sha256).digest(), n)},
        {"group": group, "name": "stdlib hmac keyed state .copy()", "us": per_op_us(std_copy, n)},
        {"group": group, "name": "stdlib hmac.digest(key, msg, 'sha256') one-shot",
         "us": per_op_us(lambda: hmac.digest(key, msg, "sha256"), n)},
        {"group": group, "name": "hashlib.blake2b keyed, 16 B (a different MAC: new format)",
         "us": per_op_us(lambda: hashlib.blake2b(msg, key=key, digest_size=16).digest(), n)},
    ]
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from monitor.signing import KeyRing

        ring = KeyRing({1: key}, 1)
        share = os.urandom(32)
        kernel_handle = os.urandom(8)
        signed = ring.sign(share, 1, kernel_handle)
        rows.append({"group": group, "name": "fhmon KeyRing.sign (as shipped)",
                     "us": per_op_us(lambda: ring.sign(share, 1, kernel_handle), n)})
        rows.append({"group": group, "name": "fhmon KeyRing.verify (as shipped)",
                     "us": per_op_us(lambda: ring.verify(share, 1, signed), n)})
    except Exception as exc:  # monitor/ may be mid-edit: report, do not fail
        rows.append({"group": group, "name": f"fhmon KeyRing: unavailable ({exc})", "us": None})
    return rows


def signing_costs(n: int) -> dict[str, float]:
    """fhmon's KeyRing.sign and .verify, each alone, in microseconds per handle."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from monitor.signing import KeyRing

    ring = KeyRing({1: os.urandom(32)}, 1)
    share = os.urandom(32)
    kernel_handle = os.urandom(8)
    signed = ring.sign(share, 1, kernel_handle)
    costs = {"sign_us": per_op_us(lambda: ring.sign(share, 1, kernel_handle), n),
             "verify_us": per_op_us(lambda: ring.verify(share, 1, signed), n)}
    try:  # what the native data plane pays per call: no Python call per operation
        from monitor import _native

        native_ring = _native.KeyRing({1: os.urandom(32)}, 1)
        if _native.TEST_HOOKS:  # KeyRing.cost is a test hook: scripts/setup.sh builds it in
            runs = sorted(native_ring.cost(max(n, 10000)) for _ in range(5))
            costs["native_sign_us"], costs["native_verify_us"] = runs[2]  # the median run
        else:
            print("levers: monitor._native has no test hooks (a release build): no native "
                  "signing cost; scripts/setup.sh builds them in", file=sys.stderr)
    except ImportError:
        pass
    return costs


# --- the floor: a do-nothing monitor -------------------------------------------------------
def _bpf_program() -> bytes:
    """Classic BPF: x86_64 only; 303 and 304 -> USER_NOTIF; everything else -> ALLOW."""
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    ins = [(ld_w_abs, 0, 0, 4), (jeq_k, 0, 4, 0xC000003E), (ld_w_abs, 0, 0, 0),
           (jeq_k, 1, 0, N2H), (jeq_k, 0, 1, OBH), (ret_k, 0, 0, 0x7FC00000),
           (ret_k, 0, 0, 0x7FFF0000)]
    return b"".join(struct.pack("<HBBI", *i) for i in ins)


def _install_filter() -> int:
    if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl")
    prog = _bpf_program()
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    fd = int(_syscall(SYS_SECCOMP, 1, 1 << 3, ctypes.byref(fprog)))  # NEW_LISTENER
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp")
    return fd


def _caller(sock: socket.socket) -> None:
    """The child: install the filter, hand over the listener, then run what it is told."""
    listener = _install_filter()
    socket.send_fds(sock, [b"L"], [listener])
    os.close(listener)
    cmd = json.loads(sock.recv(65536))
    op, calls, threads, warmup = cmd["op"], cmd["calls"], cmd["threads"], cmd["warmup"]
    cpus = cmd["cpus"]
    nr = N2H if op == "n2h" else OBH
    go = threading.Barrier(threads + 1)
    results: list[list[int]] = []
    errors = [0]
    lock = threading.Lock()

    def worker() -> None:
        os.sched_setaffinity(0, cpus)
        call = _syscall
        perf = time.perf_counter_ns
        close = os.close
        for _ in range(warmup):
            r = call(nr, 0, 0, 0, 0, 0)
            if nr == OBH and r >= 0:
                close(r)
        go.wait()
        lat = []
        bad = 0
        for _ in range(calls):
            t0 = perf()
            r = call(nr, 0, 0, 0, 0, 0)
            lat.append(perf() - t0)
            if r < 0:
                bad += 1
            elif nr == OBH:
                close(r)
        with lock:
            results.append(lat)
            errors[0] += bad

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    t0 = time.monotonic()
    go.wait()
    for w in workers:
        w.join()
    wall = time.monotonic() - t0
    for _ in range(cmd["stops"]):
        _syscall(N2H, STOP_MAGIC, 0, 0, 0, 0)
    ns = [x for lat in results for x in lat]
    data = json.dumps({"ns": ns, "wall": wall, "errors": errors[0]}).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def _serve_one(fd: int, reply: str, srcfd: int, buf: bytearray) -> bool:
    """RECV one notification (blocking), answer it; False when told to stop."""
    fcntl.ioctl(fd, RECV, buf, True)
    nid, _, _, nr, _, _, a0, *_ = NOTIF.unpack(buf)
    buf[:] = bytes(80)
    if nr == OBH and reply == "addfd":
        fcntl.ioctl(fd, ADDFD, bytearray(ADDFD_S.pack(nid, ADDFD_FLAG_SEND, srcfd, 0, 0)), True)
        return True
    if nr == OBH and reply == "addfd+send":
        newfd = fcntl.ioctl(fd, ADDFD, bytearray(ADDFD_S.pack(nid, 0, srcfd, 0, 0)), True)
        fcntl.ioctl(fd, SEND, bytearray(RESP.pack(nid, newfd, 0, 0)), True)
        return True
    fcntl.ioctl(fd, SEND, bytearray(RESP.pack(nid, 0, 0, 0)), True)
    return bool(a0 != STOP_MAGIC)


def _serve_loop(fd: int, wait: str, reply: str, cpus: list[int]) -> None:
    os.sched_setaffinity(0, cpus)
    srcfd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    buf = bytearray(80)
    try:
        if wait == "trio":
            import trio

            async def main() -> None:
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    if not _serve_one(fd, reply, srcfd, buf):
                        return

            trio.run(main)
        elif wait == "poll":
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while True:
                poller.poll()
                if not _serve_one(fd, reply, srcfd, buf):
                    return
        else:
            while _serve_one(fd, reply, srcfd, buf):
                pass
    finally:
        os.close(srcfd)


def floor_run(op: str, wait: str, reply: str, sync: bool, pinned: bool, calls: int,
              threads: int = 1, monitors: int = 1, processes: bool = False,
              warmup: int = 50, split: bool = False) -> dict[str, Any]:
    """One measurement of the do-nothing monitor; latencies from the caller's side.

    pinned: monitor and caller on CPU 0; split: monitor on CPU 0, caller on CPU 1, so that
    every wake-up crosses vCPUs (what an unpinned pair pays when the scheduler keeps them
    apart, e.g. on a busy machine); else both may run anywhere.
    """
    cpus = [0] if pinned or split else all_cpus()
    caller_cpus = [1 % len(all_cpus())] if split else cpus
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the caller process
        parent.close()
        code = 0
        try:
            _caller(child)
        except BaseException:
            code = 1
        os._exit(code)
    child.close()
    workers: list[int] = []
    threads_: list[threading.Thread] = []
    listener = -1
    try:
        _, fds, _, _ = socket.recv_fds(parent, 16, 1)
        listener = fds[0]
        sync_ok = True
        if sync:
            try:
                fcntl.ioctl(listener, SET_FLAGS, SYNC_WAKE_UP)
            except OSError:
                sync_ok = False
        before = resource.getrusage(resource.RUSAGE_SELF)
        children_cpu = 0.0
        if processes:
            for _ in range(monitors):
                wpid = os.fork()
                if wpid == 0:  # pragma: no cover - a monitor worker process
                    code = 0
                    try:
                        _serve_loop(listener, wait, reply, cpus)
                    except BaseException:
                        code = 1
                    os._exit(code)
                workers.append(wpid)
        else:
            for _ in range(monitors):
                t = threading.Thread(target=_serve_loop, args=(listener, wait, reply, cpus),
                                     daemon=True)
                t.start()
                threads_.append(t)
        parent.sendall(json.dumps({"op": op, "calls": calls, "threads": threads,
                                   "warmup": warmup, "cpus": caller_cpus,
                                   "stops": monitors}).encode())
        size = struct.unpack("<I", _recv_exact(parent, 4))[0]
        data = json.loads(_recv_exact(parent, size))
        for t in threads_:
            t.join(timeout=10)
        for wpid in workers:
            _, _, usage = os.wait4(wpid, 0)
            children_cpu += usage.ru_utime + usage.ru_stime
        workers.clear()
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for wpid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(wpid, signal.SIGKILL)
            os.waitpid(wpid, 0)
        if listener >= 0:
            os.close(listener)
        parent.close()
        os.waitpid(pid, 0)
    ns = sorted(data["ns"])
    total = len(ns)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
           + children_cpu)
    return {"p50_us": ns[total // 2] / 1000, "p99_us": ns[min(total - 1, int(total * 0.99))]
            / 1000, "calls_per_s": total / data["wall"],
            "cpu_us_per_call": cpu * 1e6 / (total + threads * warmup + monitors),
            "errors": data["errors"], "sync_ok": sync_ok}


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            raise EOFError("the caller process died")
        out += chunk
    return bytes(out)


FLOOR_CELLS: list[dict[str, Any]] = [
    # single caller thread: how to wait, SYNC_WAKE_UP, pinning, and the two kinds of reply
    *({"op": op, "wait": wait, "reply": reply, "sync": sync, "pinned": pinned}
      for pinned in (True, False)
      for op, reply in (("n2h", "send"), ("obh", "addfd"))
      for wait in ("trio", "poll", "recv")
      for sync in (True, False)),
    # other ways to inject the fd
    *({"op": "obh", "wait": "recv", "reply": "addfd+send", "sync": sync, "pinned": False}
      for sync in (True, False)),
    # every wake-up across vCPUs: what unpinned calls pay when the two end up apart
    *({"op": op, "wait": "recv", "reply": reply, "sync": True, "pinned": False, "split": True}
      for op, reply in (("n2h", "send"), ("obh", "addfd"), ("obh", "addfd+send"))),
    # throughput: 4 caller threads, 1 monitor vs 2 threads vs 2 processes
    *({"op": op, "wait": "recv", "reply": reply, "sync": True, "pinned": False, "threads": 4,
       "monitors": m, "processes": p}
      for op, reply in (("n2h", "send"), ("obh", "addfd"))
      for m, p in ((1, False), (2, False), (2, True))),
]


def floor(calls: int, repeat: int, cells: list[dict[str, Any]] | None = None,
          ) -> list[dict[str, Any]]:
    out = []
    for cell in cells if cells is not None else FLOOR_CELLS:
        runs = [floor_run(calls=calls, **cell) for _ in range(repeat)]
        row = dict(cell)
        row.setdefault("threads", 1)
        row.setdefault("split", False)
        row.setdefault("monitors", 1)
        row.setdefault("processes", False)
        for key in ("p50_us", "p99_us", "calls_per_s", "cpu_us_per_call"):
            row[key] = statistics.median(r[key] for r in runs)
        row["errors"] = sum(r["errors"] for r in runs)
        row["sync_ok"] = all(r["sync_ok"] for r in runs)
        out.append(row)
    return out


def floor_label(row: dict[str, Any]) -> str:
    monitors = ""
    if row.get("monitors", 1) > 1:
        monitors = f", {row['monitors']} {'processes' if row.get('processes') else 'threads'}"
    return (f"{row['op']} {row['reply']}, wait={row['wait']}, "
            f"sync={'on' if row['sync'] else 'off'}, {pinning(row)}, "
            f"{row.get('threads', 1)} thr{monitors}")


def pinning(row: dict[str, Any]) -> str:
    if row.get("split"):
        return "split"
    return "pinned" if row["pinned"] else "unpinned"


def id_valid_cost(n: int) -> float:
    """ID_VALID on a pending notification, in microseconds."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the caller process
        parent.close()
        listener = _install_filter()
        socket.send_fds(child, [b"L"], [listener])
        os.close(listener)
        _syscall(N2H, 0, 0, 0, 0, 0)
        os._exit(0)
    child.close()
    _, fds, _, _ = socket.recv_fds(parent, 16, 1)
    listener = fds[0]
    try:
        buf = bytearray(80)
        fcntl.ioctl(listener, RECV, buf, True)
        nid = NOTIF.unpack(buf)[0]
        packed = U64.pack(nid)
        cost = per_op_us(lambda: fcntl.ioctl(listener, ID_VALID, packed), n)
        fcntl.ioctl(listener, SEND, bytearray(RESP.pack(nid, 0, 0, 0)), True)
    finally:
        os.close(listener)
        parent.close()
        os.waitpid(pid, 0)
    return cost


def measure(quick: bool = False, repeat: int = 3) -> dict[str, Any]:
    n = 2000 if quick else 20000
    prims = primitives(n)
    prims.append({"group": "validate the notification", "name": "ID_VALID ioctl",
                  "us": id_valid_cost(n)})
    cells = FLOOR_CELLS
    if quick:
        cells = [c for c in FLOOR_CELLS if c.get("threads", 1) == 1 and not c["pinned"]
                 and c["wait"] == "recv"]
    return {"primitives": prims,
            "floor": floor(300 if quick else 4000, 1 if quick else repeat, cells)}


def print_levers(levers: dict[str, Any]) -> None:
    print("primitives (us per operation)")
    for row in levers["primitives"]:
        us = "-" if row["us"] is None else f"{row['us']:.2f}"
        print(f"  {row['group']:<34} {row['name']:<58} {us:>7}")
    print("floor: a do-nothing Python monitor")
    print(f"  {'cell':<70}{'p50 us':>8}{'p99 us':>8}{'calls/s':>9}{'cpu us':>8}")
    for row in levers["floor"]:
        print(f"  {floor_label(row):<70}{row['p50_us']:>8.1f}{row['p99_us']:>8.1f}"
              f"{row['calls_per_s']:>9.0f}{row['cpu_us_per_call']:>8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench.levers: run as root", file=sys.stderr)
        return 2
    levers = measure(args.quick, args.repeat)
    print_levers(levers)
    if args.json:
        Path(args.json).write_text(json.dumps(levers, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
