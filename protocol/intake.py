"""The native intake conversation as one explicit state machine (sans-IO).

A connection to fhmon's intake socket goes through three phases:

    AWAITING_HELLO --HELLO accepted--> REGISTERED --(client closes)--> end
          |                                 |
          +--HELLO refused / bad frame--> CLOSED <--bad frame--+

PING and STATUS are answered in both open phases; HELLO is the only message that may carry
fds, and only in AWAITING_HELLO (a second HELLO on a registered connection is refused with
EALREADY and the connection stays registered). Any other message is refused with EPROTO
before registration and ignored after it (a launcher's connection is never dropped for a
stray frame). A frame that does not decode ends the connection: with an EPROTO refusal
before registration, silently after it. The registration timeout applies only while
AWAITING_HELLO: a registered launcher keeps its connection as long as it lives, and fhmon
learns of its restart (or death) when that connection ends.

Like h11's _state.py, the rules are one table (TRANSITIONS) read by a tiny machine, so that
every phase/message pair has exactly one answer and tests can walk all of them without
sockets. The I/O layer (monitor/intake.py) performs the actions and reports the outcome of
a registration back with `registration_settled`.
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass
from typing import Final

from protocol import intake_wire


class Phase(enum.Enum):
    AWAITING_HELLO = "awaiting hello"  # the registration timeout runs
    REGISTERED = "registered"  # a launcher's connection: kept open, pings and status only
    CLOSED = "closed"  # nothing more is read; the I/O layer closes the socket


class Action(enum.Enum):
    PONG = "pong"  # answer health
    STATUS = "status"  # answer the registered targets
    REGISTER = "register"  # check the registration (the fds ride with it); then settle
    REFUSE = "refuse"  # answer a Refuse (Step.errno, Step.reason); the phase says what next
    IGNORE = "ignore"  # no answer
    CLOSE = "close"  # no answer; the connection ends


@dataclass(frozen=True, slots=True)
class Step:
    """What the I/O layer does for one message: the action, and whether the fds that came
    with it are handed to that action (otherwise they are closed at once)."""

    action: Action
    takes_fds: bool = False
    errno: int = 0
    reason: str = ""


_ALREADY: Final = Step(Action.REFUSE, errno=errno.EALREADY,
                       reason="this connection already registered")

# (phase, message type) -> step; a message type absent for its phase gets UNEXPECTED's step.
TRANSITIONS: Final[dict[tuple[Phase, type[intake_wire.Message]], Step]] = {
    (Phase.AWAITING_HELLO, intake_wire.Ping): Step(Action.PONG),
    (Phase.AWAITING_HELLO, intake_wire.StatusRequest): Step(Action.STATUS),
    (Phase.AWAITING_HELLO, intake_wire.Hello): Step(Action.REGISTER, takes_fds=True),
    (Phase.REGISTERED, intake_wire.Ping): Step(Action.PONG),
    (Phase.REGISTERED, intake_wire.StatusRequest): Step(Action.STATUS),
    (Phase.REGISTERED, intake_wire.Hello): _ALREADY,
}
_EPROTO: Final = errno.EPROTO
UNEXPECTED: Final[dict[Phase, Step]] = {
    Phase.AWAITING_HELLO: Step(Action.REFUSE, errno=_EPROTO, reason="unexpected message"),
    Phase.REGISTERED: Step(Action.IGNORE),
}


class IntakeConversation:
    """One connection's phase; `receive` says what to do with each message in turn."""

    def __init__(self) -> None:
        self.phase = Phase.AWAITING_HELLO
        self._registering = False

    @property
    def timed(self) -> bool:
        """True while the registration timeout applies to this connection."""
        return self.phase is Phase.AWAITING_HELLO

    def receive(self, message: intake_wire.Message) -> Step:
        if self._registering:
            raise RuntimeError("registration_settled() must follow a REGISTER step")
        if self.phase is Phase.CLOSED:
            raise RuntimeError("the conversation is closed")
        step = TRANSITIONS.get((self.phase, type(message)))
        if step is None:
            step = UNEXPECTED[self.phase]
            if step.action is Action.REFUSE:
                return Step(step.action, errno=step.errno,
                            reason=f"{step.reason} {type(message).__name__}")
            return step
        if step.action is Action.REGISTER:
            self._registering = True
        return step

    def registration_settled(self, accepted: bool) -> None:
        """The outcome of the REGISTER step: accepted keeps the connection (REGISTERED),
        refused ends it (the client learns why from the Refuse)."""
        if not self._registering:
            raise RuntimeError("no registration is being settled")
        self._registering = False
        self.phase = Phase.REGISTERED if accepted else Phase.CLOSED

    def protocol_error(self, reason: str) -> Step:
        """A frame that does not decode: the connection ends, after an EPROTO refusal if it
        had not registered (a registered launcher's stream is simply closed)."""
        was = self.phase
        self._registering = False
        self.phase = Phase.CLOSED
        if was is Phase.AWAITING_HELLO:
            return Step(Action.REFUSE, errno=_EPROTO, reason=reason)
        return Step(Action.CLOSE)
