# Sourced by the guest scripts (busybox sh): check NAME CMD... runs CMD, records NAME in
# PASSED or FAILED and prints the "FHMON-E2E-STEP NAME pass|fail" line the host parses (with
# an "FHMON-E2E-ERR" line carrying the start of CMD's output when it fails).
PASSED=""
FAILED=""

check() {
    name=$1
    shift
    if "$@" > /tmp/out 2>&1; then
        PASSED="$PASSED,$name"
        echo "FHMON-E2E-STEP $name pass"
    else
        FAILED="$FAILED,$name"
        echo "FHMON-E2E-STEP $name fail"
        echo "FHMON-E2E-ERR $name $(head -c 300 /tmp/out | tr '\n' ' ')"
    fi
}
