"""Benchmark target: calls the handle syscalls in tight loops, driven over stdin/stdout.

    python target.py SHARE

Standard library only (it runs as uid 65534 with the system python, under `fhmon launch`
or directly as root for the kernel baseline). At start it makes a handle for each of the
share's files (name_to_handle_at through fhmon when launched under it), then prints
{"ready": true, "pid": PID, "no_new_privs": 0|1} and obeys one JSON command per stdin line:

  {"cmd": "arm", "op": OP, "calls": N, "threads": T, "cpus": [..]|null,
   "warmup": W, "latencies": true}
      get T threads ready (the same threads as last time if T is unchanged and not
      "fresh": true); each pins itself to `cpus` (null: every CPU), makes W untimed calls,
      then waits; prints {"armed": true} once all T are waiting.
  {"cmd": "go"}
      release the threads: each makes N timed calls; prints {"ns": [per-call ns...] (if
      latencies), "calls": total, "errors": {errno: count}, "start": t0, "end": t1} with
      CLOCK_MONOTONIC seconds, which every process on the machine shares, so runs of
      several targets can be merged.
  {"cmd": "exit"} or end of input: exit 0.

OP is what virtiofsd does: n2h = name_to_handle_at(O_PATH fd, "", AT_EMPTY_PATH) (a
LOOKUP), obh = open_by_handle_at(mount_fd, handle, O_RDONLY|O_CLOEXEC), mix = 1 n2h : 3 obh;
or n2h-path = name_to_handle_at(AT_FDCWD, "fNNN", 0), the form that resolves a path.
"""

import ctypes
import json
import os
import struct
import sys
import threading
import time
from typing import Any

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
N2H, OBH = 303, 304
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Target:
    """The share's handles, and a pool of worker threads kept across runs (like
    virtiofsd's thread pool); "fresh": true in an arm command replaces the threads."""

    def __init__(self, share: str) -> None:
        os.chdir(share)
        self.names = sorted(n for n in os.listdir(".") if n.startswith("f"))[:64]
        self.mount_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        self.path_fds = [os.open(name, os.O_PATH | os.O_CLOEXEC) for name in self.names]
        self.handles = []
        mnt = ctypes.c_int()
        for name in self.names:
            buf = ctypes.create_string_buffer(8 + 128)
            struct.pack_into("<Ii", buf, 0, 128, 0)
            if libc.syscall(N2H, AT_FDCWD, name.encode(), buf, ctypes.byref(mnt), 0) != 0:
                raise SystemExit(f"name_to_handle_at({name}): errno {ctypes.get_errno()}")
            self.handles.append(buf)
        self.lock = threading.Lock()
        self.workers: list[threading.Thread] = []
        self.start = threading.Barrier(1)
        self.cmd: dict[str, Any] | None = None
        self.armed = threading.Barrier(1)
        self.go = threading.Barrier(1)
        self.done = threading.Barrier(1)
        self.results: list[tuple[list[int], dict[int, int], int]] = []

    def _stop_pool(self) -> None:
        if self.workers:
            self.cmd = None
            self.start.wait()
            for w in self.workers:
                w.join()
            self.workers = []

    def arm(self, cmd: dict[str, Any]) -> None:
        threads = int(cmd["threads"])
        if len(self.workers) != threads or cmd.get("fresh"):
            self._stop_pool()
            self.start = threading.Barrier(threads + 1)
            self.workers = [threading.Thread(target=self.worker, args=(k * 7,), daemon=True)
                            for k in range(threads)]
            for w in self.workers:
                w.start()
        self.cmd = cmd
        self.armed = threading.Barrier(threads + 1)
        self.go = threading.Barrier(threads + 1)
        self.done = threading.Barrier(threads + 1)
        self.results = []
        self.start.wait()
        self.armed.wait()
        emit({"armed": True})

    def worker(self, seed: int) -> None:
        hbuf = ctypes.create_string_buffer(8 + 128)
        mnt = ctypes.c_int()
        mnt_ref = ctypes.byref(mnt)
        names = [n.encode() for n in self.names]
        path_fds = self.path_fds
        handles = self.handles
        mount_fd = self.mount_fd
        flags = os.O_RDONLY | os.O_CLOEXEC
        syscall = libc.syscall
        close = os.close
        pack_into = struct.pack_into
        perf = time.perf_counter_ns
        n = len(names)
        while True:
            self.start.wait()
            cmd = self.cmd
            if cmd is None:
                return
            op = cmd["op"]
            calls = int(cmd["calls"])
            cpus = cmd.get("cpus")
            os.sched_setaffinity(0, cpus if cpus else range(os.cpu_count() or 1))
            errs: dict[int, int] = {}

            def one(i: int, op: str = op, errs: dict[int, int] = errs) -> int:
                j = (i + seed) % n
                if op == "n2h" or (op == "mix" and i % 4 == 0):
                    pack_into("<I", hbuf, 0, 128)
                    t0 = perf()
                    r = syscall(N2H, path_fds[j], b"", hbuf, mnt_ref, AT_EMPTY_PATH)
                    t1 = perf()
                elif op == "n2h-path":
                    pack_into("<I", hbuf, 0, 128)
                    t0 = perf()
                    r = syscall(N2H, AT_FDCWD, names[j], hbuf, mnt_ref, 0)
                    t1 = perf()
                else:
                    t0 = perf()
                    r = syscall(OBH, mount_fd, handles[j], flags)
                    t1 = perf()
                    if r >= 0:
                        close(r)
                if r < 0:
                    e = ctypes.get_errno()
                    errs[e] = errs.get(e, 0) + 1
                return t1 - t0

            for i in range(int(cmd.get("warmup", 0))):
                one(i)
            errs.clear()
            self.armed.wait()
            self.go.wait()
            if cmd.get("latencies", True):
                lat = [one(i) for i in range(calls)]
            else:
                lat = []
                for i in range(calls):
                    one(i)
            with self.lock:
                self.results.append((lat, errs, calls))
            self.done.wait()

    def run(self) -> None:
        t0 = time.monotonic()
        self.go.wait()
        self.done.wait()
        t1 = time.monotonic()
        errors: dict[str, int] = {}
        ns: list[int] = []
        total = 0
        for lat, errs, calls in self.results:
            ns.extend(lat)
            total += calls
            for k, v in errs.items():
                errors[str(k)] = errors.get(str(k), 0) + v
        emit({"ns": ns, "calls": total, "errors": errors, "start": t0, "end": t1})


def no_new_privs() -> int:
    """The process's own no_new_privs, so that the bench knows what it measured."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("NoNewPrivs:"):
                return int(line.split()[1])
    return -1


def main() -> None:
    target = Target(sys.argv[1])
    emit({"ready": True, "pid": os.getpid(), "no_new_privs": no_new_privs()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "arm":
            target.arm(cmd)
        elif cmd["cmd"] == "go":
            target.run()
        elif cmd["cmd"] == "exit":
            break


if __name__ == "__main__":
    main()
