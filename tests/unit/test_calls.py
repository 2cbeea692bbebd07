"""Answerer's uid check for targets of unprivileged clients, when fhmon is out of fds."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest

from monitor.calls import Answerer, PeerCred
from monitor.listener import NotificationGone


class Listener:
    def __init__(self) -> None:
        self.answers: list[tuple[int, int]] = []

    def respond(self, notif_id: int, *, val: int = 0, error: int = 0) -> bool:
        self.answers.append((notif_id, error))
        return True


class Thread:
    """A call's thread whose /proc/TID/status cannot be read (raises `error`)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.tid = 4242
        self.notif = SimpleNamespace(id=7, nr=303)

    @property
    def status(self) -> Any:
        raise self.error


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_out_of_fds_reading_the_callers_uid_answers_the_errno(err: int) -> None:
    listener = Listener()
    target = SimpleNamespace(peer=PeerCred(1, 1000, 1000), listener=listener, target_id=1)
    answerer = Answerer.__new__(Answerer)
    assert not answerer._owned_by_peer(target, Thread(OSError(err, "x")))  # type: ignore[arg-type]
    assert listener.answers == [(7, err)]  # answered, not dropped


def test_a_caller_that_went_away_gets_no_answer() -> None:
    listener = Listener()
    target = SimpleNamespace(peer=PeerCred(1, 1000, 1000), listener=listener, target_id=1)
    answerer = Answerer.__new__(Answerer)
    assert not answerer._owned_by_peer(target, Thread(NotificationGone(7)))  # type: ignore[arg-type]
    assert listener.answers == []
