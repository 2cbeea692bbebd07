"""End-to-end runs of an unmodified virtiofsd 1.13.2 serving a real Linux guest.

With fhmon (virtiofsd as uid 65534 under `fhmon launch`, fhmon serving as root):
  * run 1: --inode-file-handles=prefer: the whole workload passes, every handle is made and
    opened by fhmon; symlinks get no handle (EOPNOTSUPP) and virtiofsd keeps O_PATH fds for them;
  * run 2: --inode-file-handles=mandatory: everything but symlinks works; creating a symlink
    fails in the guest and symlinks are invisible to it (the host has them).
Without fhmon, framing what fhmon changes:
  * run 3 (negative control): unprivileged virtiofsd with mandatory handles cannot even start,
    because open_by_handle_at answers EPERM without CAP_DAC_READ_SEARCH;
  * run 4 (control): as root, with mandatory handles, the whole workload passes;
  * baseline: unprivileged with prefer starts but silently drops file handles altogether.
Inodes uid 65534 can neither read nor write (guest/perm.sh: chmod 000, execute-only dirs) work
without fhmon and under it (an owner's O_PATH request gets a read-only fd from fhmon).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from . import expect, harness

pytestmark = pytest.mark.e2e

EPERM_LINE = "Failed to open file handle for the root node: Operation not permitted (os error 1)"
DISABLED_LINE = "File handles do not appear safe to use, disabling file handles altogether"
ALL_STEPS = {"create", "append", "readback", "stat", "rename", "hardlink", "symlink", "chmod",
             "unlink", "lsR", "find", "checksum", "dropcache"}


#: fhmon's reason for refusing name_to_handle_at on a symlink: a handle to a symlink can only be
#: opened O_PATH, and an O_PATH fd cannot be installed into another process (SECCOMP_ADDFD).
SYMLINK_REFUSAL = "no handles for this file type"
SYMLINK_REFUSAL_CODE = "file_type_no_handle"  # its code in metrics and the shutdown counts
NOT_SUPPORTED = {"ENOTSUP", "EOPNOTSUPP"}


def _report(res: harness.RunResult) -> None:
    """Shown with -rP: the numbers docs/virtiofsd.md quotes."""
    print(f"accel={res.accel} virtiofsd_uid=[{res.virtiofsd_uid}] capeff={res.virtiofsd_capeff}")
    print(f"timings={res.timings}")
    print(f"result={res.result}")


@dataclass
class FhmonRun:
    """One guest run under fhmon, with what fhmon showed during and after it."""

    res: harness.RunResult
    serve_rc: int | None
    idle_after: bool
    baseline_fds: int
    fds_after: int
    events: list[dict[str, Any]]
    snapshots: list[dict[str, object]]

    @property
    def shutdown(self) -> dict[str, Any]:
        found = [e for e in self.events if e.get("event") == "shutdown"]
        assert found, "fhmon logged no shutdown event"
        return found[-1]

    def describe(self) -> str:
        return (f"{self.res.summary()}\nfhmon serve rc={self.serve_rc} idle={self.idle_after} "
                f"fds {self.baseline_fds}->{self.fds_after}\nshutdown="
                f"{json.dumps([e for e in self.events if e.get('event') == 'shutdown'])}")


def _run_under_fhmon(env: harness.Env, mode: str) -> FhmonRun:
    with harness.run_dir(harness.NOBODY) as rd:
        with harness.fhmon_service(rd) as svc:
            res = harness.run_scenario(env, rd, mode=mode, uid=harness.NOBODY,
                                       wrapper=svc.wrapper(rd.share, harness.NOBODY),
                                       on_tick=svc.snapshot)
            idle = svc.wait_idle()
            fds_after = svc.fd_count()
        run = FhmonRun(res=res, serve_rc=svc.returncode, idle_after=idle,
                       baseline_fds=svc.baseline_fds, fds_after=fds_after, events=svc.events(),
                       snapshots=svc.status_snapshots)
    _report(res)
    print(f"fhmon shutdown={json.dumps(run.shutdown)}")
    print(f"fhmon fds {run.baseline_fds}->{run.fds_after}; status snapshots during the run:")
    for snap in run.snapshots:
        print(f"  {json.dumps({k: snap.get(k) for k in ('t', 'targets', 'fds')})}")
    return run


def _assert_fhmon_did_the_work(run: FhmonRun) -> None:
    """Both syscalls emulated many times, refusals only for symlinks, nothing left behind."""
    res, shutdown = run.res, run.shutdown
    counters: dict[str, dict[str, int]] = shutdown["counters"]
    entries = expect.expected_counts(harness.DEFAULT_DIRS, harness.DEFAULT_FILES)["entries"]
    symlinks = expect.expected_counts(harness.DEFAULT_DIRS, harness.DEFAULT_FILES)["nlinks"]
    n2h, obh = counters.get("name_to_handle_at", {}), counters.get("open_by_handle_at", {})
    assert n2h.get("ok", 0) > entries, run.describe()
    assert obh.get("ok", 0) > entries, run.describe()
    assert set(obh) == {"ok"}, run.describe()
    assert set(n2h) - {"ok"} <= NOT_SUPPORTED, run.describe()
    assert sum(n2h.get(e, 0) for e in NOT_SUPPORTED) >= symlinks, run.describe()
    assert set(shutdown.get("refusals", {})) == {SYMLINK_REFUSAL_CODE}, run.describe()
    assert shutdown.get("registrations") == {"accepted": 1}, run.describe()
    refused = [e for e in run.events if e.get("event") == "call_refused"]
    assert all(e.get("reason") == SYMLINK_REFUSAL for e in refused), run.describe()
    assert not [e for e in run.events if e.get("level") in ("error", "critical")], run.describe()
    # virtiofsd really was unprivileged, and nothing outlived the run.
    assert res.virtiofsd_uid.split() == [str(harness.NOBODY)] * 4, run.describe()
    assert res.virtiofsd_capeff == "0000000000000000", run.describe()
    assert EPERM_LINE not in res.virtiofsd_stderr, run.describe()
    assert (res.qemu_rc, res.virtiofsd_rc) == (0, 0), run.describe()
    assert res.leftovers == [], run.describe()
    assert run.idle_after and run.fds_after == run.baseline_fds, run.describe()
    assert run.serve_rc == 0, run.describe()
    assert any(snap.get("targets") for snap in run.snapshots), "fhmon status never showed virtiofsd"


def test_run1_unprivileged_prefer_under_fhmon_passes(e2e_env: harness.Env) -> None:
    run = _run_under_fhmon(e2e_env, "prefer")
    res = run.res
    assert res.workload_passed, run.describe()
    assert set(res.steps) == ALL_STEPS and res.failed_steps() == set(), run.describe()
    assert res.host_check_passed, run.describe()
    # The only handle-related message: symlinks (EOPNOTSUPP from fhmon) fall back to O_PATH fds.
    handle_lines = [line for line in res.virtiofsd_stderr.splitlines() if "file handle" in line]
    assert handle_lines and all("falling back to O_PATH FDs" in line for line in handle_lines), \
        run.describe()
    _assert_fhmon_did_the_work(run)


def test_run2_unprivileged_mandatory_under_fhmon_all_but_symlinks(e2e_env: harness.Env) -> None:
    run = _run_under_fhmon(e2e_env, "mandatory")
    res = run.res
    assert res.result is not None, run.describe()
    # Exactly the symlink step fails: creating one errors in the guest (virtiofsd's lookup of the
    # new symlink needs a handle, fhmon answers EOPNOTSUPP), although the host gets the symlink.
    assert res.failed_steps() == {"symlink"}, run.describe()
    assert res.guest_errors and all(e.startswith("symlink ") for e in res.guest_errors), \
        run.describe()
    assert res.share_problems == [], run.describe()
    # The guest never sees a symlink: READDIRPLUS drops entries whose lookup fails, so ls -lR,
    # find and the checksums pass, over everything else.
    removed = [line for line in res.manifest_problems
               if line.startswith("-") and not line.startswith("---")]
    added = [line for line in res.manifest_problems
             if line.startswith("+") and not line.startswith("+++")]
    counts = expect.expected_counts(harness.DEFAULT_DIRS, harness.DEFAULT_FILES)
    assert added == [], run.describe()
    assert len(removed) == 2 * counts["nlinks"], run.describe()
    assert all(line.startswith(("-S ./sym/", "-L ./sym/")) for line in removed), run.describe()
    assert all("|symbolic link|" in line for line in removed if line.startswith("-S")), \
        run.describe()
    assert res.count_problems == [
        f"guest entries={counts['entries'] - counts['nlinks']}, want {counts['entries']}",
        f"guest nlinks=0, want {counts['nlinks']}",
    ], run.describe()
    assert "Filesystem does not support file handles" in res.virtiofsd_stderr, run.describe()
    _assert_fhmon_did_the_work(run)


def test_run3_unprivileged_mandatory_without_fhmon_fails_with_eperm(e2e_env: harness.Env) -> None:
    with harness.run_dir(harness.NOBODY) as rd:
        res = harness.run_scenario(e2e_env, rd, mode="mandatory", uid=harness.NOBODY)
    _report(res)
    assert not res.virtiofsd_started, res.summary()
    assert res.virtiofsd_rc not in (0, None), res.summary()
    assert EPERM_LINE in res.virtiofsd_stderr, res.summary()
    assert "Refusing to use (mandatory) file handles" in res.virtiofsd_stderr, res.summary()
    assert res.qemu_argv == [], "QEMU must not have been started"
    assert res.leftovers == [], res.summary()


def test_run4_root_mandatory_without_fhmon_passes(e2e_env: harness.Env) -> None:
    with harness.run_dir(0) as rd:
        res = harness.run_scenario(e2e_env, rd, mode="mandatory", uid=0)
    _report(res)
    assert res.virtiofsd_uid.split()[:2] == ["0", "0"], res.summary()
    assert res.workload_passed, res.summary()
    assert set(res.steps) == ALL_STEPS and res.failed_steps() == set(), res.summary()
    assert res.host_check_passed, res.summary()
    assert "file handle" not in res.virtiofsd_stderr, res.summary()
    assert (res.qemu_rc, res.virtiofsd_rc) == (0, 0), res.summary()
    assert res.leftovers == [], res.summary()


def test_baseline_unprivileged_prefer_without_fhmon_drops_handles(e2e_env: harness.Env) -> None:
    with harness.run_dir(harness.NOBODY) as rd:
        res = harness.run_scenario(e2e_env, rd, mode="prefer", uid=harness.NOBODY)
    _report(res)
    assert res.virtiofsd_uid.split() == [str(harness.NOBODY)] * 4, res.summary()
    assert res.virtiofsd_capeff == "0000000000000000", res.summary()
    assert EPERM_LINE in res.virtiofsd_stderr, res.summary()
    assert DISABLED_LINE in res.virtiofsd_stderr, res.summary()
    assert res.workload_passed and res.host_check_passed, res.summary()
    assert (res.qemu_rc, res.virtiofsd_rc) == (0, 0), res.summary()
    assert res.leftovers == [], res.summary()


# --- inodes the virtiofsd user can neither read nor write (guest/perm.sh) -------------------

PERM_SCRIPT = harness.GUEST / "perm.sh"
PERM_CHECKS = {"chmod_file_000", "chmod_dir_000", "chmod_dir_311", "stat_file_000",
               "stat_dir_000", "stat_dir_311", "stat_file_000_after_drop",
               "stat_dir_000_after_drop", "stat_dir_311_after_drop", "lookup_in_dir_311",
               "chmod_file_back", "chmod_dir_back", "chmod_xdir_back", "read_back"}


def test_perm_control_unprivileged_without_fhmon(e2e_env: harness.Env) -> None:
    """Plain unprivileged virtiofsd (O_PATH fds, no handles) handles mode 000 inodes."""
    with harness.run_dir(harness.NOBODY) as rd:
        res = harness.run_scenario(e2e_env, rd, mode="prefer", uid=harness.NOBODY,
                                   workload=PERM_SCRIPT, check=False)
    _report(res)
    assert set(res.steps) == PERM_CHECKS, res.summary()
    assert res.workload_passed, res.summary()
    assert res.leftovers == [], res.summary()


def test_perm_under_fhmon(e2e_env: harness.Env) -> None:
    """virtiofsd reopens such inodes by handle with O_PATH; fhmon cannot inject O_PATH fds
    (SECCOMP_ADDFD refuses them), and a real open as the target would fail with EACCES. The
    target owns them, so fhmon gives it a read-only fd instead (docs/semantics.md)."""
    with harness.run_dir(harness.NOBODY) as rd:
        with harness.fhmon_service(rd) as svc:
            res = harness.run_scenario(e2e_env, rd, mode="prefer", uid=harness.NOBODY,
                                       wrapper=svc.wrapper(rd.share, harness.NOBODY),
                                       workload=PERM_SCRIPT, check=False)
        shutdown = svc.shutdown_event()
    _report(res)
    print(f"fhmon shutdown={json.dumps(shutdown)}")
    assert set(res.steps) == PERM_CHECKS, res.summary()
    assert (res.qemu_rc, res.virtiofsd_rc, svc.returncode) == (0, 0, 0), res.summary()
    assert res.leftovers == [], res.summary()
    assert res.workload_passed, res.summary()
    assert shutdown is not None and "EACCES" not in shutdown["counters"]["open_by_handle_at"]
