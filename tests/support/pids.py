"""Giving a freed pid (or thread id) to a new task of the test's choosing.

Root sets the number the next task gets through /proc/sys/kernel/ns_last_pid; any task
created anywhere on the machine meanwhile may take it first. While the number is free again
a test simply tries again; once a live task holds it, it will not come back soon, so the
test starts its scenario over with a new number, and a failure names every holder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
SCENARIOS = 5  # how many fresh numbers a test tries before it gives up

T = TypeVar("T")


def holder_of(number: int) -> str | None:
    """Who holds pid or thread id `number` now (/proc answers for thread ids too), or None."""
    try:
        text = Path(f"/proc/{number}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    status = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    return (f"{status.get('Name', '?').strip()} (tgid {status.get('Tgid', '?').strip()}, "
            f"ppid {status.get('PPid', '?').strip()})")


def reuse_number(number: int, make: Callable[[], T], number_of: Callable[[T], int],
                 discard: Callable[[T], None], attempts: int = 200) -> T | str:
    """`make()` until what it made got `number`; each miss is discarded. A str says why not:
    a live task holds the number, or every attempt missed it while it was free."""
    for _ in range(attempts):
        NS_LAST_PID.write_text(str(number - 1))
        made = make()
        if number_of(made) == number:
            return made
        discard(made)
        holder = holder_of(number)
        if holder is not None:
            return f"{number} is held by {holder}"
    return f"{number}: free, yet {attempts} tasks made after setting ns_last_pid missed it"
