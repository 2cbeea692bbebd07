"""The shipped seccomp profiles: each is its base with the two handle calls allowed, and
nothing else changed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from monitor.kubevirt import seccomp
from monitor.kubevirt.seccomp import HANDLE_SYSCALLS, ProfileError, with_handle_calls

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "tests" / "data" / "seccomp"
SHIPPED = ROOT / "deploy" / "seccomp"


@pytest.mark.parametrize("shipped, base", sorted(seccomp.SHIPPED.items()))
def test_each_shipped_profile_is_its_base_with_the_handle_calls(shipped: str, base: str) -> None:
    source = seccomp.load(SOURCES / base)
    text = (SHIPPED / shipped).read_text()
    assert text == seccomp.dump(with_handle_calls(source)), "regenerate deploy/seccomp"
    profile = json.loads(text)
    # Only the two calls are decided differently; every other syscall has the same rules.
    before, after = seccomp.decisions(source), seccomp.decisions(profile)
    changed = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    assert changed and changed <= set(HANDLE_SYSCALLS), changed
    for name in HANDLE_SYSCALLS:  # allowed, whatever the capabilities
        assert any(seccomp._unconditional_allow(r) and name in seccomp._names(r)
                   for r in profile["syscalls"]), name
        assert all(r["action"] == seccomp.ALLOW for r in profile["syscalls"]
                   if name in seccomp._names(r)), name
    # Nothing outside the rules: default action, errno, architectures are the base's.
    assert {k: v for k, v in profile.items() if k != "syscalls"} == {
        k: v for k, v in source.items() if k != "syscalls"}


def test_the_bases_refuse_open_by_handle_at_without_the_capability() -> None:
    """Why fhmon ships profiles at all: under each base a container without
    CAP_DAC_READ_SEARCH has no ALLOW for open_by_handle_at."""
    for base in seccomp.SHIPPED.values():
        profile = seccomp.load(SOURCES / base)
        assert not any(seccomp._unconditional_allow(r) and "open_by_handle_at" in
                       seccomp._names(r) for r in profile["syscalls"]), base
        assert with_handle_calls(profile) != profile


def test_kubevirt_profile_is_containers_common_with_userfaultfd() -> None:
    common = seccomp.load(SOURCES / "containers-common-seccomp.json")
    kubevirt = seccomp.load(SOURCES / "kubevirt.json")
    before, after = seccomp.decisions(common), seccomp.decisions(kubevirt)
    assert {n for n in set(before) | set(after) if before.get(n) != after.get(n)} == {
        "userfaultfd"}
    assert after["userfaultfd"] == [json.dumps(
        {"action": "SCMP_ACT_ALLOW", "args": [], "excludes": {}, "includes": {}},
        sort_keys=True)]


def test_derivation_is_idempotent_and_keeps_the_format() -> None:
    for base in seccomp.SHIPPED.values():
        once = with_handle_calls(seccomp.load(SOURCES / base))
        assert with_handle_calls(once) == once
    oci = with_handle_calls({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "open_by_handle_at"], "action": "SCMP_ACT_ERRNO"},
        {"name": "name_to_handle_at", "action": "SCMP_ACT_ERRNO"},
        {"names": ["write"], "action": "SCMP_ACT_ALLOW"}]})
    assert oci["syscalls"] == [
        {"names": ["read"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["write"], "action": "SCMP_ACT_ALLOW"},
        {"names": list(HANDLE_SYSCALLS), "action": "SCMP_ACT_ALLOW"}]


def test_a_conditional_allow_is_replaced_not_kept() -> None:
    """An ALLOW with arguments is narrower than the new rule: it goes, so that the call has
    one decision (libseccomp refuses conflicting rules for one syscall)."""
    base = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["name_to_handle_at"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 4, "value": 0, "op": "SCMP_CMP_EQ"}]}]}
    out = with_handle_calls(copy.deepcopy(base))
    assert out["syscalls"] == [{"names": list(HANDLE_SYSCALLS), "action": "SCMP_ACT_ALLOW"}]


@pytest.mark.parametrize("bad", [None, [], {"syscalls": []}, {"defaultAction": "x"},
                                 {"defaultAction": "x", "syscalls": [1]}])
def test_not_a_profile_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ProfileError):
        with_handle_calls(bad)
