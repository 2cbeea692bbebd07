"""The intake conversation's state machine, walked exhaustively without sockets."""

from __future__ import annotations

import errno
import typing

import pytest

from protocol import intake_wire
from protocol.intake import TRANSITIONS, Action, IntakeConversation, Phase, Step

EXAMPLES: dict[type[intake_wire.Message], intake_wire.Message] = {
    intake_wire.Hello: intake_wire.Hello(target_pid=42, share="/srv/share"),
    intake_wire.Accept: intake_wire.Accept(1, b"\0" * 32, "ok"),
    intake_wire.Refuse: intake_wire.Refuse(errno.EPERM, "no"),
    intake_wire.Ping: intake_wire.Ping(),
    intake_wire.Pong: intake_wire.Pong("{}"),
    intake_wire.StatusRequest: intake_wire.StatusRequest(),
    intake_wire.StatusReply: intake_wire.StatusReply("{}"),
}


def test_examples_cover_every_message_type() -> None:
    assert set(EXAMPLES) == set(typing.get_args(intake_wire.Message))


def in_phase(phase: Phase) -> IntakeConversation:
    conversation = IntakeConversation()
    if phase is not Phase.AWAITING_HELLO:
        assert conversation.receive(EXAMPLES[intake_wire.Hello]).action is Action.REGISTER
        conversation.registration_settled(accepted=phase is Phase.REGISTERED)
    assert conversation.phase is phase
    return conversation


@pytest.mark.parametrize("phase", [Phase.AWAITING_HELLO, Phase.REGISTERED])
@pytest.mark.parametrize("kind", list(EXAMPLES))
def test_every_message_in_every_open_phase_has_one_answer(phase: Phase,
                                                          kind: type[intake_wire.Message]) -> None:
    conversation = in_phase(phase)
    step = conversation.receive(EXAMPLES[kind])
    expected = TRANSITIONS.get((phase, kind))
    if expected is not None:
        assert step == expected
    elif phase is Phase.AWAITING_HELLO:  # before registration: refused, connection kept
        assert (step.action, step.errno) == (Action.REFUSE, errno.EPROTO)
        assert kind.__name__ in step.reason
    else:  # a registered launcher's connection is never dropped for a stray frame
        assert step == Step(Action.IGNORE)
    assert step.takes_fds == (kind is intake_wire.Hello and phase is Phase.AWAITING_HELLO)
    if step.action is Action.REGISTER:  # only a registration (or a bad frame) moves it
        conversation.registration_settled(accepted=True)
        assert conversation.phase is Phase.REGISTERED
    else:
        assert conversation.phase is phase


def test_pings_and_status_are_answered_before_and_after_registration() -> None:
    for phase in (Phase.AWAITING_HELLO, Phase.REGISTERED):
        conversation = in_phase(phase)
        assert conversation.receive(intake_wire.Ping()).action is Action.PONG
        assert conversation.receive(intake_wire.StatusRequest()).action is Action.STATUS


def test_an_accepted_hello_registers_and_ends_the_timeout() -> None:
    conversation = IntakeConversation()
    assert conversation.timed
    step = conversation.receive(EXAMPLES[intake_wire.Hello])
    assert step.action is Action.REGISTER and step.takes_fds
    conversation.registration_settled(accepted=True)
    assert conversation.phase is Phase.REGISTERED and not conversation.timed
    again = conversation.receive(EXAMPLES[intake_wire.Hello])
    assert (again.action, again.errno, again.takes_fds) == (Action.REFUSE, errno.EALREADY,
                                                            False)
    assert conversation.phase is Phase.REGISTERED


def test_a_refused_hello_closes_the_conversation() -> None:
    conversation = in_phase(Phase.CLOSED)
    with pytest.raises(RuntimeError, match="closed"):
        conversation.receive(intake_wire.Ping())


def test_a_registration_must_be_settled_before_the_next_message() -> None:
    conversation = IntakeConversation()
    conversation.receive(EXAMPLES[intake_wire.Hello])
    with pytest.raises(RuntimeError, match="registration_settled"):
        conversation.receive(intake_wire.Ping())
    with pytest.raises(RuntimeError, match="no registration"):
        IntakeConversation().registration_settled(accepted=True)


def test_a_bad_frame_is_refused_before_registration_and_closes_silently_after() -> None:
    before = IntakeConversation()
    step = before.protocol_error("bad magic")
    assert (step.action, step.errno, step.reason) == (Action.REFUSE, errno.EPROTO, "bad magic")
    assert before.phase is Phase.CLOSED
    after = in_phase(Phase.REGISTERED)
    assert after.protocol_error("bad magic") == Step(Action.CLOSE)
    assert after.phase is Phase.CLOSED
