"""Benchmark target: calls the handle syscalls in a tight loop and records each latency.

    python target.py SHARE OP CALLS THREADS   (OP: n2h | obh | mix)

Standard library only (runs as uid 65534 with the system python). Prints one JSON line:
{"ns": [...per-call latencies...], "errors": {errno: count}, "wall": seconds}.
"""

import ctypes
import json
import os
import struct
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
N2H, OBH = 303, 304


def main() -> None:
    share, op, calls, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.chdir(share)
    names = sorted(n for n in os.listdir(".") if n.startswith("f"))[:64]
    mount_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    handles = []
    for name in names:
        buf = ctypes.create_string_buffer(8 + 128)
        struct.pack_into("<Ii", buf, 0, 128, 0)
        mnt = ctypes.c_int()
        if libc.syscall(N2H, -100, name.encode(), buf, ctypes.byref(mnt), 0) != 0:
            raise SystemExit(f"name_to_handle_at({name}): errno {ctypes.get_errno()}")
        handles.append(buf)
    results: list[list[int]] = []
    errors: dict[int, int] = {}
    lock = threading.Lock()
    start_barrier = threading.Barrier(threads)

    def worker(seed: int) -> None:
        lat = []
        errs: dict[int, int] = {}
        hbuf = ctypes.create_string_buffer(8 + 128)
        mnt = ctypes.c_int()
        paths = [n.encode() for n in names]
        perf = time.perf_counter_ns
        syscall = libc.syscall
        start_barrier.wait()
        for i in range(calls):
            j = (i + seed) % len(names)
            do_n2h = op == "n2h" or (op == "mix" and i % 4 == 0)
            if do_n2h:
                struct.pack_into("<I", hbuf, 0, 128)
                t0 = perf()
                r = syscall(N2H, -100, paths[j], hbuf, ctypes.byref(mnt), 0)
                t1 = perf()
            else:
                t0 = perf()
                r = syscall(OBH, mount_fd, handles[j], os.O_RDONLY | os.O_CLOEXEC)
                t1 = perf()
                if r >= 0:
                    os.close(r)
            lat.append(t1 - t0)
            if r < 0:
                e = ctypes.get_errno()
                errs[e] = errs.get(e, 0) + 1
        with lock:
            results.append(lat)
            for k, v in errs.items():
                errors[k] = errors.get(k, 0) + v

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(k * 7,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    print(json.dumps({"ns": [x for lat in results for x in lat], "errors": errors,
                      "wall": wall}))


if __name__ == "__main__":
    main()
