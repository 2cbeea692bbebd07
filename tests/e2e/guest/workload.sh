#!/bin/sh
# Guest workload of the fhmon e2e tests (busybox sh), run by /init on the virtiofs mount.
#
# Why this shape: every FUSE operation that makes virtiofsd call name_to_handle_at or
# open_by_handle_at is exercised (LOOKUP, CREATE, OPEN, MKDIR, RENAME, LINK, SYMLINK, READLINK,
# SETATTR, UNLINK, RMDIR, READDIR), then the guest drops its caches so every inode is looked up
# and opened again.  The expected end state is modelled in tests/e2e/expect.py: keep both in step.
#
# Output on the console (one line each, parsed by tests/e2e/harness.py):
#   FHMON-E2E-STEP <name> <pass|fail> errors=<n> seconds=<s>
#   FHMON-E2E-ERR <step> <detail>             (at most 5 per step)
#   FHMON-E2E-M <manifest line>              (after drop_caches: one per entry, see step_manifest)
#   FHMON-E2E-RESULT status=<pass|fail> passed=<a,b> failed=<c,d> key=value...
# Parameters from the kernel command line: e2e_dirs=N (>= 4), e2e_files=N (>= 16).

ROOT=$1
DIRS=8
FILES=24
for arg in $(cat /proc/cmdline); do
    case $arg in
        e2e_dirs=*) DIRS=${arg#e2e_dirs=} ;;
        e2e_files=*) FILES=${arg#e2e_files=} ;;
    esac
done
cd "$ROOT" || { echo "FHMON-E2E-RESULT status=fail failed=cd passed="; exit 1; }

PASSED=""
FAILED=""
ERRS=0
STEP=""

now() { cut -d' ' -f1 /proc/uptime; }

err() {
    ERRS=$((ERRS + 1))
    [ $ERRS -le 5 ] && echo "FHMON-E2E-ERR $STEP $*"
}

# run_step NAME: runs step_NAME, records pass/fail and its duration.
run_step() {
    STEP=$1
    ERRS=0
    t0=$(now)
    "step_$1"
    t1=$(now)
    secs=$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")
    if [ $ERRS -eq 0 ]; then
        PASSED="$PASSED,$1"
        echo "FHMON-E2E-STEP $1 pass errors=0 seconds=$secs"
    else
        FAILED="$FAILED,$1"
        echo "FHMON-E2E-STEP $1 fail errors=$ERRS seconds=$secs"
    fi
}

# gen REL D F: the initial contents of a data file (a line count that varies with D and F).
gen() {
    n=$(( ($2 * 7 + $3 * 3) % 13 + 1 ))
    i=1
    while [ $i -le $n ]; do
        echo "fhmon-e2e $1 line $i"
        i=$((i + 1))
    done
}

# expect_file PATH: compare PATH with /tmp/exp (contents and length).
expect_file() {
    cmp -s /tmp/exp "$1" || err "content mismatch: $1"
}

# expect_stat PATH FORMAT VALUE
expect_stat() {
    got=$(stat -c "$2" "$1" 2>&1)
    [ "$got" = "$3" ] || err "stat $2 $1: got '$got' want '$3'"
}

big_line() { echo "fhmon-e2e big $1 0123456789abcdefghijklmnopqrstuvwxyz"; }
big_size() { echo $(( 131072 * ($1 + 1) )); }

step_create() {
    mkdir data big links sym tree || err "mkdir top-level"
    d=0
    while [ $d -lt $DIRS ]; do
        mkdir "data/d$d" "data/d$d/sub" || err "mkdir data/d$d"
        f=0
        while [ $f -lt $FILES ]; do
            gen "data/d$d/f$f" $d $f > "data/d$d/f$f" || err "write data/d$d/f$f"
            f=$((f + 1))
        done
        s=0
        while [ $s -lt 4 ]; do
            gen "data/d$d/sub/s$s" $d $((s + 100)) > "data/d$d/sub/s$s" || err "write sub s$s"
            s=$((s + 1))
        done
        d=$((d + 1))
    done
    for b in 0 1; do
        yes "$(big_line $b)" | head -c "$(big_size $b)" > "big/b$b" || err "write big/b$b"
    done
}

step_append() {
    d=0
    while [ $d -lt $DIRS ]; do
        f=0
        while [ $f -lt $FILES ]; do
            echo "append data/d$d/f$f" >> "data/d$d/f$f" || err "append data/d$d/f$f"
            f=$((f + 1))
        done
        d=$((d + 1))
    done
}

step_readback() {
    d=0
    while [ $d -lt $DIRS ]; do
        f=0
        while [ $f -lt $FILES ]; do
            { gen "data/d$d/f$f" $d $f; echo "append data/d$d/f$f"; } > /tmp/exp
            expect_file "data/d$d/f$f"
            f=$((f + 1))
        done
        s=0
        while [ $s -lt 4 ]; do
            gen "data/d$d/sub/s$s" $d $((s + 100)) > /tmp/exp
            expect_file "data/d$d/sub/s$s"
            s=$((s + 1))
        done
        d=$((d + 1))
    done
    for b in 0 1; do
        yes "$(big_line $b)" | head -c "$(big_size $b)" > /tmp/exp
        expect_file "big/b$b"
    done
}

step_stat() {
    d=0
    while [ $d -lt $DIRS ]; do
        expect_stat "data/d$d" '%F %a %h' "directory 755 3"
        f=0
        while [ $f -lt $FILES ]; do
            { gen "data/d$d/f$f" $d $f; echo "append data/d$d/f$f"; } > /tmp/exp
            expect_stat "data/d$d/f$f" '%F %a %h %s' "regular file 644 1 $(stat -c %s /tmp/exp)"
            f=$((f + 1))
        done
        d=$((d + 1))
    done
    expect_stat big/b1 '%s' "$(big_size 1)"
}

step_rename() {
    d=0
    while [ $d -lt $DIRS ]; do
        next=$(( (d + 1) % DIRS ))
        mv "data/d$d/f0" "data/d$d/g0" || err "rename within data/d$d/f0"
        mv "data/d$d/f1" "data/d$d/g1" || err "rename within data/d$d/f1"
        mv "data/d$d/f2" "data/d$next/x$d" || err "rename across data/d$d/f2"
        mv "data/d$d/f3" "data/d$d/f4" || err "rename over data/d$d/f4"
        if [ $((d % 2)) -eq 0 ]; then
            mv "data/d$d/sub" "data/d$d/sub_r" || err "rename dir data/d$d/sub"
        fi
        d=$((d + 1))
    done
    mv data/d1/sub data/d0/moved || err "rename dir across data/d1/sub"
    d=0
    while [ $d -lt $DIRS ]; do
        next=$(( (d + 1) % DIRS ))
        for old in f0 f1 f2 f3; do
            [ -e "data/d$d/$old" ] && err "still there: data/d$d/$old"
        done
        { gen "data/d$d/f0" $d 0; echo "append data/d$d/f0"; } > /tmp/exp
        expect_file "data/d$d/g0"
        { gen "data/d$d/f2" $d 2; echo "append data/d$d/f2"; } > /tmp/exp
        expect_file "data/d$next/x$d"
        { gen "data/d$d/f3" $d 3; echo "append data/d$d/f3"; } > /tmp/exp
        expect_file "data/d$d/f4"
        d=$((d + 1))
    done
    gen data/d1/sub/s2 1 102 > /tmp/exp
    expect_file data/d0/moved/s2
    [ -e data/d1/sub ] && err "still there: data/d1/sub"
}

step_hardlink() {
    d=0
    while [ $d -lt $DIRS ]; do
        ln "data/d$d/f5" "links/h$d" || err "link links/h$d"
        ln "data/d$d/f5" "data/d$d/f5.b" || err "link data/d$d/f5.b"
        expect_stat "links/h$d" '%h' 3
        echo "via link $d" >> "links/h$d" || err "append via links/h$d"
        { gen "data/d$d/f5" $d 5; echo "append data/d$d/f5"; echo "via link $d"; } > /tmp/exp
        expect_file "data/d$d/f5"
        expect_file "data/d$d/f5.b"
        rm "data/d$d/f5.b" || err "unlink data/d$d/f5.b"
        expect_stat "data/d$d/f5" '%h' 2
        expect_stat "links/h$d" '%h' 2
        d=$((d + 1))
    done
}

step_symlink() {
    d=0
    while [ $d -lt $DIRS ]; do
        ln -s "../data/d$d/f6" "sym/l$d" || err "symlink sym/l$d"
        got=$(readlink "sym/l$d")
        [ "$got" = "../data/d$d/f6" ] || err "readlink sym/l$d: '$got'"
        { gen "data/d$d/f6" $d 6; echo "append data/d$d/f6"; } > /tmp/exp
        expect_file "sym/l$d"
        d=$((d + 1))
    done
    ln -s does-not-exist sym/dangling || err "symlink sym/dangling"
    [ -L sym/dangling ] || err "not a symlink: sym/dangling"
    [ -e sym/dangling ] && err "dangling symlink resolves"
    ln -s ../data/d0 sym/dir0 || err "symlink sym/dir0"
    [ -f sym/dir0/f7 ] || err "sym/dir0/f7 not reachable"
    ln -s /etc/passwd sym/abs || err "symlink sym/abs"
    [ "$(readlink sym/abs)" = /etc/passwd ] || err "readlink sym/abs"
}

step_chmod() {
    d=0
    while [ $d -lt $DIRS ]; do
        chmod 600 "data/d$d/f7" || err "chmod data/d$d/f7"
        chmod 755 "data/d$d/f8" || err "chmod data/d$d/f8"
        chmod 444 "data/d$d/f9" || err "chmod data/d$d/f9"
        expect_stat "data/d$d/f7" '%a' 600
        expect_stat "data/d$d/f8" '%a' 755
        expect_stat "data/d$d/f9" '%a' 444
        d=$((d + 1))
    done
    chmod 700 "data/d$((DIRS - 1))" || err "chmod dir"
    chmod 750 "data/d$((DIRS - 2))" || err "chmod dir"
    expect_stat "data/d$((DIRS - 1))" '%a' 700
    expect_stat "data/d$((DIRS - 2))" '%a' 750
}

step_unlink() {
    d=0
    while [ $d -lt $DIRS ]; do
        rm "data/d$d/f10" "data/d$d/f11" || err "unlink in data/d$d"
        [ -e "data/d$d/f10" ] && err "still there: data/d$d/f10"
        d=$((d + 1))
    done
    i=0
    while [ $i -lt 10 ]; do
        mkdir -p "tree/a$i/b" || err "mkdir tree/a$i/b"
        echo "tree a$i" > "tree/a$i/b/file" || err "write tree/a$i/b/file"
        i=$((i + 1))
    done
    i=0
    while [ $i -lt 10 ]; do
        if [ $((i % 2)) -eq 0 ]; then
            rm -r "tree/a$i" || err "rm -r tree/a$i"
        else
            rm "tree/a$i/b/file" || err "unlink tree/a$i/b/file"
            rmdir "tree/a$i/b" || err "rmdir tree/a$i/b"
        fi
        i=$((i + 1))
    done
    [ -e tree/a0 ] && err "still there: tree/a0"
    rmdir data/d0 2>/dev/null && err "rmdir of a non-empty directory succeeded"
    [ -d data/d0 ] || err "data/d0 vanished"
}

step_lsR() {
    ls -lR . > /tmp/lsR 2> /tmp/lsR.err || err "ls -lR exit status $?"
    [ -s /tmp/lsR.err ] && err "ls -lR: $(head -n 3 /tmp/lsR.err | tr '\n' ' ')"
    LSR_LINES=$(wc -l < /tmp/lsR)
}

step_find() {
    find . > /tmp/find 2> /tmp/find.err || err "find exit status $?"
    [ -s /tmp/find.err ] && err "find: $(head -n 3 /tmp/find.err | tr '\n' ' ')"
    ENTRIES=$(wc -l < /tmp/find)
    NFILES=$(find . -type f | wc -l)
    NDIRS=$(find . -type d | wc -l)
    NLINKS=$(find . -type l | wc -l)
}

# manifest OUT: everything the host compares, sorted and batched (forks are slow under TCG):
#   "S path|type|mode|nlink|size" for every entry, "H sha256  path" for every regular file,
#   "L path|target" for every symlink.
manifest() {
    find . 2>/dev/null | sort > /tmp/m.all
    find . -type f 2>/dev/null | sort > /tmp/m.files
    find . -type l 2>/dev/null | sort > /tmp/m.links
    {
        xargs stat -c 'S %n|%F|%a|%h|%s' < /tmp/m.all
        xargs sha256sum < /tmp/m.files | sed 's/^/H /'
        while read -r p; do echo "L $p|$(readlink "$p")"; done < /tmp/m.links
    } > "$1" 2>&1
}

step_checksum() {
    manifest /tmp/manifest1
    [ -s /tmp/manifest1 ] || err "empty manifest"
}

step_dropcache() {
    sync
    echo 3 > /proc/sys/vm/drop_caches || err "drop_caches"
    manifest /tmp/manifest2
    if ! cmp -s /tmp/manifest1 /tmp/manifest2; then
        err "manifest changed after drop_caches: $(diff /tmp/manifest1 /tmp/manifest2 | head -n 4 | tr '\n' ' ')"
    fi
    ls -lR . > /dev/null 2> /tmp/lsR2.err || err "ls -lR after drop_caches"
    [ -s /tmp/lsR2.err ] && err "ls -lR after drop_caches: $(head -n 3 /tmp/lsR2.err | tr '\n' ' ')"
}

T0=$(now)
LSR_LINES=0
ENTRIES=0
NFILES=0
NDIRS=0
NLINKS=0
for s in create append readback stat rename hardlink symlink chmod unlink lsR find checksum dropcache; do
    run_step $s
done
T1=$(now)
sed 's/^/FHMON-E2E-M /' /tmp/manifest2
status=pass
[ -n "$FAILED" ] && status=fail
echo "FHMON-E2E-RESULT status=$status passed=${PASSED#,} failed=${FAILED#,} dirs=$DIRS files=$FILES" \
     "entries=$ENTRIES nfiles=$NFILES ndirs=$NDIRS nlinks=$NLINKS lsr_lines=$LSR_LINES" \
     "workload_s=$(awk "BEGIN{printf \"%.2f\", $T1 - $T0}") start_uptime=$T0"
