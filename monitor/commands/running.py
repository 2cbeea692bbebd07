"""What the long-running subcommands share: run a trio service until SIGTERM or SIGINT, and
say what went wrong when it fails to start."""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from monitor import log


def run_service(start: Callable[..., Any], *args: Any,
                on_hangup: Callable[[], object] | None = None,
                log_stopping: bool = False,
                before_stop: Callable[[], Awaitable[object]] | None = None) -> None:
    """trio.run `start(*args, task_status=...)` in a nursery until SIGTERM or SIGINT.

    on_hangup: SIGHUP calls it instead of stopping (without it SIGHUP is not caught);
    log_stopping: log a "stopping" event naming the signal before cancelling;
    before_stop: awaited after that, while the service still runs (it bounds its own time).
    """
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if on_hangup else (
        signal.SIGTERM, signal.SIGINT)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(*signals) as sigs:
                await nursery.start(start, *args)
                async for sig in sigs:
                    if sig == signal.SIGHUP and on_hangup is not None:
                        on_hangup()
                        continue
                    if log_stopping:
                        log.event("stopping", signal=signal.Signals(sig).name)
                    if before_stop is not None:
                        await before_stop()
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)


def leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


def report_failure(command: str, exc: BaseException) -> int:
    """A start-up failure: say what and where, one line per real error; exit status 1."""
    for leaf in leaves(exc):
        print(f"fhmon {command}: {leaf}", file=sys.stderr)
    return 1
