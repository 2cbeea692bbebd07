"""The caller-uid check (the registry's outermost middleware) for targets of unprivileged
clients, when fhmon is out of fds; and the audit lines of the refusals only the Python
plane gives (the native one leaves these calls to it), byte for byte."""

from __future__ import annotations

import errno
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from monitor.handlers.base import CallContext
from monitor.handlers.registry import HandlerRegistry
from monitor.listener import NotificationGone
from monitor.metrics import CallStats
from monitor.plane.audit import audit_middleware
from protocol import kernel


class Listener:
    def __init__(self) -> None:
        self.answers: list[tuple[int, int]] = []

    def respond(self, notif_id: int, *, val: int = 0, error: int = 0) -> bool:
        self.answers.append((notif_id, error))
        return True

    def id_valid(self, notif_id: int) -> bool:
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


class Caller(Thread):
    """A call's thread of uid 1001 (its status read fine)."""

    def __init__(self, listener: Listener, nr: int) -> None:
        super().__init__(RuntimeError("unused"), listener)
        self.notif = SimpleNamespace(id=7, nr=nr, arch=kernel.AUDIT_ARCH_X86_64)

    @property
    def status(self) -> Any:
        return SimpleNamespace(uid=1001, tgid=4241)


def _audited(caplog: pytest.LogCaptureFixture, nr: int, peer_uid: int
             ) -> tuple[list[tuple[int, int]], list[dict[str, Any]], CallStats]:
    listener, stats = Listener(), CallStats()
    share = SimpleNamespace(facts=SimpleNamespace(host_path="/srv/share"))
    ctx = CallContext(Caller(listener, nr), share, None,  # type: ignore[arg-type]
                      target_id=1, peer_uid=peer_uid)
    with caplog.at_level(logging.INFO, logger="fhmon.audit"):
        HandlerRegistry([audit_middleware(stats)]).dispatch(ctx)
    lines = [r.fields for r in caplog.records if r.name == "fhmon.audit"]  # type: ignore[attr-defined]
    return listener.answers, lines, stats


def test_another_uids_call_is_audited_without_a_code(caplog: pytest.LogCaptureFixture) -> None:
    answers, lines, stats = _audited(caplog, kernel.SYS_NAME_TO_HANDLE_AT, peer_uid=1000)
    assert answers == [(7, errno.EPERM)]
    assert [list(line.items()) for line in lines] == [[
        ("event", "call_refused"), ("audit", True), ("syscall", "name_to_handle_at"),
        ("errno", "EPERM"), ("reason", "caller uid 1001 is not the registering client's uid 1000"),
        ("tid", 4242), ("target", 1)]]
    assert not stats.refusals


def test_a_syscall_fhmon_does_not_emulate_is_audited(caplog: pytest.LogCaptureFixture) -> None:
    answers, lines, stats = _audited(caplog, 999, peer_uid=0)
    assert answers == [(7, errno.ENOSYS)]
    assert [list(line.items()) for line in lines] == [[
        ("event", "call_refused"), ("audit", True), ("syscall", "unexpected"), ("errno", "ENOSYS"),
        ("reason", "syscall 999 arch 0xc000003e is not emulated"),
        ("code", "syscall_not_emulated"), ("tid", 4242), ("tgid", 4241),
        ("share", "/srv/share"), ("target", 1)]]
    assert stats.refusals == {"syscall_not_emulated": 1}
