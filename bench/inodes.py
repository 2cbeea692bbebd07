"""The open-files wall, measured: what virtiofsd holds after a guest walks a tree of N files.

    python -m bench.inodes [--files 1000,10000,100000] [--rounds 3] [--per-dir 1000]
                           [--guest-memory 2G] [--json OUT] [--plot PNG] [--markdown MD]
    python -m bench.inodes --from-json A.json [B.json ...] [--json OUT] [--plot PNG] ...
                           (re-renders saved runs, merged: e.g. one big N run apart)

The real guest of tests/e2e (an unmodified virtiofsd 1.13.2 serving a QEMU guest) runs
guest/walk.sh over a tree of N empty files made on the host: `find -type f` (READDIRPLUS: a
LOOKUP of every entry) then `ls -lR` (an lstat of every entry); the guest keeps its dentries,
so virtiofsd still knows every inode when the host samples it (the guest waits for that). Arms,
each with the same virtiofsd command line (--sandbox=none and its default --rlimit-nofile:
min(1,000,000, nr_open), or the hard limit it inherits when it cannot raise it, as in a
container; the report records that limit):

  unprivileged  uid 65534, no capabilities, --inode-file-handles=never: KubeVirt today
  fhmon         uid 65534 under `fhmon launch` (fhmon serve's defaults), prefer
  root          root with CAP_DAC_READ_SEARCH, prefer: the kernel's own handles
  refmon        (only when named in --arms) uid 65534 under `fhmon launch`, prefer, served
                by bench/refmon instead of fhmon: RECV, the kernel's call, HMAC, SEND or
                ADDFD|SEND, no confinement: the floor of a seccomp-notify monitor
  NAME          with --build NAME=FHMON: the fhmon arm served by another build's `fhmon`
                executable (a checkout of the commit before a change: its .venv/bin/fhmon),
                so that two builds' walks are interleaved in one run; `fhmon launch` is
                this checkout's

Recorded per arm, at the end of the walk: virtiofsd's open fds and RSS; the kernel memory
charged to virtiofsd's memory cgroup (v1: memory.kmem.usage_in_bytes of a child of this
process's cgroup, which virtiofsd and its wrapper join before exec: dentries, inodes, files,
page tables...), and what is left of it when the kernel has reclaimed all it can (a limit
written below the usage: MemCgroup.squeeze): what virtiofsd pins; the same computed from its
fds (fds beyond its start-up count times the dentry + ext4_inode_cache + filp object sizes
of /proc/slabinfo: each fd holds a file, a dentry and an inode); the host-wide growth of
those slabs (noisy: the machine's other processes share them); fhmon's own fds, RSS (fhmon
serve and its workers) and kernel memory (its processes moved into a cgroup of their own);
the guest's wall time for the walk (its uptime clock) and QEMU's. The tree is evicted from
the host's caches (memory.force_empty of the cgroup that made it, and of each run's cgroup
after the run) before every run, so every arm starts cold and its lookups are charged to its
own cgroup. Medians over the rounds; the arms' order rotates from round to round.

Wall times under TCG on a shared machine are noisy (the load average is printed and kept):
re-take them on a quiet machine. Fds, RSS and kernel memory do not depend on timing.
Measurements, never assertions (tests/e2e/test_fd_wall.py asserts the wall). Root only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e import harness, walk

ARMS = ("unprivileged", "fhmon", "root")
MODES = {"unprivileged": "never", "fhmon": "prefer", "root": "prefer"}
REFMON_ARM = "refmon"  # an arm only when asked for: bench/refmon behind virtiofsd
SLABS = ("dentry", "ext4_inode_cache", "filp")
MIB = 1024 * 1024
BEGIN = "<!-- inodes:begin -->"
END = "<!-- inodes:end -->"


# ------------------------------------------------------------------------------ measuring

def parse_slabinfo(text: str, names: tuple[str, ...] = SLABS) -> dict[str, tuple[int, int]]:
    """(active objects, object size in bytes) of the named caches in /proc/slabinfo's text."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if (len(fields) > 3 and fields[0] in names and fields[1].isdigit()
                and fields[3].isdigit()):
            out[fields[0]] = (int(fields[1]), int(fields[3]))
    return out


def slabs() -> dict[str, tuple[int, int]]:
    try:
        return parse_slabinfo(Path("/proc/slabinfo").read_text())
    except OSError:
        return {}


def pinned_bytes(o_path_fds: int, sizes: dict[str, tuple[int, int]]) -> int:
    """Kernel memory that o_path_fds O_PATH fds on distinct ext4 inodes keep from reclaim:
    each holds a struct file, which holds a dentry, which holds an inode."""
    return o_path_fds * sum(size for _, size in sizes.values())


def own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory directory (None without a v1 memory hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return where if (where / "memory.kmem.usage_in_bytes").exists() else None
    return None


@dataclass
class MemCgroup:
    """A child memory cgroup (v1) of ours: what its processes allocate is charged to it."""

    path: Path

    def read(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    def kmem(self) -> int:
        return self.read("memory.kmem.usage_in_bytes")

    def usage(self) -> int:
        return self.read("memory.usage_in_bytes")

    def squeeze(self) -> int:
        """Asks the kernel to reclaim all of this cgroup's kernel memory that it can, and
        returns what is left (bytes): what its processes pin.

        A v1 limit written below the usage makes the kernel reclaim (unused dentries and
        inodes, page cache) until the usage fits; when it cannot (the anonymous memory stays:
        no swap), the write fails with EBUSY and the limit is left as it was. Never an OOM
        kill. The limit goes back to unlimited either way.
        """
        limit = self.path / "memory.limit_in_bytes"
        try:
            limit.write_text(str(max(MIB, self.usage() - self.kmem() + MIB)))
        except OSError:
            pass   # EBUSY: reclaimed what it could
        finally:
            limit.write_text("-1")
        return self.kmem()

    def reclaim(self) -> None:
        """Reclaims everything reclaimable (unpinned dentries and inodes, page cache)."""
        (self.path / "memory.force_empty").write_text("0")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def enter_argv(self) -> list[str]:
        """An argv prefix: joins this cgroup, then execs the rest of the command line."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]


@contextlib.contextmanager
def mem_cgroup(name: str) -> Iterator[MemCgroup | None]:
    """A child cgroup for the duration (None, and no cgroup figures, when there is none)."""
    parent = own_memory_cgroup()
    if parent is None:
        yield None
        return
    path = parent / f"fhmon-inodes-{os.getpid()}-{name}"
    path.mkdir()
    cgroup = MemCgroup(path)
    try:
        yield cgroup
    finally:
        for _ in range(50):   # its processes are gone; rmdir may race their exit
            try:
                # Evict what it charged first: a removed cgroup hands its charges to ours,
                # where the next run would find the tree's dentries and inodes warm.
                cgroup.reclaim()
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def descendants(pid: int) -> list[int]:
    """pid and every live descendant (fhmon serve's worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def served(arm: str) -> bool:
    """The arm runs virtiofsd under a monitor: fhmon, another build's (--build), refmon."""
    return arm not in ("unprivileged", "root")


@contextlib.contextmanager
def refmon_service(rd: harness.RunDir) -> Iterator[list[str]]:
    """bench/refmon serving rd.share (two threads a target, as in bench.run); yields the
    wrapper that runs virtiofsd as uid 65534 under it (this checkout's `fhmon launch`)."""
    from bench.procs import ReferenceMonitor, build_refmon

    binary = build_refmon()
    if binary is None:
        raise SystemExit("bench.inodes: the refmon arm needs bench/refmon built (cargo)")
    monitor = ReferenceMonitor(rd.base, REFMON_ARM, binary, rd.share)
    try:
        yield [harness.fhmon_command(), "launch", "--socket", monitor.socket, "--share",
               str(rd.share), "--user", str(harness.NOBODY), "--"]
    finally:
        monitor.stop()


def arm_argv(arm: str, cgroup: MemCgroup | None, fhmon_wrapper: list[str]) -> list[str]:
    """The wrapper that starts virtiofsd for an arm: into its cgroup, then as uid 65534 (plain
    or under fhmon launch) or as root."""
    enter = cgroup.enter_argv() if cgroup else ["sh", "-c", 'exec "$@"', "sh"]
    if arm == "unprivileged":
        nobody = str(harness.NOBODY)
        return [*enter, "setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                "--clear-groups", "--inh-caps=-all", "--"]
    if served(arm):
        return [*enter, *fhmon_wrapper]
    return enter


# ------------------------------------------------------------------------------ one run

def run_arm(env: harness.Env, arm: str, tree_home: Path, tree: walk.Tree,
            tree_cgroup: MemCgroup | None, hold_seconds: int,
            qemu_timeout: float, fhmon: str | None = None) -> dict[str, Any]:
    """One walk of the tree with one arm; the tree is moved into the run's share and back.
    fhmon: the executable that serves a served arm (None: this checkout's)."""
    uid = 0 if arm == "root" else harness.NOBODY
    with contextlib.ExitStack() as stack:
        rd = stack.enter_context(harness.run_dir(uid))
        os.rename(tree_home / "tree", rd.share / "tree")
        stack.callback(os.rename, rd.share / "tree", tree_home / "tree")
        shared = walk.Tree(root=rd.share / "tree", files=tree.files, dirs=tree.dirs,
                           last=tree.last, per_dir=tree.per_dir)
        if tree_cgroup is not None:
            tree_cgroup.reclaim()   # cold: every arm's lookups read the inodes anew
        cgroup = stack.enter_context(mem_cgroup(arm))
        svc = None
        fhmon_cgroup = None
        wrapper: list[str] = []
        if arm == REFMON_ARM:
            wrapper = stack.enter_context(refmon_service(rd))
        elif served(arm):
            # The cgroup first: it is removed after fhmon serve has stopped.
            fhmon_cgroup = stack.enter_context(mem_cgroup("fhmon-serve"))
            svc = stack.enter_context(harness.fhmon_service(rd, fhmon))
            if fhmon_cgroup is not None:
                for pid in descendants(svc.proc.pid):
                    with contextlib.suppress(OSError):
                        fhmon_cgroup.add(pid)
            wrapper = svc.wrapper(rd.share, harness.NOBODY)
        slabs_before = slabs()

        def on_hold(_pid: int) -> dict[str, Any]:
            now = slabs()
            got: dict[str, Any] = {"slab_growth": {
                k: v[0] - slabs_before.get(k, (0, 0))[0] for k, v in now.items()}}
            got["slab_sizes"] = {k: v[1] for k, v in now.items()}
            if cgroup is not None:
                got["cgroup_kmem"] = cgroup.kmem()
                got["cgroup_usage"] = cgroup.usage()
                got["cgroup_kmem_squeezed"] = cgroup.squeeze()
            if svc is not None:
                pids = descendants(svc.proc.pid)
                got["fhmon_fds"] = svc.fd_count()
                got["fhmon_rss_kib"] = sum(walk.rss_kib(p) or 0 for p in pids)
                got["fhmon_processes"] = len(pids)
                if fhmon_cgroup is not None:
                    got["fhmon_kmem"] = fhmon_cgroup.kmem()
            return got

        run = walk.run_walk(env, rd, shared, uid=uid, mode=MODES.get(arm, "prefer"),
                            wrapper=arm_argv(arm, cgroup, wrapper),
                            hold_seconds=hold_seconds, qemu_timeout=qemu_timeout,
                            on_hold=on_hold)
    res = run.res
    hold = run.watch.at_hold
    if hold is not None and run.watch.samples:
        # virtiofsd's fds beyond those it had before the guest looked anything up (its
        # socket, epoll, eventfds, the shared dir...): one O_PATH fd per inode without handles.
        extra = hold["virtiofsd_fds"] - min(fds for fds, _ in run.watch.samples)
        hold["pinned_bytes"] = pinned_bytes(
            max(0, extra), {k: (0, v) for k, v in hold.get("slab_sizes", {}).items()})
    # A walk that hit the wall still counts: its figures (fds at the limit) are the point.
    ok = res.qemu_rc == 0 and run.watch.at_hold is not None and run.walk is not None
    uid_seen = res.virtiofsd_uid.split()[:1]
    return {
        "arm": arm, "files": tree.files, "ok": ok, "accel": res.accel,
        "virtiofsd_uid": uid_seen[0] if uid_seen else None,
        "virtiofsd_capeff": res.virtiofsd_capeff,
        "walk_passed": run.passed, "found": run.number("found"),
        "walk": run.walk, "peak_fds": run.watch.peak_fds, "at_hold": run.watch.at_hold,
        "walk_s": _float((run.walk or {}).get("walk_s")),
        "find_s": _float((run.walk or {}).get("find_s")),
        "ls_s": _float((run.walk or {}).get("ls_s")),
        "vm_s": res.timings.get("qemu_s"),
        "no_more_fds": walk.NO_MORE_FDS in res.virtiofsd_stderr,
        "summary": None if ok else run.describe()[-3000:],
    }


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------ reporting

#: The figures summarized per (files, arm): name -> how to get it from one run.
FIGURES: dict[str, tuple[str, ...]] = {
    "virtiofsd_fds": ("at_hold", "virtiofsd_fds"),
    "virtiofsd_rss_kib": ("at_hold", "virtiofsd_rss_kib"),
    "cgroup_kmem": ("at_hold", "cgroup_kmem"),
    "cgroup_usage": ("at_hold", "cgroup_usage"),
    "cgroup_kmem_squeezed": ("at_hold", "cgroup_kmem_squeezed"),
    "pinned_bytes": ("at_hold", "pinned_bytes"),
    "dentry_growth": ("at_hold", "slab_growth", "dentry"),
    "inode_growth": ("at_hold", "slab_growth", "ext4_inode_cache"),
    "fhmon_fds": ("at_hold", "fhmon_fds"),
    "fhmon_rss_kib": ("at_hold", "fhmon_rss_kib"),
    "fhmon_kmem": ("at_hold", "fhmon_kmem"),
    "walk_s": ("walk_s",),
    "vm_s": ("vm_s",),
}


TIMES = {"walk_s", "vm_s"}


def _dig(run: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    value: Any = run
    for k in keys:
        if not isinstance(value, dict) or k not in value:
            return None
        value = value[k]
    return value if isinstance(value, (int, float)) else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{files: {arm: {figure: median, "runs": n, "failed": n, "walk_ratio": x}}} over the
    runs that were sampled; "walls" counts those whose walk hit the open-files wall (the guest
    saw fewer files: "found"), whose times are left out; walk_ratio is the median walk time
    over root's at that N."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for files in sorted({r["files"] for r in runs}):
        per_arm: dict[str, dict[str, Any]] = {}
        builds = sorted({r["arm"] for r in runs} - set(ARMS))
        for arm in (*ARMS, *builds):
            mine = [r for r in runs if r["files"] == files and r["arm"] == arm]
            if not mine:
                continue
            good = [r for r in mine if r["ok"]]
            walls = [r for r in good if not r.get("walk_passed")]
            entry: dict[str, Any] = {"runs": len(good), "failed": len(mine) - len(good),
                                     "walls": len(walls)}
            for name, keys in FIGURES.items():
                # The time of a walk cut short by the wall is no walk time.
                among = [r for r in good if r.get("walk_passed")] if name in TIMES else good
                values = [v for v in (_dig(r, keys) for r in among) if v is not None]
                entry[name] = statistics.median(values) if values else None
            found = [r["found"] for r in good if isinstance(r.get("found"), int)]
            entry["found"] = statistics.median(found) if found else None
            per_arm[arm] = entry
        root_walk = per_arm.get("root", {}).get("walk_s")
        root_by_round = {r["round"]: r["walk_s"] for r in runs
                         if r["files"] == files and r["arm"] == "root" and r["ok"]
                         and r.get("walk_passed") and r.get("walk_s")}
        for arm, entry in per_arm.items():
            walk_s = entry.get("walk_s")
            entry["walk_ratio"] = (round(walk_s / root_walk, 3)
                                   if walk_s is not None and root_walk else None)
            # The same round's root run is the fairer yardstick under a drifting load.
            ratios = [r["walk_s"] / root_by_round[r["round"]] for r in runs
                      if r["files"] == files and r["arm"] == arm and r["ok"]
                      and r.get("walk_passed") and r.get("walk_s") is not None
                      and r["round"] in root_by_round]
            entry["round_ratios"] = [round(x, 3) for x in ratios]
            entry["median_round_ratio"] = (round(statistics.median(ratios), 3) if ratios
                                           else None)
        out[str(files)] = per_arm
    return out


def _cell(value: float | None, scale: float = 1, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value / scale:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The table that README.md and docs/performance.md show between the inodes markers."""
    lines = [
        "| files | virtiofsd | its fds | its RSS MiB | its kernel memory MiB "
        "| left after reclaim MiB | pinned by its fds MiB (computed) "
        "| fhmon fds / RSS MiB | guest walk s (x root; per round) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for files, per_arm in report["summary"].items():
        for arm, s in per_arm.items():
            kmem = _cell(s["cgroup_kmem"], MIB, 1)
            squeezed = _cell(s["cgroup_kmem_squeezed"], MIB, 1)
            pinned = _cell(s["pinned_bytes"], MIB, 1)
            fhmon = (f"{_cell(s['fhmon_fds'])} / {_cell(s['fhmon_rss_kib'], 1024, 1)}"
                     if s["fhmon_fds"] is not None else "-")
            ratio = f" ({s['walk_ratio']:.2f}x" if s["walk_ratio"] is not None else ""
            if ratio and s.get("median_round_ratio") is not None:
                ratio += f"; {s['median_round_ratio']:.2f}x"
            ratio += ")" if ratio else ""
            failed = f", {s['failed']} failed" if s["failed"] else ""
            if s["walls"]:
                failed += (f", **wall**: the guest saw {_cell(s['found'])} files"
                           if s["walls"] == s["runs"] else f", {s['walls']} walls")
            lines.append(
                f"| {int(files):,} | {arm}{failed} | {_cell(s['virtiofsd_fds'])} "
                f"| {_cell(s['virtiofsd_rss_kib'], 1024, 1)} | {kmem} | {squeezed} | {pinned} "
                f"| {fhmon} | {_cell(s['walk_s'], 1, 2)}{ratio} |")
    load = report.get("loadavg_before", [0])[0], report.get("loadavg_after", [0])[0]
    lines.append("")
    rounds_at: dict[int, int] = {}
    for r in report["runs"]:
        rounds_at[r["files"]] = max(rounds_at.get(r["files"], 0), r["round"] + 1)
    fewer = [f"{n} at {files:,} files" for files, n in sorted(rounds_at.items())
             if n != report["rounds"]]
    rounds = f"{report['rounds']} rounds" + (f" ({', '.join(fewer)})" if fewer else "")
    lines.append(f"Medians of {rounds}, {report['accel'].upper()} guest with "
                 f"{report['guest_memory']} of memory, load average {load[0]:.1f} -> "
                 f"{load[1]:.1f} (a machine shared with other work: wall times are noisy; "
                 "fds, RSS and kernel memory are not).")
    return "\n".join(lines)


def replace_section(text: str, section: str) -> str:
    """text with what lies between the inodes markers replaced by section."""
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise ValueError(f"no {BEGIN} marker")
    _, sep2, tail = rest.partition(END)
    if not sep2:
        raise ValueError(f"no {END} marker")
    return f"{head}{BEGIN}\n{section}\n{END}{tail}"


def plot(report: dict[str, Any], out: Path) -> None:
    """virtiofsd's open fds and its cgroup's kernel memory against N, one line per arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    sizes = [int(n) for n in summary]
    fig, (ax_fds, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    # fhmon and root overlap (both ~20 fds): fhmon drawn wide and dashed beneath root.
    styles = {"unprivileged": ("tab:red", "o", "-", 1.5, 6),
              "fhmon": ("tab:green", "s", "--", 4, 10),
              "root": ("tab:blue", "^", "-", 1.5, 6)}
    labels = {"unprivileged": "unprivileged, no handles (KubeVirt today)",
              "fhmon": "unprivileged under fhmon", "root": "root, kernel handles"}
    for arm in ARMS:
        xs, fds, mem = [], [], []
        for n in sizes:
            s = summary[str(n)].get(arm)
            if s and s["virtiofsd_fds"] is not None:
                xs.append(n)
                fds.append(s["virtiofsd_fds"])
                mem.append((s["cgroup_kmem_squeezed"] or 0) / MIB)
        if not xs:
            continue
        color, marker, line, width, size = styles[arm]
        for ax, ys in ((ax_fds, fds), (ax_mem, mem)):
            ax.plot(xs, ys, marker=marker, color=color, linestyle=line, linewidth=width,
                    markersize=size, label=labels[arm])
    limit = report.get("rlimit_nofile")
    if limit:
        ax_fds.axhline(limit[0], color="gray", linestyle=":", linewidth=1)
        ax_fds.annotate(f"virtiofsd's fd limit here ({limit[0]:,})", (sizes[0], limit[0]),
                        xytext=(0, 4), textcoords="offset points", fontsize=8, color="gray")
    for ax in (ax_fds, ax_mem):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("files the guest walked (N)")
        ax.grid(True, which="both", alpha=0.3)
    ax_fds.set_ylim(bottom=10)
    ax_fds.set_ylabel("virtiofsd open fds at the end of the walk")
    ax_mem.set_ylabel("virtiofsd's kernel memory after reclaim (MiB)")
    ax_fds.legend(fontsize=8)
    ax_fds.set_title("open fds")
    ax_mem.set_title("kernel memory left after reclaim (its memory cgroup)")
    fig.suptitle("virtiofsd 1.13.2 after a guest walks N files")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ main

def make_tree_in(cgroup: MemCgroup | None, home: Path, files: int, per_dir: int) -> walk.Tree:
    """The tree, made by a child process in cgroup (so that its dentries and inodes can be
    reclaimed from there before every run)."""
    code = ("import sys; from pathlib import Path; from tests.e2e import walk; "
            "walk.make_tree(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
    prefix = cgroup.enter_argv() if cgroup else []
    subprocess.run([*prefix, sys.executable, "-c", code, str(home), str(files), str(per_dir)],
                   check=True, cwd=Path(__file__).resolve().parents[1])
    dirs = -(-files // per_dir)
    last = f"tree/d{dirs - 1:05d}/f{files - 1:07d}"
    return walk.Tree(root=home / "tree", files=files, dirs=dirs, last=last, per_dir=per_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", default="1000,10000,100000",
                        help="comma-separated tree sizes N")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per N; each round runs every arm, in a rotated order")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms, from {', '.join((*ARMS, REFMON_ARM))}")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=FHMON",
                        help="one more arm, NAME: the fhmon arm served by this executable")
    parser.add_argument("--per-dir", type=int, default=1000,
                        help="files per directory of the tree")
    parser.add_argument("--guest-memory", default="2G",
                        help="the guest's memory: it must hold N dentries and FUSE inodes")
    parser.add_argument("--hold", type=int, default=120,
                        help="how long the guest waits for the host's sample (s)")
    parser.add_argument("--json", type=Path,
                        help="write the whole report (every run) here")
    parser.add_argument("--from-json", type=Path, nargs="+",
                        help="render these saved reports (merged) instead of running")
    parser.add_argument("--plot", type=Path,
                        help="draw fds and kernel memory against N here (needs matplotlib)")
    parser.add_argument("--markdown", type=Path, action="append", default=[],
                        help="a file whose inodes markers get the table (repeatable)")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = merge_reports([json.loads(p.read_text()) for p in args.from_json])
        return render(saved, args.json, args.plot, args.markdown)
    sizes = [int(n) for n in args.files.split(",") if n]
    builds: dict[str, str] = {}
    for text in args.build:
        name, _, path = text.partition("=")
        if not name or name in (*ARMS, REFMON_ARM) or not os.access(path, os.X_OK):
            parser.error(f"--build {text!r}: expected NAME=PATH of an fhmon executable, "
                         f"NAME not one of {', '.join((*ARMS, REFMON_ARM))}")
        builds[name] = path
    arms = [a for a in args.arms.split(",") if a]
    if set(arms) - set(ARMS) - set(builds) - {REFMON_ARM}:
        parser.error(f"arms from {', '.join((*ARMS, REFMON_ARM, *builds))}")
    harness.GUEST_MEMORY = args.guest_memory
    env = harness.ensure_env()
    accel = harness.accelerator(env)
    report: dict[str, Any] = {
        "accel": accel, "rounds": args.rounds, "per_dir": args.per_dir,
        "guest_memory": args.guest_memory, "virtiofsd": env.virtiofsd_version,
        "kernel": os.uname().release, "cgroup": str(own_memory_cgroup()),
        "rlimit_nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "loadavg_before": os.getloadavg(), "runs": []}
    print(f"inodes: N={sizes}, {args.rounds} rounds of {', '.join(arms)}, accel {accel}, "
          f"load {report['loadavg_before'][0]:.2f}", flush=True)
    parent = Path(os.environ.get("FHMON_E2E_TMP", "/tmp"))
    for files in sizes:
        home = Path(tempfile.mkdtemp(prefix="fhmon-bench-inodes-", dir=parent))
        home.chmod(0o755)
        try:
            with mem_cgroup("tree") as tree_cgroup:
                t0 = time.monotonic()
                tree = make_tree_in(tree_cgroup, home, files, args.per_dir)
                print(f"N={files}: tree made in {time.monotonic() - t0:.1f} s", flush=True)
                for i in range(args.rounds):
                    order = arms[i % len(arms):] + arms[:i % len(arms)]
                    for arm in order:
                        r = run_arm(env, arm, home, tree, tree_cgroup, args.hold,
                                    qemu_timeout=600 + files / 100, fhmon=builds.get(arm))
                        r["round"] = i
                        r["loadavg"] = os.getloadavg()[0]
                        report["runs"].append(r)
                        hold = r["at_hold"] or {}
                        print(f"  N={files} round {i + 1} {arm:12} walk {r['walk_s']} s "
                              f"VM {r['vm_s']} s, fds {hold.get('virtiofsd_fds')}, RSS "
                              f"{hold.get('virtiofsd_rss_kib')} KiB, kmem "
                              f"{hold.get('cgroup_kmem')}, after reclaim "
                              f"{hold.get('cgroup_kmem_squeezed')}, "
                              f"pinned (computed) {hold.get('pinned_bytes')}"
                              f"{'' if r['ok'] else '  FAILED: ' + str(r['summary'])[:600]} "
                              f"(load {r['loadavg']:.2f})", flush=True)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    report["loadavg_after"] = os.getloadavg()
    return render(report, args.json, args.plot, args.markdown)


def render(report: dict[str, Any], json_out: Path | None, plot_out: Path | None,
           markdowns: list[Path]) -> int:
    """Summary, table (printed, and into each markdown file), JSON and plot of a report."""
    report["summary"] = summarize(report["runs"])
    table = markdown(report)
    print(table)
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    if plot_out:
        plot(report, plot_out)
    for md in markdowns:
        md.write_text(replace_section(md.read_text(), table))
    return 0 if all(r["ok"] for r in report["runs"]) else 1


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several runs of the benchmark (their runs side by side; rounds is the
    largest, the load averages span them all)."""
    if not reports:
        raise ValueError("no report to merge")
    merged = {k: v for k, v in reports[0].items() if k not in ("runs", "summary")}
    merged["runs"] = [r for rep in reports for r in rep["runs"]]
    merged["rounds"] = max(rep["rounds"] for rep in reports)
    merged["loadavg_before"] = reports[0]["loadavg_before"]
    merged["loadavg_after"] = reports[-1]["loadavg_after"]
    merged["guest_memory"] = "/".join(dict.fromkeys(rep["guest_memory"] for rep in reports))
    merged["parts"] = [{k: rep.get(k) for k in ("rounds", "guest_memory", "loadavg_before",
                                                  "loadavg_after")} for rep in reports]
    return merged


if __name__ == "__main__":
    raise SystemExit(main())
