"""monitor/log.py's Throttle: a key writes `burst` lines at once, then `rate` a second; what
it holds back is counted and handed over once."""

from __future__ import annotations

import json
import logging

import pytest

from monitor import log


def test_burst_then_rate_then_the_count() -> None:
    throttle = log.Throttle(rate=2.0, burst=3)
    admitted = [throttle.admit("k", 0.0) for _ in range(10)]
    assert admitted == [True] * 3 + [False] * 7
    assert throttle.due() == {"k": 7} and throttle.due() == {}
    assert throttle.admit("k", 0.5) is True   # one token back after 1/rate s
    assert throttle.admit("k", 0.5) is False
    assert throttle.admit("k", 100.0) is True  # refilled, but never beyond the burst
    assert [throttle.admit("k", 100.0) for _ in range(3)] == [True, True, False]
    assert throttle.due() == {"k": 2}


def test_keys_are_throttled_apart() -> None:
    throttle = log.Throttle(rate=1.0, burst=1)
    assert throttle.admit((65534, "a"), 0.0) and throttle.admit((65534, "b"), 0.0)
    assert throttle.admit((1000, "a"), 0.0)
    assert not throttle.admit((65534, "a"), 0.0)
    assert throttle.due() == {(65534, "a"): 1}


def test_the_table_stays_bounded_whatever_the_keys() -> None:
    throttle = log.Throttle(rate=1.0, burst=1, max_keys=16)
    for i in range(10_000):
        throttle.admit(i, 0.0)
        throttle.admit(i, 0.0)  # held: owed in due(), so never forgotten as stale
    assert len(throttle._tokens) <= 16
    assert sum(throttle.due().values()) == 10_000


def test_flush_writes_one_summary_line_per_key(caplog: pytest.LogCaptureFixture) -> None:
    throttle = log.Throttle(rate=1.0, burst=1)
    for _ in range(5):
        throttle.admit((65534, "too many"), 0.0)
    with caplog.at_level(logging.WARNING, logger="fhmon.events"):
        log.flush_throttled(throttle, "connection_dropped", logging.WARNING,
                            lambda key: {"peer_uid": key[0], "reason": key[1]})
        log.flush_throttled(throttle, "connection_dropped", logging.WARNING,
                            lambda key: {"peer_uid": key[0], "reason": key[1]})
    (record,) = caplog.records
    line = json.loads(log.JsonFormatter().format(record))
    assert line["event"] == "connection_dropped" and line["summary"] is True
    assert (line["count"], line["peer_uid"], line["reason"]) == (4, 65534, "too many")
