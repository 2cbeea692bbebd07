#!/bin/sh
# Guest side of the open-files wall (tests/e2e/test_fd_wall.py, bench/inodes.py), busybox sh.
#
# Walks tree/ on the virtiofs mount twice: `find -type f` (READDIRPLUS: virtiofsd looks up every
# entry) and `ls -lR` (an lstat of every entry), as a metadata-heavy guest would. The guest keeps
# its dentries, so virtiofsd keeps every inode it looked up: without file handles, one O_PATH fd
# each. Then it says FHMON-E2E-HOLD and waits (up to WALK_HOLD seconds) for the host to create
# .fhmon-release, so that the host can sample virtiofsd at the end of the walk.
# Then it stats files the listing left out (or WALK_LAST) by name.
# The host puts WALK_FILES=<files in the tree>, WALK_LAST=<path>, WALK_PER_DIR=<n> and WALK_HOLD=<seconds> after
# the first line (tests/e2e/walk.py).
#
# Output (parsed by tests/e2e/walk.py):
#   FHMON-E2E-ERR <step> <first error lines>
#   FHMON-E2E-HOLD
#   FHMON-E2E-RESULT status=<pass|fail> found=<n> stated=<n> find_errors=<n> ls_errors=<n>
#                    lookup=<ok|ENFILE|EMFILE|ENOENT|other> enfile=<n> emfile=<n> find_s=<s> ls_s=<s> walk_s=<s>

ROOT=$1
cd "$ROOT" || { echo "FHMON-E2E-RESULT status=fail failed=cd passed="; exit 1; }
now() { cut -d' ' -f1 /proc/uptime; }
secs() { awk "BEGIN{printf \"%.2f\", $2 - $1}"; }

t0=$(now)
find tree -type f 2>/tmp/find.err > /tmp/found
found=$(wc -l < /tmp/found)
t1=$(now)
stated=$(ls -lR tree 2>/tmp/ls.err | grep -c '^-')
t2=$(now)
# Files the listing left out (up to 3; else the last file), looked up by name as a guest
# program would open them: tree/dNNNNN/fNNNNNNN, WALK_PER_DIR files to a directory.
awk -v n="$WALK_FILES" -v per="$WALK_PER_DIR" -v last="$WALK_LAST" '
    NR == FNR { seen[$0] = 1; next }
    END {
        shown = 0
        for (i = 0; i < n && shown < 3; i++) {
            p = sprintf("tree/d%05d/f%07d", int(i / per), i)
            if (!(p in seen)) { print p; shown++ }
        }
        if (shown == 0) print last
    }' /tmp/found /dev/null > /tmp/probe
lookup=ok
for f in $(cat /tmp/probe); do
    if ! out=$(stat -c %s "$f" 2>&1); then
        case $out in
            *"Too many open files in system"*) lookup=ENFILE ;;
            *"Too many open files"*) lookup=EMFILE ;;
            *"No such file"*) lookup=ENOENT ;;
            *) lookup=other ;;
        esac
        echo "FHMON-E2E-ERR lookup $out"
    fi
done
find_errors=$(wc -l < /tmp/find.err)
ls_errors=$(wc -l < /tmp/ls.err)
cat /tmp/find.err /tmp/ls.err > /tmp/all.err
enfile=$(grep -c "Too many open files in system" /tmp/all.err)
emfile=$(grep -v "in system" /tmp/all.err | grep -c "Too many open files")
[ "$find_errors" -gt 0 ] && echo "FHMON-E2E-ERR find $(head -n 3 /tmp/find.err | tr '\n' '|')"
[ "$ls_errors" -gt 0 ] && echo "FHMON-E2E-ERR ls $(head -n 3 /tmp/ls.err | tr '\n' '|')"

echo "FHMON-E2E-HOLD"
# A lookup that fails otherwise than ENOENT (ENFILE at the wall) cannot see the release file:
# then wait 5 s only (the host samples within a second of the hold line).
i=0
refused=0
while [ $i -lt $((WALK_HOLD * 5)) ] && [ $refused -lt 25 ]; do
    out=$(stat -c %i .fhmon-release 2>&1) && break
    case $out in *"No such file"*) ;; *) refused=$((refused + 1)) ;; esac
    sleep 0.2
    i=$((i + 1))
done

status=fail
if [ "$found" = "$WALK_FILES" ] && [ "$stated" = "$WALK_FILES" ] &&
   [ "$find_errors" = 0 ] && [ "$ls_errors" = 0 ] && [ "$lookup" = ok ]; then
    status=pass
fi
echo "FHMON-E2E-RESULT status=$status found=$found stated=$stated find_errors=$find_errors" \
     "ls_errors=$ls_errors lookup=$lookup enfile=$enfile emfile=$emfile find_s=$(secs "$t0" "$t1")" \
     "ls_s=$(secs "$t1" "$t2") walk_s=$(secs "$t0" "$t2")"
