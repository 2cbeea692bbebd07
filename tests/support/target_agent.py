"""A target program for tests: performs raw syscalls on command, reports exactly what happened.

Runs with only the standard library (it is started with the system python as uid 65534,
under fhmon's filter or without it). Commands and answers are JSON lines on stdin/stdout.
Buffers live in mmap'd pages next to a PROT_NONE guard page and a read-only page, so tests
can place a pointer exactly where the kernel would fault.
"""

import contextlib
import ctypes
import errno
import json
import mmap
import os
import stat
import struct
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
PAGE = mmap.PAGESIZE
SYS_N2H, SYS_OBH = 303, 304
SYS_SETFSGID = 123
CANARY = 0xA5


class Arena:
    """Pages: [rw][rw][rw][none][ro]. Placements name addresses within them."""

    def __init__(self):
        self.map = mmap.mmap(-1, 5 * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        if libc.mprotect(self.base + 3 * PAGE, PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect none")
        if libc.mprotect(self.base + 4 * PAGE, PAGE, mmap.PROT_READ) != 0:
            raise OSError(ctypes.get_errno(), "mprotect ro")
        self.guard = self.base + 3 * PAGE
        self.readonly = self.base + 4 * PAGE

    def reset(self):
        ctypes.memset(self.base, CANARY, 3 * PAGE)

    def place(self, where, size, slot):
        """Address for a buffer of `size` bytes; slot separates buffers of one call."""
        if where == "normal":
            return self.base + slot * PAGE + 64
        if where == "end_of_page":  # ends exactly at the guard page
            return self.guard - size
        if where == "straddle":  # starts 4 bytes before the guard page
            return self.guard - 4
        if where == "unmapped":
            return self.guard
        if where == "readonly":
            return self.readonly
        if where == "null":
            return 0
        if where == "kernel":
            return 0xFFFF800000000000
        raise ValueError(where)

    def read(self, addr, size):
        if self.base <= addr and addr + size <= self.guard:
            return ctypes.string_at(addr, size)
        return None


_LOCAL = threading.local()


class _ArenaProxy:
    """Each thread gets its own pages, so concurrent calls never share buffers."""

    def __getattr__(self, name):
        arena = getattr(_LOCAL, "arena", None)
        if arena is None:
            arena = _LOCAL.arena = Arena()
        return getattr(arena, name)


ARENA = _ArenaProxy()
FDS = {}


def resolve_fd(spec):
    if spec == "cwd":
        return -100
    if isinstance(spec, int):
        return spec
    return FDS[spec]


def n2h(cmd):
    ARENA.reset()
    path = cmd.get("path", "")
    raw_path = path.encode() + b"\0" if isinstance(path, str) else None
    hb = cmd.get("handle_bytes", 128)
    path_place = cmd.get("path_place", "normal")
    if raw_path is not None and path_place != "normal" and path_place not in (
            "unmapped", "null", "kernel"):
        addr_path = ARENA.place(path_place, len(raw_path), 0)
    else:
        addr_path = ARENA.place(path_place, len(raw_path or b""), 0)
    if addr_path and ARENA.base <= addr_path < ARENA.guard:
        length = cmd.get("path_raw_len")
        data = raw_path if length is None else (path.encode() * 10000)[:length]
        if addr_path + len(data) > ARENA.guard:
            data = data[: ARENA.guard - addr_path]
        ctypes.memmove(addr_path, data, len(data))
    handle_size = 8 + max(0, min(hb, 4096))
    addr_handle = ARENA.place(cmd.get("handle_place", "normal"), handle_size, 1)
    if ARENA.base <= addr_handle and addr_handle + 8 <= ARENA.guard:
        ctypes.memmove(addr_handle, struct.pack("<Ii", hb & 0xFFFFFFFF, cmd.get("type_in", 0)), 8)
    mnt_size = 8
    addr_mnt = ARENA.place(cmd.get("mount_id_place", "normal"), mnt_size, 2)
    dirfd = resolve_fd(cmd.get("dirfd", "cwd"))
    r = libc.syscall(SYS_N2H, ctypes.c_long(dirfd), ctypes.c_void_p(addr_path),
                     ctypes.c_void_p(addr_handle), ctypes.c_void_p(addr_mnt),
                     ctypes.c_long(cmd.get("flags", 0)))
    err = ctypes.get_errno() if r < 0 else 0
    out = {"ret": r, "errno": err}
    h = ARENA.read(addr_handle, 8 + 160) if addr_handle else None
    if h is None and addr_handle and ARENA.base <= addr_handle < ARENA.guard:
        h = ARENA.read(addr_handle, ARENA.guard - addr_handle)
    out["handle_mem"] = h.hex() if h is not None else None
    m = ARENA.read(addr_mnt, 8) if addr_mnt else None
    out["mount_mem"] = m.hex() if m is not None else None
    return out


def obh(cmd):
    ARENA.reset()
    f_handle = bytes.fromhex(cmd["f_handle"])
    hb = cmd.get("handle_bytes", len(f_handle))
    raw = struct.pack("<Ii", hb & 0xFFFFFFFF, cmd.get("handle_type", 0)) + f_handle
    place = cmd.get("handle_place", "normal")
    addr = ARENA.place(place, len(raw), 1)
    if addr and ARENA.base <= addr < ARENA.guard:
        data = raw[: ARENA.guard - addr]
        ctypes.memmove(addr, data, len(data))
    mount_fd = resolve_fd(cmd.get("mount_fd", "share"))
    r = libc.syscall(SYS_OBH, ctypes.c_long(mount_fd), ctypes.c_void_p(addr),
                     ctypes.c_long(cmd.get("flags", 0)))
    err = ctypes.get_errno() if r < 0 else 0
    out = {"ret": r, "errno": err}
    if r >= 0 and (r <= 2 or r in FDS.values()):
        # never close what we did not get from this call: report the impossible answer
        return {"ret": r, "errno": -1, "bogus_fd": r}
    if r >= 0:
        out.update(describe_fd(r))
        if cmd.get("keep"):
            FDS[cmd["keep"]] = r
        else:
            os.close(r)
    return out


def describe_fd(fd):
    import fcntl
    st = os.fstat(fd)
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    info = {"dev": st.st_dev, "ino": st.st_ino, "mode": st.st_mode,
            "type": "dir" if stat.S_ISDIR(st.st_mode) else "reg" if stat.S_ISREG(st.st_mode)
            else "other", "accmode": fl & 3, "o_path": bool(fl & os.O_PATH),
            "cloexec": bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC),
            "nonblock": bool(fl & os.O_NONBLOCK), "append": bool(fl & os.O_APPEND),
            "path": fd_path_or_error(fd)}
    if stat.S_ISREG(st.st_mode) and fl & 3 != 1 and not fl & os.O_PATH:
        try:
            info["head"] = os.pread(fd, 64, 0).hex()
        except OSError as exc:
            info["read_errno"] = exc.errno
    return info


def fd_path_or_error(fd):
    """The fd's path, or "<errno name>" when the kernel cannot print it (deeper than
    PATH_MAX: ENAMETOOLONG)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        return f"<{errno.errorcode.get(exc.errno, exc.errno)}>"


def walk(cmd):
    """Open cmd["parts"] one component at a time from dirfd (O_PATH|O_DIRECTORY for every
    step but the last, which gets cmd["flags"]): reaches paths longer than PATH_MAX."""
    fd = resolve_fd(cmd.get("dirfd", "share"))
    parts = cmd["parts"]
    opened = []
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = cmd.get("flags", os.O_PATH) if last else os.O_PATH | os.O_DIRECTORY
            fd = os.open(part, flags | os.O_CLOEXEC, dir_fd=fd)
            opened.append(fd)
    except OSError as exc:
        for f in opened:
            os.close(f)
        return {"ret": -1, "errno": exc.errno}
    for f in opened[:-1]:
        os.close(f)
    FDS[cmd["name"]] = opened[-1] if opened else os.dup(fd)
    return {"ret": FDS[cmd["name"]], "errno": 0}


def do_chmod(cmd):
    """chmod(path, mode) as this process: the oracle for what a chmod would give."""
    try:
        os.chmod(cmd["path"], cmd["mode"])
    except OSError as exc:
        return {"errno": exc.errno}
    return {"errno": 0}


def do_mount(cmd):
    """mount(2) in this process's own mount namespace (a target that made itself root of a
    user and mount namespace): a bind of cmd["source"], or a tmpfs, over cmd["target"]."""
    if cmd.get("tmpfs"):
        r = libc.mount(b"adv", cmd["target"].encode(), b"tmpfs", 0, None)
    else:
        r = libc.mount(cmd["source"].encode(), cmd["target"].encode(), None,
                       4096 | 16384, None)  # MS_BIND | MS_REC
    return {"errno": ctypes.get_errno() if r < 0 else 0}


def do_open(cmd):
    try:
        fd = os.open(cmd["path"], cmd.get("flags", os.O_RDONLY))
    except OSError as exc:
        return {"ret": -1, "errno": exc.errno}
    FDS[cmd["name"]] = fd
    return {"ret": fd, "errno": 0}


def probe_open(cmd):
    """open(path, flags) as this process: the oracle for what an open should give."""
    fd = libc.open(cmd["path"].encode(), ctypes.c_int(cmd.get("flags", 0)))  # no implicit CLOEXEC
    if fd < 0:
        return {"ret": -1, "errno": ctypes.get_errno()}
    try:
        return {"ret": fd, "errno": 0, **describe_fd(fd)}
    finally:
        os.close(fd)


def whereis(cmd):
    """Where a lookup lands (O_PATH, follow or not): path and type, as this process sees it."""
    flags = os.O_PATH | (0 if cmd.get("follow") else os.O_NOFOLLOW)
    try:
        dirfd = resolve_fd(cmd.get("dirfd", "cwd"))
        fd = os.open(cmd["path"], flags, dir_fd=None if dirfd == -100 else dirfd) if cmd[
            "path"] else os.dup(dirfd) if dirfd != -100 else os.open(".", os.O_PATH)
    except OSError as exc:
        return {"errno": exc.errno}
    try:
        st = os.fstat(fd)
        return {"errno": 0, "path": os.readlink(f"/proc/self/fd/{fd}"), "mode": st.st_mode}
    finally:
        os.close(fd)


def on_threads(body, count):
    """Run body on count threads at once; return when every one has finished. The threads
    all start before any runs body: creating 2,000 of them beside 2,000 that already call
    took 40-60 s on 2 CPUs, so a test waiting for them all raced the machine's speed."""
    ready = threading.Barrier(count)

    def when_all_started():
        # a thread that could not be started breaks the barrier: the others go on, as before
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(timeout=120)
        body()

    threads = [threading.Thread(target=when_all_started) for _ in range(count)]
    try:
        for t in threads:
            t.start()
    except BaseException:
        ready.abort()
        raise
    for t in threads:
        if t.ident is not None:
            t.join()


def hammer(cmd):
    """Many calls on several threads; counts results (for load and isolation tests).

    `calls` per thread, or with `until` (a path) as many as it takes until that file
    exists: a load that must outlast what the test does meanwhile (restarts, a key
    rotation) is bounded by that, not by a count a fast machine finishes early. `seconds`
    (default 300) bounds an `until` load that the test never ends."""
    import time
    results = {}
    lock = threading.Lock()
    lat = []
    odd = []
    until = cmd.get("until")
    give_up = time.monotonic() + cmd.get("seconds", 300)

    def more():
        if until is None:
            yield from range(cmd["calls"])
            return
        while not os.path.exists(until) and time.monotonic() < give_up:
            yield None

    def worker():
        for _ in more():
            t0 = time.perf_counter()
            kind = cmd.get("op2", "n2h")
            if kind == "mix":  # virtiofsd-like: one lookup for three opens
                with lock:
                    kind = "n2h" if len(lat) % 4 == 0 else "obh"
            r = n2h({"path": cmd["path"], "dirfd": cmd.get("dirfd", "cwd")}) if (
                kind == "n2h") else obh(dict(cmd["obh"]))
            dt = time.perf_counter() - t0
            with lock:
                key = str(r["errno"])
                results[key] = results.get(key, 0) + 1
                lat.append(dt)
                if r["errno"] and len(odd) < 5:
                    odd.append({"kind": kind, **{k: v for k, v in r.items()
                                                 if k in ("ret", "errno", "bogus_fd")}})

    on_threads(worker, cmd.get("threads", 1))
    lat.sort()
    return {"results": results, "p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)],
            "failures": odd, "ended_by_until": until is not None and os.path.exists(until)}


# --- adversarial ops (tests/adversarial) ---------------------------------------------------

def storm(cmd):
    """name_to_handle_at(AT_FDCWD, path) on `threads` threads in the tightest loop this
    program can make (buffers built once, nothing read back), `calls` per thread: a
    caller that spends as little as it can between calls, so that it presses fhmon, not
    the CPUs; `flags` are the call's (AT_SYMLINK_FOLLOW to follow a final symlink).
    Returns errno counts."""
    raw_path = cmd["path"].encode() + b"\0"
    flags = cmd.get("flags", 0)
    counts = {}
    lock = threading.Lock()
    call = libc.syscall

    def worker():
        path = ctypes.create_string_buffer(raw_path, len(raw_path))
        handle = ctypes.create_string_buffer(8 + 128)
        mnt = ctypes.create_string_buffer(8)
        mine = {}
        for _ in range(cmd["calls"]):
            ctypes.memmove(handle, b"\x80\0\0\0", 4)  # handle_bytes = 128
            r = call(SYS_N2H, -100, path, handle, mnt, flags)
            err = ctypes.get_errno() if r < 0 else 0
            mine[err] = mine.get(err, 0) + 1
        with lock:
            for err, n in mine.items():
                counts[str(err)] = counts.get(str(err), 0) + n

    on_threads(worker, cmd.get("threads", 1))
    return {"results": counts}


def race(cmd):
    """One thread calls in a loop while another rewrites the call's buffer in a tight loop.

    "call" is "n2h" (the buffer is the path) or "obh" (the buffer is the whole struct
    file_handle). "variants" are hex byte strings written in turn at the same address, so
    fhmon may read any of them, or a torn mix. Returns errno counts, and for each success
    what was obtained: the handle bytes (n2h) or the opened file (obh).
    """
    import time
    arena = Arena()  # one arena for both threads: the flipper must hit the caller's buffer
    ctypes.memset(arena.base, CANARY, 3 * PAGE)
    variants = [bytes.fromhex(v) for v in cmd["variants"]]
    buf = arena.base + 64
    ctypes.memmove(buf, variants[0], len(variants[0]))
    handle_addr = arena.base + PAGE + 64
    mnt_addr = arena.base + 2 * PAGE + 64
    stop = threading.Event()
    flips = [0]

    def flipper():
        i = 0
        while not stop.is_set():
            v = variants[i % len(variants)]
            ctypes.memmove(buf, v, len(v))
            i += 1
        flips[0] = i

    t = threading.Thread(target=flipper)
    t.start()
    errnos, got = {}, {}
    mount_fd = resolve_fd(cmd.get("mount_fd", "share"))
    deadline = time.monotonic() + cmd.get("seconds", 30)
    try:
        for _ in range(cmd["calls"]):
            if time.monotonic() > deadline:
                break
            if cmd["call"] == "n2h":
                ctypes.memmove(handle_addr, struct.pack("<Ii", 128, 0), 8)
                r = libc.syscall(SYS_N2H, ctypes.c_long(-100), ctypes.c_void_p(buf),
                                 ctypes.c_void_p(handle_addr), ctypes.c_void_p(mnt_addr),
                                 ctypes.c_long(cmd.get("flags", 0)))
                err = ctypes.get_errno() if r < 0 else 0
                if r == 0:
                    hb, ht = struct.unpack("<Ii", ctypes.string_at(handle_addr, 8))
                    f_handle = ctypes.string_at(handle_addr + 8, min(hb, 128))
                    key = f"{ht}:{f_handle.hex()}"
                    got[key] = got.get(key, 0) + 1
            else:
                r = libc.syscall(SYS_OBH, ctypes.c_long(mount_fd), ctypes.c_void_p(buf),
                                 ctypes.c_long(cmd.get("flags", 0)))
                err = ctypes.get_errno() if r < 0 else 0
                if r >= 0:
                    st = os.fstat(r)
                    key = f"{st.st_dev}:{st.st_ino}:{os.readlink(f'/proc/self/fd/{r}')}"
                    got[key] = got.get(key, 0) + 1
                    os.close(r)
            errnos[str(err)] = errnos.get(str(err), 0) + 1
    finally:
        stop.set()
        t.join()
    return {"errnos": errnos, "got": got, "flips": flips[0]}


def thread_call(cmd, ops):
    """cmd["call"] on a new thread that exits afterwards; adds the thread's TID. With
    cmd["fsgid"], the thread first sets its own fsgid (per thread) and reports it."""
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        if "fsgid" in cmd:
            libc.syscall(SYS_SETFSGID, ctypes.c_long(cmd["fsgid"]))
            out["fsgid"] = libc.syscall(SYS_SETFSGID, ctypes.c_long(-1))
        out.update(ops[cmd["call"]["op"]](cmd["call"]))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out


F_SETLEASE, F_WRLCK = 1024, 1


def take_lease(cmd):
    """Open cmd["path"] read-only and take a write lease on it (F_SETLEASE F_WRLCK: any
    other open of the file, fhmon's included, must wait for the lease break, up to
    /proc/sys/fs/lease-break-time). The break's SIGIO is ignored: this holder never lets
    go, the kernel breaks the lease when its time is up."""
    import fcntl
    import signal
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    fd = os.open(cmd["path"], os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, F_SETLEASE, F_WRLCK)
    except OSError as exc:
        os.close(fd)
        return {"errno": exc.errno}
    FDS[cmd["name"]] = fd
    return {"errno": 0, "ret": fd}


def lingering_socket(cmd):
    """A TCP socket whose close lingers: connected over loopback to a listener that never
    accepts or reads, its send queue full (the peer's window is closed), SO_LINGER on for
    cmd["seconds"]. The last close of it blocks that long (the kernel waits for the unsent
    data to leave); FDS[name] is it, the listener is kept too (FDS[name + "_listener"])."""
    import socket
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.connect(listener.getsockname())
    sock.setblocking(False)
    queued = 0
    try:
        while True:
            queued += sock.send(b"x" * 65536)
    except BlockingIOError:
        pass
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                    struct.pack("ii", 1, int(cmd.get("seconds", 30))))
    FDS[cmd["name"]] = sock.detach()
    FDS[cmd["name"] + "_listener"] = listener.detach()
    return {"errno": 0, "ret": FDS[cmd["name"]], "queued": queued}


def stack_mounts(cmd):
    """Mount cmd["count"] tmpfs on top of each other at cmd["target"] (in this process's
    own mount namespace): every lookup that crosses that mountpoint, or climbs out of it
    with "..", walks the whole stack."""
    target = cmd["target"].encode()
    for done in range(cmd["count"]):
        if libc.mount(b"adv", target, b"tmpfs", 0, None) < 0:
            return {"errno": ctypes.get_errno(), "mounted": done}
    return {"errno": 0, "mounted": cmd["count"]}


def make_symlinks(cmd):
    """os.symlink(body, path) for each [body, path] of cmd["links"]."""
    try:
        for body, path in cmd["links"]:
            os.symlink(body, path)
    except OSError as exc:
        return {"errno": exc.errno}
    return {"errno": 0}


def close_later(cmd):
    """Close FDS[name] on a thread of its own and return at once (a close that lingers
    holds only that thread)."""
    threading.Thread(target=os.close, args=(FDS.pop(cmd["name"]),), daemon=True).start()
    return {"ret": 0}


CLONE_NEWUSER = 0x10000000


def unshare_user(cmd):
    """Move into a user namespace of its own (the test, root, then writes its maps: one
    with two gids lets its threads differ in fsgid, which no unprivileged process can)."""
    if libc.unshare(CLONE_NEWUSER) < 0:
        return {"errno": ctypes.get_errno()}
    return {"errno": 0}


def do_exec(cmd):
    """execv(argv): the program that follows answers on the same stdin and stdout (an agent
    run again prints its ready line, which is this command's answer)."""
    sys.stdout.flush()
    try:
        os.execv(cmd["argv"][0], cmd["argv"])
    except OSError as exc:
        return {"errno": exc.errno}


EXTRA_OPS = {"race": race, "storm": storm, "lease": take_lease, "close_later": close_later,
             "lingering_socket": lingering_socket, "stack_mounts": stack_mounts,
             "symlinks": make_symlinks, "unshare_user": unshare_user, "exec": do_exec}


def main():
    os.chdir(sys.argv[1] if len(sys.argv) > 1 else "/")
    FDS["share"] = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    print(json.dumps({"ready": True, "pid": os.getpid(), "uid": os.getuid()}), flush=True)
    ops = {"n2h": n2h, "obh": obh, "open": do_open, "whereis": whereis, "hammer": hammer,
           "probe_open": probe_open, "walk": walk, "chmod": do_chmod,
           "mount": do_mount,
           "close": lambda c: (os.close(FDS.pop(c["name"])), {"ret": 0})[1],
           "fdcount": lambda c: {"fds": len(os.listdir("/proc/self/fd"))}}
    ops.update(EXTRA_OPS)
    ops["thread_call"] = lambda c: thread_call(c, ops)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            out = ops[cmd["op"]](cmd)
        except Exception as exc:  # report, keep serving the test
            out = {"error": repr(exc)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
