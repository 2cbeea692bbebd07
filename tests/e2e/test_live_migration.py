"""Live migration of a guest between two nodes, each with an unprivileged virtiofsd under its
own fhmon.

Two `fhmon serve` processes with separate sockets but one key directory stand for two nodes;
each serves a virtiofsd 1.13.2 (uid 65534, `fhmon launch`, --inode-file-handles=mandatory) on
the same host directory, and each virtiofsd serves its own QEMU 10 (trixie).  The guest keeps a
file open for reading, one open for appending and its working directory on the share; the
source QEMU is told to `migrate` to the destination (started with -incoming); on the
destination the guest reads on through its open fds and looks up names it never saw before.

* --migration-mode=file-handles: the source sends its handles (made and signed by fhmon A);
  the destination's virtiofsd opens each one through fhmon B, which verifies A's signature
  with the shared key.
* --migration-mode=find-paths with --migration-verify-handles: the destination finds each inode
  by path and compares the handle fhmon B gives it with the one fhmon A gave the source: they
  must be byte-identical, or the migration aborts.
* Negative control: file-handles again, but fhmon B has a key of its own: it must refuse the
  source's handles, and the migration must fail with the guest still running on the source.
* The default of an injected pod: the source runs KubeVirt's own virtiofsd command
  line (`--migration-mode=find-paths`, no handle flags) under the injected launcher (fail
  open, `--virtiofsd-handles=prefer`), so it serves by handle; the destination is a plain
  unprivileged virtiofsd without fhmon (a node or pod fhmon did not reach). The guest's
  files, symlinks included, stay readable. Its negative control: the same with the opt-in
  `--virtiofsd-migration=file-handles` (the injection's former default): the plain
  destination cannot open the handles and the guest loses its files.
"""

from __future__ import annotations

import json

import pytest

from . import harness, migration

pytestmark = pytest.mark.e2e

FILE_HANDLES = ["--migration-mode=file-handles", "--migration-on-error=abort"]
#: What KubeVirt renders for virtiofsd's migration (pkg/virt-controller/services/virtiofs.go).
KUBEVIRT_MIGRATION = ["--migration-mode=find-paths", "--migration-on-error=guest-error"]
#: What the injected launcher gets (monitor/kubevirt/containers.py launcher_command).
INJECTED_LAUNCH = ["--fail-open", "--virtiofsd-handles=prefer"]
FIND_PATHS_VERIFIED = ["--migration-mode=find-paths", "--migration-verify-handles",
                       "--migration-on-error=abort"]
#: Inodes the guest holds when it migrates: held/, held/data.txt, cwd/, cwd/journal.txt; two
#: of them are open files (fds 3 and 4 of the guest's shell).
HELD_INODES = 4
OPEN_FILES = 2
#: fhmon's reason for refusing a handle whose MAC does not verify with any of its keys.
FOREIGN_MAC = "mac_invalid"  # the refusal code of "bad or foreign MAC"


def _run(env: harness.Env, args: list[str], shared_key: bool = True) -> migration.MigrationResult:
    with harness.run_dir(harness.NOBODY) as rd:
        res = migration.run_migration(env, rd, migration_args=args, shared_key=shared_key)
    _report(res)
    return res


def _report(res: migration.MigrationResult) -> None:
    """Shown with -rP: the numbers docs/virtiofsd.md quotes."""
    info = res.migration
    ram = info.get("ram", {})
    print(f"accel={res.accel} qemu={res.qemu_version!r} args={res.migration_args}")
    if res.status == "completed":
        print(f"migration status={res.status} total-time={info.get('total-time')}ms "
              f"downtime={info.get('downtime')}ms setup-time={info.get('setup-time')}ms "
              f"ram transferred={ram.get('transferred')} bytes")
    else:
        print(f"migration status={res.status} error={info.get('error-desc')!r}")
    print(f"timings={json.dumps(res.timings)}")
    for side in (res.source, res.destination):
        calls = {s: side.calls_during_migration(s)
                 for s in ("name_to_handle_at", "open_by_handle_at")}
        shutdown = side.fhmon_shutdown or {}
        print(f"{side.name}: fhmon calls during the migration={calls} "
              f"shutdown counters={shutdown.get('counters')} refusals={shutdown.get('refusals')}")
    if res.guest is not None:
        print(f"guest result={res.guest.result}")


def _assert_completed_with_the_guest_whole(res: migration.MigrationResult,
                                           steps: tuple[str, ...]) -> None:
    """Completed, and every check of the guest (`steps`) passed on the destination."""
    assert res.problems == [], res.summary()
    assert res.status == "completed", res.summary()
    assert (res.source_status_after, res.destination_status) == ("postmigrate", "running"), \
        res.summary()
    assert res.guest is not None and res.guest.workload_passed, res.summary()
    assert tuple(res.guest.steps) == steps, res.summary()
    assert res.guest.failed_steps() == set(), res.summary()
    assert res.journal == migration.JOURNAL_TEXT, res.summary()
    assert res.made_after == migration.MADE_AFTER_TEXT + "\n", res.summary()


def _assert_both_sides_unprivileged_and_clean(res: migration.MigrationResult) -> None:
    """virtiofsd as uid 65534 with no capabilities on both ends, every process exited 0."""
    for side in (res.source, res.destination):
        assert side.virtiofsd_uid.split() == [str(harness.NOBODY)] * 4, res.summary()
        assert side.virtiofsd_capeff == "0000000000000000", res.summary()
        assert (side.qemu_rc, side.virtiofsd_rc, side.fhmon_rc) == (0, 0, 0), res.summary()
        assert side.fhmon_problems == [], res.summary()


def _assert_clean_migration(res: migration.MigrationResult) -> None:
    """Completed, the guest passed every check on the destination, nothing left behind."""
    _assert_completed_with_the_guest_whole(res, migration.GUEST_STEPS)
    _assert_both_sides_unprivileged_and_clean(res)
    for side in (res.source, res.destination):
        shutdown = side.fhmon_shutdown
        assert shutdown is not None and shutdown.get("registrations") == {"accepted": 1}, \
            res.summary()
        assert set(shutdown["counters"]["open_by_handle_at"]) == {"ok"}, res.summary()
    assert res.leftovers == [], res.summary()


def test_migration_with_file_handles(e2e_env: harness.Env) -> None:
    res = _run(e2e_env, FILE_HANDLES)
    _assert_clean_migration(res)
    # The destination rebuilt its inodes from the source's handles, each one opened through
    # fhmon B (which checked fhmon A's MAC with the shared key), and reopened the guest's open
    # files by handle with their flags.
    opened = res.destination.calls_during_migration("open_by_handle_at")
    assert opened >= HELD_INODES + OPEN_FILES, res.summary()


def test_migration_find_paths_verifies_handles(e2e_env: harness.Env) -> None:
    res = _run(e2e_env, FIND_PATHS_VERIFIED)
    _assert_clean_migration(res)
    # The destination made a handle for every migrated inode through fhmon B and virtiofsd
    # compared it with fhmon A's: a single differing byte would have aborted the migration.
    assert res.destination.calls_during_migration("name_to_handle_at") >= HELD_INODES, \
        res.summary()


def test_migration_to_a_node_with_another_key_fails(e2e_env: harness.Env) -> None:
    """Negative control: fhmon B does not share fhmon A's key, so it refuses every handle the
    source sends; the destination cannot load the state and the guest stays on the source."""
    res = _run(e2e_env, FILE_HANDLES, shared_key=False)
    src, dst = res.source, res.destination
    assert res.problems == [], res.summary()
    assert res.status == "failed", res.summary()
    assert res.source_status_after == "running", res.summary()
    assert dst.qemu_rc not in (0, None), res.summary()
    assert "Migration failed" in dst.virtiofsd_log, res.summary()
    assert "Stale file handle" in dst.virtiofsd_log, res.summary()
    assert dst.calls_during_migration("open_by_handle_at") >= 1, res.summary()
    assert dst.counters_after["open_by_handle_at"].get("ESTALE", 0) >= 1, res.summary()
    assert dst.fhmon_shutdown is not None, res.summary()
    assert set(dst.fhmon_shutdown["refusals"]) == {FOREIGN_MAC}, res.summary()
    assert src.fhmon_shutdown is not None and src.fhmon_shutdown["refusals"] == {}, \
        res.summary()
    assert res.journal == "before-migration\n", res.summary()
    assert (src.fhmon_rc, dst.fhmon_rc) == (0, 0), res.summary()
    assert res.leftovers == [], res.summary()


def test_migration_from_fhmon_to_a_plain_virtiofsd_keeps_the_guests_files(
        e2e_env: harness.Env) -> None:
    with harness.run_dir(harness.NOBODY) as rd:
        res = migration.run_migration(
            e2e_env, rd, migration_args=KUBEVIRT_MIGRATION, mode=None,
            launch_options=INJECTED_LAUNCH, destination_plain=True, symlinks=True)
    _report(res)
    src, dst = res.source, res.destination
    _assert_completed_with_the_guest_whole(res, migration.GUEST_STEPS_WITH_SYMLINKS)
    # The source served by handle through fhmon, and still migrated by path.
    assert "--inode-file-handles=prefer" in src.virtiofsd_cmdline.split(), res.summary()
    assert "--migration-mode=find-paths" in src.virtiofsd_cmdline.split(), res.summary()
    assert src.fhmon_shutdown is not None, res.summary()
    assert src.fhmon_shutdown.get("registrations") == {"accepted": 1}, res.summary()
    assert src.fhmon_shutdown["counters"]["open_by_handle_at"].get("ok", 0) >= 1, \
        res.summary()
    # The destination: KubeVirt's command line, no fhmon, no capabilities.
    assert "--inode-file-handles" not in dst.virtiofsd_cmdline, res.summary()
    assert dst.fhmon_shutdown is not None, res.summary()
    assert not dst.fhmon_shutdown.get("registrations"), res.summary()
    assert dst.calls_during_migration("open_by_handle_at") == 0, res.summary()
    _assert_both_sides_unprivileged_and_clean(res)
    assert res.leftovers == [], res.summary()


def test_handle_migration_to_a_plain_virtiofsd_loses_the_guests_files(
        e2e_env: harness.Env) -> None:
    """Negative control of the test above, and why file-handles is opt-in only: the plain
    destination cannot open the source's handles (EPERM without CAP_DAC_READ_SEARCH), and
    under KubeVirt's --migration-on-error=guest-error the migration completes with every
    handle-migrated inode turned into an error for the guest."""
    with harness.run_dir(harness.NOBODY) as rd:
        res = migration.run_migration(
            e2e_env, rd, migration_args=KUBEVIRT_MIGRATION, mode=None,
            launch_options=[*INJECTED_LAUNCH, "--virtiofsd-migration=file-handles"],
            destination_plain=True, symlinks=True)
    _report(res)
    assert res.problems == [], res.summary()
    assert res.status == "completed", res.summary()
    assert "--migration-mode=file-handles" in res.source.virtiofsd_cmdline.split(), \
        res.summary()
    assert "Opening file handle: Operation not permitted" in res.destination.virtiofsd_log, \
        res.summary()
    assert res.guest is not None and not res.guest.workload_passed, res.summary()
    # The files the guest held open and its working directory are gone for it.
    assert {"held_fd_read", "journal_fd_append", "cwd_list"} <= res.guest.failed_steps(), \
        res.summary()
    assert res.leftovers == [], res.summary()
