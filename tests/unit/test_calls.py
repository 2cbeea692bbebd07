"""The caller-uid check (the registry's outermost middleware) for targets of unprivileged
clients, when fhmon is out of fds."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest

from monitor.handlers.base import CallContext
from monitor.handlers.registry import HandlerRegistry
from monitor.listener import NotificationGone
from protocol import kernel


class Listener:
    def __init__(self) -> None:
        self.answers: list[tuple[int, int]] = []

    def respond(self, notif_id: int, *, val: int = 0, error: int = 0) -> bool:
        self.answers.append((notif_id, error))
        return True


class Thread:
    """A call's thread whose /proc/TID/status cannot be read (raises `error`)."""

    def __init__(self, error: BaseException, listener: Listener) -> None:
        self.error = error
        self.tid = 4242
        self.listener = listener
        self.notif = SimpleNamespace(id=7, nr=303, arch=kernel.AUDIT_ARCH_X86_64)

    @property
    def status(self) -> Any:
        raise self.error


def _answer(error: BaseException) -> list[tuple[int, int]]:
    """The answers the registry gives a call of another client's target (uid 1000)."""
    listener = Listener()
    ctx = CallContext(Thread(error, listener), None, None,  # type: ignore[arg-type]
                      target_id=1, peer_uid=1000)
    HandlerRegistry().dispatch(ctx)
    return listener.answers


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_out_of_fds_reading_the_callers_uid_answers_the_errno(err: int) -> None:
    assert _answer(OSError(err, "x")) == [(7, err)]  # answered, not dropped


def test_a_caller_that_went_away_gets_no_answer() -> None:
    assert _answer(NotificationGone(7)) == []
