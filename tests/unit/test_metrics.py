"""Per-call bookkeeping (CallStats) and what Prometheus reads from it at scrape time."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.metrics import LATENCY_BUCKETS, CallStats
from monitor.prom import Metrics
from monitor.signing import KeyInfo


def exposition(stats: CallStats, keeper: str | None = None) -> str:
    keys = SimpleNamespace(key_ids=(1, 0xABCDEF12),
                           describe=lambda: [KeyInfo(1, False), KeyInfo(0xABCDEF12, True)])
    service = SimpleNamespace(stats=stats, targets={}, keys=keys, key_error=None,
                              config=SimpleNamespace(keeper_socket=keeper))
    return generate_latest(Metrics(service).registry).decode()  # type: ignore[arg-type]


def scrape(stats: CallStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = exposition(stats)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_latency_on_a_bound_counts_in_that_bucket_as_in_prometheus() -> None:
    stats = CallStats()
    for elapsed in (LATENCY_BUCKETS[0], LATENCY_BUCKETS[0] * 1.01, 1.0):
        stats.record("open_by_handle_at", "ok", elapsed)
    got = scrape(stats)
    bucket = "fhmon_call_duration_seconds_bucket"
    labels = (("le", "5e-06"), ("syscall", "open_by_handle_at"))
    assert got[(bucket, labels)] == 1
    assert got[(bucket, (("le", "1e-05"), ("syscall", "open_by_handle_at")))] == 2
    assert got[(bucket, (("le", "0.05"), ("syscall", "open_by_handle_at")))] == 2
    assert got[(bucket, (("le", "+Inf"), ("syscall", "open_by_handle_at")))] == 3
    assert got[("fhmon_call_duration_seconds_count", (("syscall", "open_by_handle_at"),))] == 3
    assert abs(got[("fhmon_call_duration_seconds_sum", (("syscall", "open_by_handle_at"),))]
               - (1.0 + LATENCY_BUCKETS[0] * 2.01)) < 1e-9
    assert got[("fhmon_calls_total", (("result", "ok"), ("syscall", "open_by_handle_at")))] == 3


def test_a_worker_report_adds_counts_samples_and_refusals() -> None:
    stats = CallStats()
    stats.record("name_to_handle_at", "ok", 2e-5)
    worker = CallStats()
    for syscall, result, elapsed in (("name_to_handle_at", "ok", 2e-5),
                                     ("name_to_handle_at", "ok", 2e-5),
                                     ("open_by_handle_at", "ESTALE", 1e-4)):
        worker.record(syscall, result, elapsed)
    worker.refusals["mac_invalid"] += 1
    worker.refusals["a reason no table knows"] += 1  # folded into "other"
    stats.merge(*worker.take())
    assert worker.take() == ({}, {}, {}, {})  # a report starts the worker's counts afresh
    stats.merge({}, {}, {}, {"open_by_handle_at": [1, 2]})  # another layout: ignored
    got = scrape(stats)
    assert got[("fhmon_calls_total", (("result", "ok"), ("syscall", "name_to_handle_at")))] == 3
    assert got[("fhmon_call_duration_seconds_count", (("syscall", "name_to_handle_at"),))] == 3
    assert got[("fhmon_mac_failures_total", ())] == 1
    assert got[("fhmon_confinement_refusals_total", (("reason", "mac_invalid"),))] == 1
    assert got[("fhmon_confinement_refusals_total", (("reason", "other"),))] == 1


def test_the_middleware_counts_answers_errnos_and_calls_whose_caller_went_away() -> None:
    import errno

    import pytest

    from monitor.listener import NotificationGone
    from monitor.metrics import metrics_middleware
    from monitor.plane.target_thread import SyscallError

    stats = CallStats()
    wrap = metrics_middleware(stats)

    def gone(ctx: object) -> None:
        raise NotificationGone(1)

    def refused(ctx: object) -> None:
        raise SyscallError(errno.ESTALE, "bad or foreign MAC")

    for handler, kind in ((gone, NotificationGone), (refused, SyscallError)):
        with pytest.raises(kind):
            wrap("open_by_handle_at", handler)(None)  # type: ignore[arg-type]
    wrap("open_by_handle_at", lambda ctx: None)(None)  # type: ignore[arg-type,return-value]
    assert stats.as_dict() == {"open_by_handle_at": {"ESTALE": 1, "gone": 1, "ok": 1}}


def test_label_values_come_from_fixed_sets() -> None:
    """Whatever syscall number, errno or reason comes in, the labels stay in their sets."""
    from monitor.labels import OTHER, refusal_code

    stats = CallStats()
    for nr in range(500):
        stats.record(str(nr), f"E{nr}", 1e-5)  # as a trapped syscall of a foreign filter
    stats.record("unexpected", "ENOSYS", 1e-5)
    stats.merge({("999", "EWHATEVER"): 3}, {"999": 1.0}, {f"reason {n}": 1 for n in range(50)},
                {"999": [0] * (len(LATENCY_BUCKETS) + 1)})
    assert set(stats.results) == {(OTHER, OTHER), (OTHER, "ENOSYS")}
    assert set(stats.buckets) == set(stats.seconds) == {OTHER}
    assert set(stats.refusals) == {OTHER}
    assert refusal_code("syscall 1234 arch 0xc000003e is not emulated") == "syscall_not_emulated"
    assert refusal_code("object outside the share (other mount)") == "outside_share_mount"
    assert refusal_code("object outside the share") == "outside_share"


def test_build_and_key_info_keeper_counters_and_no_created_series() -> None:
    from monitor import __version__

    got = scrape(CallStats())
    assert got[("fhmon_build_info", (("version", __version__),))] == 1
    assert got[("fhmon_key_info", (("key_id", "00000001"), ("signer", "false")))] == 1
    assert got[("fhmon_key_info", (("key_id", "abcdef12"), ("signer", "true")))] == 1
    assert got[("fhmon_registrations_total", (("outcome", "refused"),))] == 0
    assert not [name for name, _ in got if "keeper" in name]  # no keeper configured
    text = exposition(CallStats(), keeper="/run/fhmon/keeper.sock")
    assert "_created" not in text
    assert 'fhmon_keeper_deposits_total{outcome="failed"} 0.0' in text
    assert "fhmon_keeper_restored_total 0.0" in text
