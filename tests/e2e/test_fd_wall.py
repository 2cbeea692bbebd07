"""The open-files wall (kubevirt/kubevirt#13589), with a real guest walking a tree.

Without file handles virtiofsd keeps one O_PATH fd for every inode the guest has looked up and
not forgotten; a guest that walks more files than virtiofsd's fd limit allows hits the wall.
virtiofsd 1.13 reserves INTERNAL fds (at least 610 for one thread) and hands the rest of
--rlimit-nofile to the guest (src/passthrough/guest_fd_limit.rs); at the end of them it logs
NO_MORE_FDS once, keeps running, and answers every new inode with ENFILE. The guest sees:
  * `find` and `ls -lR` that list fewer files than exist, with no error at all (READDIRPLUS
    returns the entries it managed to look up; busybox does not report the later ENFILE);
  * a lookup by name of a file the listing left out fails with "Too many open files in system".
Under fhmon (`fhmon launch`, --inode-file-handles=prefer) virtiofsd keeps handles instead of
fds: the same walk, with the same limit, sees every file, and virtiofsd's fd count stays near
its start-up count whatever the size of the tree.

Kept small for CI under TCG: a limit of 1024 fds (414 for the guest) and 600 files; each run
takes 15-25 s. FHMON_TEST_CONFIG (the Python plane) applies through harness.fhmon_service.
"""

from __future__ import annotations

import json

import pytest

from . import harness, walk

pytestmark = pytest.mark.e2e

RLIMIT_NOFILE = 1024
#: virtiofsd 1.13's INTERNAL_FD_RESERVE (609) plus one for its (absent) thread pool.
GUEST_FDS = RLIMIT_NOFILE - 610
FILES = 600
PER_DIR = 200
#: virtiofsd's own fds at start-up are ~16-20 (its socket, epoll, eventfds, the shared dir...).
BOUNDED_FDS = 64

assert FILES > GUEST_FDS + BOUNDED_FDS, "the tree must be larger than the fds left to the guest"


def _report(run: walk.WalkRun) -> None:
    """Shown with -rP."""
    print(f"walk={run.walk}")
    print(f"virtiofsd peak fds={run.watch.peak_fds} at_hold={run.watch.at_hold} "
          f"timings={run.res.timings}")


def test_wall_without_fhmon_guest_loses_files(e2e_env: harness.Env) -> None:
    """Unprivileged virtiofsd as KubeVirt runs it (no handles: 1.13's default "never")."""
    with harness.run_dir(harness.NOBODY) as rd:
        tree = walk.make_tree(rd.share, FILES, per_dir=PER_DIR)
        run = walk.run_walk(e2e_env, rd, tree, uid=harness.NOBODY, mode="never",
                            extra_virtiofsd_args=[f"--rlimit-nofile={RLIMIT_NOFILE}"],
                            hold_seconds=30)
    _report(run)
    res = run.res
    assert run.walk is not None, run.describe()
    assert res.virtiofsd_uid.split() == [str(harness.NOBODY)] * 4, run.describe()
    # virtiofsd spent every fd the guest may have, one per inode, and still holds them at the
    # end of the walk. (The guest cannot see the release file at the wall: its lookup fails
    # too, so it waits 5 s of failed lookups, during which the host samples.)
    assert run.watch.at_hold is not None, "the guest's hold line was never seen: " + run.describe()
    assert GUEST_FDS <= run.watch.at_hold["virtiofsd_fds"] <= RLIMIT_NOFILE, run.describe()
    limit_line = (f"{walk.NO_MORE_FDS} (0 available out of {GUEST_FDS} initially), "
                  "consider increasing the --rlimit-nofile value")
    assert limit_line in res.virtiofsd_stderr, run.describe()
    # The guest's listing is silently short: fewer files than the tree has, no error shown.
    assert not run.passed, run.describe()
    assert GUEST_FDS // 2 < run.number("found") < FILES, run.describe()
    assert run.number("stated") < FILES, run.describe()
    assert (run.number("find_errors"), run.number("ls_errors")) == (0, 0), run.describe()
    # Opening a left-out file by name: ENFILE, "Too many open files in system".
    assert run.walk.get("lookup") == "ENFILE", run.describe()
    assert any("Too many open files in system" in e for e in res.guest_errors), run.describe()
    # virtiofsd did not exit at the wall: it served on and ended when QEMU went away.
    assert (res.qemu_rc, res.virtiofsd_rc) == (0, 0), run.describe()
    assert res.leftovers == [], run.describe()


def test_wall_under_fhmon_guest_sees_every_file(e2e_env: harness.Env) -> None:
    """The same limit and tree under `fhmon launch` with handles preferred."""
    with harness.run_dir(harness.NOBODY) as rd:
        tree = walk.make_tree(rd.share, FILES, per_dir=PER_DIR)
        with harness.fhmon_service(rd) as svc:
            run = walk.run_walk(e2e_env, rd, tree, uid=harness.NOBODY, mode="prefer",
                                wrapper=svc.wrapper(rd.share, harness.NOBODY),
                                extra_virtiofsd_args=[f"--rlimit-nofile={RLIMIT_NOFILE}"],
                                hold_seconds=60,
                                on_hold=lambda _pid: {"fhmon_fds": svc.fd_count()})
            idle = svc.wait_idle()
            fhmon_fds_after = svc.fd_count()
        shutdown = svc.shutdown_event()
    _report(run)
    print(f"fhmon shutdown={json.dumps(shutdown)}")
    res = run.res
    assert run.passed, run.describe()
    assert run.number("found") == FILES and run.number("stated") == FILES, run.describe()
    assert run.walk is not None and run.walk.get("lookup") == "ok", run.describe()
    assert res.guest_errors == [], run.describe()
    assert walk.NO_MORE_FDS not in res.virtiofsd_stderr, run.describe()
    # Bounded: at the end of the walk (the guest still holds every dentry) virtiofsd has about
    # as many fds as at start-up, far fewer than the files the guest looked up.
    assert run.watch.at_hold is not None, "the guest's hold line was never seen: " + run.describe()
    assert run.watch.at_hold["virtiofsd_fds"] <= BOUNDED_FDS, run.describe()
    assert run.watch.peak_fds <= BOUNDED_FDS, run.describe()
    # fhmon made and opened the handles (files and directories), and kept no fd of its own.
    assert shutdown is not None, svc.log_text()[-3000:]
    counters = shutdown["counters"]
    assert counters.get("name_to_handle_at", {}).get("ok", 0) >= FILES + tree.dirs, run.describe()
    assert counters.get("open_by_handle_at", {}).get("ok", 0) > 0, run.describe()
    assert res.virtiofsd_uid.split() == [str(harness.NOBODY)] * 4, run.describe()
    assert res.virtiofsd_capeff == "0000000000000000", run.describe()
    assert (res.qemu_rc, res.virtiofsd_rc, svc.returncode) == (0, 0, 0), run.describe()
    assert idle and fhmon_fds_after == svc.baseline_fds, run.describe()
    assert res.leftovers == [], run.describe()
