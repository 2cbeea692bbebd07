"""The intake's own bounds, without sockets: a uid's share of unfinished state bytes
(Admission.hold) and the price of a parse in its pace (IntakePace.take with tokens)."""

from __future__ import annotations

import trio
import trio.testing

from monitor.config import Config
from monitor.intake import Admission, IntakePace


def test_a_uid_holds_at_most_its_share_of_unfinished_state_bytes() -> None:
    admission = Admission(Config())
    cap = Admission.PARTIAL_BYTES
    assert admission.hold(65534, cap - 10) is None
    refusal = admission.hold(65534, 11)
    assert refusal is not None and str(cap) in refusal and "65534" in refusal
    assert admission.hold(1000, cap) is None  # every uid has a share of its own
    assert admission.hold(0, Admission.ROOT_PARTIAL_BYTES) is None  # root's is larger
    admission.release(65534, cap - 10)
    assert admission.hold(65534, cap) is None  # released bytes are free again


def test_release_forgets_a_uid_whose_bytes_are_gone() -> None:
    admission = Admission(Config())
    admission.hold(65534, 100)
    admission.release(65534, 100)
    assert admission._partial == {}


def test_a_parse_costs_its_tokens_of_the_pace() -> None:
    """The burst is BURST single tokens or fewer priced ones: after BURST tokens' worth of
    work, the next takes 1/RATE a token."""

    async def spend(tokens: int, count: int) -> float:
        pace = IntakePace()
        start = trio.current_time()
        for _ in range(count):
            await pace.take(65534, tokens)
        return trio.current_time() - start

    async def main() -> None:
        burst, rate = IntakePace.BURST, IntakePace.RATE
        assert await spend(1, burst + 1) < 1e-9
        assert await spend(8, (burst + 1) // 8) < 1e-9
        waited = await spend(8, (burst + 1) // 8 + 10)
        assert abs(waited - 80 / rate) < 16 / rate

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
