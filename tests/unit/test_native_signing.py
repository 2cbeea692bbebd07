"""monitor._native.KeyRing (Rust) against monitor.signing.KeyRing (Python): the same bytes.

A handle signed by one implementation must verify under the other, byte for byte, so that
handles survive a switch of data plane, a restart and a migration between nodes running
different implementations.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import _native, signing
from protocol import signed_handle as sh
from tests.support.native_hooks import require_test_hooks

KEYS = st.dictionaries(st.integers(0, 2**32 - 1), st.binary(min_size=32, max_size=80),
                       min_size=1, max_size=4)
SHARE = st.binary(min_size=32, max_size=32)
TYPES = st.integers(-(2**31), 2**31 - 1)
KERNEL = st.binary(min_size=1, max_size=sh.MAX_KERNEL_HANDLE_SIZE)


def _rings(keys: dict[int, bytes], pick: int) -> tuple[signing.KeyRing, _native.KeyRing]:
    signer = sorted(keys)[pick % len(keys)]
    return signing.KeyRing(keys, signer), _native.KeyRing(keys, signer)


@settings(max_examples=300, deadline=None)
@given(KEYS, st.integers(0, 3), SHARE, TYPES, KERNEL)
def test_both_sign_the_same_bytes_and_verify_each_other(
        keys: dict[int, bytes], pick: int, share: bytes, handle_type: int,
        kernel_bytes: bytes) -> None:
    python, rust = _rings(keys, pick)
    signed = python.sign(share, handle_type, kernel_bytes)
    assert rust.sign(share, handle_type, kernel_bytes) == signed
    assert rust.verify(share, handle_type, signed) == kernel_bytes
    assert python.verify(share, handle_type, rust.sign(share, handle_type, kernel_bytes)) \
        == kernel_bytes


@settings(max_examples=300, deadline=None)
@given(KEYS, st.integers(0, 3), SHARE, TYPES, KERNEL, st.integers(0, 127), st.integers(1, 255))
def test_both_refuse_the_same_tampering(
        keys: dict[int, bytes], pick: int, share: bytes, handle_type: int,
        kernel_bytes: bytes, where: int, flip: int) -> None:
    python, rust = _rings(keys, pick)
    signed = bytearray(python.sign(share, handle_type, kernel_bytes))
    signed[where % len(signed)] ^= flip
    assert rust.verify(share, handle_type, bytes(signed)) is None
    assert python.verify(share, handle_type, bytes(signed)) is None


@settings(max_examples=300, deadline=None)
@given(KEYS, SHARE, TYPES, st.binary(max_size=128))
def test_arbitrary_bytes_get_the_same_verdict(keys: dict[int, bytes], share: bytes,
                                              handle_type: int, f_handle: bytes) -> None:
    python, rust = _rings(keys, 0)
    assert rust.verify(share, handle_type, f_handle) == python.verify(share, handle_type,
                                                                        f_handle)


def test_other_share_type_or_retired_key_refused() -> None:
    old, new = b"\x01" * 32, b"\x02" * 32
    both = _native.KeyRing({1: old, 2: new}, 2)
    share, other = bytes(32), bytes(range(32))
    signed_by_old = signing.KeyRing({1: old}, 1).sign(share, 1, b"k" * 12)
    assert both.verify(share, 1, signed_by_old) == b"k" * 12
    assert both.verify(other, 1, signed_by_old) is None
    assert both.verify(share, 2, signed_by_old) is None
    assert _native.KeyRing({2: new}, 2).verify(share, 1, signed_by_old) is None


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="fewer than 32 bytes"):
        _native.KeyRing({1: b"short"}, 1)
    with pytest.raises(ValueError, match="not among the keys"):
        _native.KeyRing({1: bytes(32)}, 2)
    ring = _native.KeyRing({1: bytes(32)}, 1)
    with pytest.raises(ValueError, match="share id must be 32 bytes"):
        ring.sign(b"x", 1, b"k")
    with pytest.raises(ValueError, match="too large"):
        ring.sign(bytes(32), 1, bytes(sh.MAX_KERNEL_HANDLE_SIZE + 1))
    assert ring.signer == 1 and ring.key_ids == [1]


def test_cost_measures_a_sign_and_a_verify_that_work() -> None:
    """bench/levers.py reports KeyRing.cost (a test hook) as the plane's per-call signing
    cost: it must time real operations (cost() refuses to report when its own verify fails)."""
    require_test_hooks()
    ring = _native.KeyRing({1: bytes(32)}, 1)
    with pytest.raises(ValueError, match="at least 1"):
        ring.cost(0)
    sign_us, verify_us = ring.cost(1000)
    assert 0 < sign_us < 1000 and 0 < verify_us < 1000
