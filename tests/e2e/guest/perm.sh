#!/bin/sh
# Guest script for inodes the virtiofsd user can neither read nor write (busybox sh).
#
# Why: a kernel O_PATH open needs no permission on the inode itself, and virtiofsd relies on
# that for GETATTR/SETATTR and for parent directories.  An emulation of O_PATH by a real open
# needs read or write permission, so chmod 000 and execute-only directories are where the two
# can differ.  Each check prints "FHMON-E2E-STEP <name> pass|fail" (same parser as workload.sh).
cd "$1" || { echo "FHMON-E2E-RESULT status=fail failed=cd passed="; exit 1; }
. /check.sh

mode_is() { [ "$(stat -c %a "$1")" = "$2" ]; }

echo data > file
mkdir dir xdir
echo inner > dir/f
echo inner > xdir/f

check chmod_file_000 chmod 000 file
check chmod_dir_000 chmod 000 dir
check chmod_dir_311 chmod 311 xdir
check stat_file_000 mode_is file 0
check stat_dir_000 mode_is dir 0
check stat_dir_311 mode_is xdir 311
sync
echo 3 > /proc/sys/vm/drop_caches
check stat_file_000_after_drop mode_is file 0
check stat_dir_000_after_drop mode_is dir 0
check stat_dir_311_after_drop mode_is xdir 311
check lookup_in_dir_311 stat xdir/f
check chmod_file_back chmod 644 file
check chmod_dir_back chmod 755 dir
check chmod_xdir_back chmod 755 xdir
check read_back sh -c '[ "$(cat file)" = data ] && [ "$(cat dir/f)" = inner ]'

status=pass
[ -n "$FAILED" ] && status=fail
echo "FHMON-E2E-RESULT status=$status passed=${PASSED#,} failed=${FAILED#,}"
