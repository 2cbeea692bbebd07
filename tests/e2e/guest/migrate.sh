#!/bin/sh
# Guest side of the live migration test (busybox sh), run by /init as "/workload.sh SHARE".
#
# Before the migration it keeps files of the virtio-fs share open in this shell: fd 3 reads
# held/data.txt (its first line already consumed, so the file offset must survive as well) and
# fd 4 appends to journal.txt in the working directory, cwd/.  It then prints "ready" and blocks
# reading the second serial port (ttyS1), so that no virtio-fs request is made while the host
# migrates the VM; the host sends a line there once the destination runs.  Afterwards each
# check prints one "FHMON-E2E-STEP name pass|fail" line (check.sh) and the script ends with
# one "FHMON-E2E-RESULT" line.
# When the host made held/link (-> data.txt) and held/cwd-link (-> ../cwd), the guest looks
# them up before the migration (their inodes migrate with the guest's dentries) and reads
# through them afterwards, first through the migrated inodes, then after a fresh lookup.
share=$1
. /check.sh

fail_early() {
    echo "FHMON-E2E-ERR $1"
    echo "FHMON-E2E-RESULT status=fail failed=$1 passed="
    exit 1
}

# held/data.txt: "fhmon-e2e held N" then "held line 2" ... "held line N" (written by the host).
held_rest() { seq 2 "$1" | sed 's/^/held line /'; }

exec 3< "$share/held/data.txt" || fail_early open-held
read -r _ _ lines <&3 || fail_early read-held
cd "$share/cwd" || fail_early cd
exec 4>> journal.txt || fail_early open-journal
echo before-migration >&4 || fail_early write-journal
links=
if [ -L "$share/held/link" ]; then
    links=1
    [ "$(readlink "$share/held/link")" = data.txt ] || fail_early readlink-before
    [ "$(head -n 1 "$share/held/link")" = "fhmon-e2e held $lines" ] || fail_early link-before
    [ "$(cat "$share/held/cwd-link/sibling.txt")" = "sibling of the journal" ] ||
        fail_early dir-link-before
fi
mknod /tmp/ttyS1 c 4 65 || fail_early mknod
echo "FHMON-E2E-MIG ready lines=$lines uptime=$(cut -d' ' -f1 /proc/uptime)"

read -r -t 600 word < /tmp/ttyS1 || fail_early no-wake-up-line
echo "FHMON-E2E-MIG resumed word=$word uptime=$(cut -d' ' -f1 /proc/uptime)"

# Cached pages came along with the guest's RAM: drop them so that every read below reaches the
# destination's virtiofsd.  fds 3 and 4 keep their inodes alive.
drop_caches() { sync && echo 3 > /proc/sys/vm/drop_caches; }
# The rest of the file through the fd opened on the source, from where the first read stopped.
held_fd_read() { cat <&3 > /tmp/rest && held_rest "$lines" | cmp - /tmp/rest; }
journal_fd_append() {
    echo after-migration >&4 && [ "$(cat journal.txt)" = "$(printf 'before-migration\nafter-migration')" ]
}
# The working directory: a listing, and a file the guest never looked up before the migration.
cwd_list() { [ "$(ls | tr '\n' ' ')" = "journal.txt sibling.txt " ]; }
cwd_read_new_name() { [ "$(cat sibling.txt)" = "sibling of the journal" ]; }
# A directory tree the host created after the migration.
lookup_after_migration() { [ "$(cat ../fresh/deep/file.txt)" = "created on the host after the migration" ]; }
held_path_read() {
    { echo "fhmon-e2e held $lines"; held_rest "$lines"; } | cmp - "$share/held/data.txt"
}
create_after_migration() {
    echo "written by the guest after the migration" > made-after.txt &&
        [ "$(cat made-after.txt)" = "written by the guest after the migration" ]
}
close_fds() { exec 3<&- 4>&-; }
# The symlinks through the inodes that migrated (before drop_caches), and looked up afresh.
symlinks_migrated() {
    [ "$(readlink "$share/held/link")" = data.txt ] &&
        [ "$(head -n 1 "$share/held/link")" = "fhmon-e2e held $lines" ] &&
        [ "$(readlink "$share/held/cwd-link")" = ../cwd ] &&
        [ "$(cat "$share/held/cwd-link/sibling.txt")" = "sibling of the journal" ]
}
symlinks_looked_up() { symlinks_migrated && cmp "$share/held/link" "$share/held/data.txt"; }

steps="drop_caches held_fd_read journal_fd_append cwd_list cwd_read_new_name \
lookup_after_migration held_path_read create_after_migration close_fds"
[ -n "$links" ] && steps="symlinks_migrated $steps symlinks_looked_up"
for step in $steps; do
    check "$step" "$step"
done

status=pass
[ -n "$FAILED" ] && status=fail
cd /
echo "FHMON-E2E-RESULT status=$status passed=${PASSED#,} failed=${FAILED#,}"
