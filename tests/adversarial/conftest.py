"""The adversarial suite's machinery: the attempt recorder, the bystander, the report.

- `record(category, what, expected, observed)` records one attempt and asserts it at once
  (a failed attempt fails its test). `expected`/`observed` are errnos (0 = success) or text.
- `bystander`: a well-behaved target of the session's fhmon. After every test it must still
  get correct answers, and fhmon's fd count must come back to its baseline (polled: cleanup
  is asynchronous) with RSS within RSS_TOLERANCE_KIB of it (`scenario_guard`, autouse).
- At session end, when the whole suite ran (every test file, nothing deselected, nothing
  left unrun), the report is written to build/security.md (untracked: a test run leaves the
  checkout clean) from the records: the table of every attempt, a summary, and the findings
  (tests marked xfail with a "BUG: ..." reason). `python -m tests.adversarial.publish`
  copies it into docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.adversarial.guard import Baseline, Bystander
from tests.adversarial.recording import (
    REPORT,
    STATE,
    Finding,
    Recorder,
    ours,
    render_report,
    whole_suite_ran,
)
from tests.support import Agent, Service, World


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Recorder:
    item = request.node
    assert isinstance(item, pytest.Item)
    return Recorder(item)


# --- the bystander and the per-scenario guard ------------------------------------------------

@pytest.fixture(scope="module")
def bystander(world: World, fhmon: Service) -> Iterator[Bystander]:
    STATE.world_base = str(world.base)
    agent = Agent(world, "fhmon", world.main, fhmon.socket)
    try:
        yield Bystander(agent)
    finally:
        agent.close()


@pytest.fixture(autouse=True)
def scenario_guard(fhmon: Service, bystander: Bystander) -> Iterator[None]:
    """Before: the bystander works. After: it still does, and fhmon is back to baseline."""
    before = bystander.check()
    assert not before, f"bystander broken before the scenario: {before}"
    baseline = Baseline(fhmon)
    if STATE.first is None:
        STATE.first = (baseline.fds, baseline.rss)
    yield
    problems = bystander.check() + baseline.settle()
    STATE.last = (fhmon.fd_count(), fhmon.rss_kib())
    STATE.scenarios += 1
    assert not problems, "; ".join(problems)


# --- collection bookkeeping and the report ----------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "finding(title, fix): a known hole (with xfail 'BUG: ...') and its remedy")


def pytest_deselected(items: list[pytest.Item]) -> None:
    if any(ours(i.nodeid) for i in items):
        STATE.deselected = True


def pytest_collection_finish(session: pytest.Session) -> None:
    STATE.collected = [i.nodeid for i in session.items if ours(i.nodeid)]
    for item in session.items:
        if not ours(item.nodeid):
            continue
        marker = item.get_closest_marker("finding")
        xfail = item.get_closest_marker("xfail")
        if marker and xfail:
            title, fix = [*map(str, marker.args), "", ""][:2]
            STATE.findings[item.nodeid] = Finding(item.nodeid, title,
                                                  str(xfail.kwargs.get("reason")), fix)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not ours(report.nodeid):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            STATE.outcomes[report.nodeid] = "xfailed" if report.skipped else "xpassed"
        else:
            STATE.outcomes[report.nodeid] = report.outcome
    if report.when == "teardown":
        STATE.finished.add(report.nodeid)
        if report.failed:
            STATE.outcomes[report.nodeid] = "error"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not STATE.attempts or not whole_suite_ran():
        return
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(render_report(time.monotonic() - STATE.started))
