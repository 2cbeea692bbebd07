"""Which FUSE requests of the guest's walk make which handle calls (issue 35, item 3).

One walk (tests/e2e/walk.py's tree and guest/walk.sh) of virtiofsd under fhmon, with a
`stat -f .` (a FUSE STATFS, which neither find nor ls makes) after `find` and after `ls -lR`
to mark the phases. --strace: virtiofsd runs with --log-level debug and is traced by a root
`strace -f -p` from the moment it listens; its debug line "Received request: opcode=X" is a
write(2) on the thread that then serves the request, so every name_to_handle_at and
open_by_handle_at of that thread until its next request line belongs to X. Without --strace
only fhmon's own count (`fhmon status`) and the walk's time are taken, for timing the
settings (--args), which strace would distort.

    python -m bench.fuse_calls --files 10000 --strace
    python -m bench.fuse_calls --files 10000 --rounds 3 \
        --args "--cache=auto" --args "--cache=always"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import harness, walk

MARK = "stat -f . > /dev/null 2>&1"
HANDLE_CALLS = ("name_to_handle_at", "open_by_handle_at")
# strace -f lines: "TID  call(args) = ret" or "TID  call(args <unfinished ...>".
_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_OPCODE = re.compile(r"Received request: opcode=(\w+)")
_HANDLE = re.compile(r"f_handle=(0x[0-9a-f]+|\"[^\"]*\")")


@dataclass
class Phase:
    ops: Counter[str] = field(default_factory=Counter)
    calls: dict[str, Counter[str]] = field(default_factory=dict)   # op -> {n2h, obh: count}
    n2h_handles: Counter[str] = field(default_factory=Counter)       # handle bytes -> n2h calls

    def add_call(self, op: str, call: str) -> None:
        self.calls.setdefault(op, Counter())[call] += 1


def attribute(lines: Iterable[str]) -> list[Phase]:
    """Phases of an strace -f log: [before the first STATFS, between, after the second].

    A handle call belongs to the request its thread logged last; the handle an n2h returns
    (fhmon's signed bytes, the same for the same file) is kept to count repeats."""
    phases = [Phase()]
    current: dict[str, str] = {}
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        tid, call, rest = m.groups()
        if call == "write":
            op = _OPCODE.search(rest)
            if op:
                current[tid] = op.group(1)
                if op.group(1) == "Statfs" and len(phases) < 3:
                    phases.append(Phase())
                else:
                    phases[-1].ops[op.group(1)] += 1
        elif call in HANDLE_CALLS:
            op_name = current.get(tid, "(startup)")
            phases[-1].add_call(op_name, "n2h" if call == "name_to_handle_at" else "obh")
            if call == "name_to_handle_at" and "= 0" in rest:
                h = _HANDLE.search(rest)
                if h:
                    phases[-1].n2h_handles[h.group(1)] += 1
    return phases


def table(phases: list[Phase], names: tuple[str, ...], files: int) -> str:
    """A markdown table: op, requests, n2h, obh per phase, and calls per file."""
    out = ["| phase | FUSE op | requests | n2h | obh |", "|---|---|---:|---:|---:|"]
    for name, ph in zip(names, phases, strict=False):
        for op in sorted(set(ph.ops) | set(ph.calls), key=lambda o: -ph.ops.get(o, 0)):
            c = ph.calls.get(op, Counter())
            out.append(f"| {name} | {op} | {ph.ops.get(op, 0)} | {c['n2h']} | {c['obh']} |")
        n2h = sum(c["n2h"] for c in ph.calls.values())
        obh = sum(c["obh"] for c in ph.calls.values())
        out.append(f"| {name} | **all** | {sum(ph.ops.values())} | {n2h} | {obh} "
                   f"({(n2h + obh) / files:.2f}/file) |")
    return "\n".join(out)


def repeats(phases: list[Phase]) -> dict[str, int]:
    """n2h calls in all, distinct handles, and n2h calls for a handle already returned."""
    total: Counter[str] = Counter()
    for ph in phases:
        total.update(ph.n2h_handles)
    n = sum(total.values())
    return {"n2h_decoded": n, "distinct": len(total), "repeated": n - len(total)}


def walk_script(dest: Path, tree: walk.Tree, hold: int) -> Path:
    """walk.sh with a STATFS after find and after ls -lR."""
    walk.write_walk_script(dest, tree, hold)
    text = dest.read_text()
    for anchor in ("t1=$(now)\n", "t2=$(now)\n"):
        text = text.replace(anchor, f"{anchor}{MARK}\n", 1)
    dest.write_text(text)
    return dest


def one_walk(env: harness.Env, tree_home: Path, tree: walk.Tree, args: list[str],
             trace: bool, mode: str) -> dict[str, Any]:
    with harness.run_dir(harness.NOBODY) as rd, harness.fhmon_service(rd) as svc:
        os.rename(tree_home / "tree", rd.share / "tree")
        try:
            script = walk_script(rd.base / "walk.sh", tree, 10)
            strace_log = rd.base / "strace.log"
            tracer: list[subprocess.Popen[bytes]] = []
            watch = walk.Watch(env=env, rd=rd)
            status: dict[str, Any] = {}

            def ready(_res: harness.RunResult) -> None:
                watch.tick()
                if trace and watch.pid:
                    tracer.append(subprocess.Popen(
                        ["strace", "-f", "-qq", "-s", "300", "-o", str(strace_log),
                         "-e", "trace=" + ",".join((*HANDLE_CALLS, "write")),
                         "-e", "signal=none", "-p", str(watch.pid)]))

            def tick(res: harness.RunResult) -> None:
                watch.tick(res)
                if watch.at_hold is not None and not status:
                    status.update(svc.status())

            extra = [*args, *(["--log-level=debug"] if trace else [])]
            res = harness.run_scenario(
                env, rd, mode=mode, uid=harness.NOBODY,
                wrapper=svc.wrapper(rd.share, harness.NOBODY), extra_virtiofsd_args=extra,
                workload=script, check=False, on_virtiofsd_ready=ready, on_tick=tick,
                tick_seconds=0.5, qemu_timeout=900)
            for p in tracer:
                p.wait(30)
            result = walk.parse_walk_result(res.console) or {}
            # fhmon's own count of the target's handle calls, at the guest's hold (the walk
            # done, virtiofsd still serving): never a silent blank in the table
            targets = status.get("targets") or []
            if len(targets) != 1 or not isinstance(targets[0].get("calls"), int):
                raise RuntimeError(f"fhmon status at the hold: expected one target with its "
                                   f"calls, got {status or 'no status (no hold seen)'}")
            out: dict[str, Any] = {"args": args, "walk": result,
                                   "fhmon_calls_at_hold": targets[0]["calls"]}
            if trace and strace_log.exists():
                with strace_log.open(errors="replace") as f:
                    phases = attribute(f)
                out["table"] = table(phases, ("find", "ls -lR", "rest"), tree.files)
                out["repeats"] = repeats(phases)
            return out
        finally:
            os.rename(rd.share / "tree", tree_home / "tree")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--strace", action="store_true")
    p.add_argument("--mode", default="prefer", help="--inode-file-handles")
    p.add_argument("--args", action="append", default=[],
                   help="one arm's extra virtiofsd arguments (repeatable; default: none)")
    a = p.parse_args(argv)
    env = harness.ensure_env()
    arms = [shlex.split(x) for x in a.args] or [[]]
    home = Path(tempfile.mkdtemp(prefix="fuse-calls-"))
    home.chmod(0o755)
    tree = walk.make_tree(home, a.files)
    tree = walk.Tree(root=home / "tree", files=tree.files, dirs=tree.dirs,
                     last=tree.last, per_dir=tree.per_dir)
    got: dict[str, list[dict[str, Any]]] = {" ".join(x): [] for x in arms}
    for r in range(a.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            run = one_walk(env, home, tree, arm, a.strace, a.mode)
            got[" ".join(arm)].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "table"}), flush=True)
            if "table" in run:
                print(run["table"], flush=True)
    for name, runs in got.items():
        walks = [float(r["walk"].get("walk_s", "nan")) for r in runs]
        calls = [r["fhmon_calls_at_hold"] for r in runs]
        print(f"{name or '(defaults)'}: walk_s median {statistics.median(walks):.2f} {walks}; "
              f"calls/file median {statistics.median(calls) / a.files:.2f} "
              f"{[round(c / a.files, 2) for c in calls]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
