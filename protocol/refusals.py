"""Every call refusal fhmon gives a reason for, as protocol/refusals.toml lists it: the one
table both data planes read (native/build.rs compiles the same file into the Rust plane).

A refusal's reason is its audit line's text and its code the metric label: the Python
plane raises them from here (monitor/policy.py, monitor/handlers/), never as literals.
"""

from __future__ import annotations

import errno as errnos
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

TABLE_PATH: Final = Path(__file__).with_name("refusals.toml")
_CODE = re.compile(r"[a-z][a-z0-9_]*")
_KEYS = frozenset({"code", "errno", "reason", "part", "counted", "strerror",
                   "strerror_otherwise"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal: what the call returns (errno), why (reason, a template whose `{name}`
    parts are described in `parts`), and its fixed identifier (code)."""

    code: str
    errno: int
    errno_name: str  # as the table spells it (EOPNOTSUPP, which errno.errorcode calls ENOTSUP)
    reason: str
    parts: Mapping[str, str]
    # False: audited without a code, and not counted in fhmon_confinement_refusals_total
    counted: bool
    # for a {strerror} part: the errnos whose own text it names, and the text of any other
    strerror_texts: Mapping[int, str]
    strerror_otherwise: str

    @property
    def prefix(self) -> str:
        """The reason's constant beginning, which tells it from every other refusal's."""
        return self.reason.split("{", 1)[0]

    def text(self, **parts: object) -> str:
        """The reason with its variable parts filled in (exactly the ones it has)."""
        if set(parts) != set(self.parts):
            raise TypeError(f"{self.code} takes the parts {sorted(self.parts)}, "
                            f"not {sorted(parts)}")
        return self.reason.format(**parts) if parts else self.reason

    def strerror(self, err: int) -> str:
        """What a {strerror} part says of this errno: its text if the table names it, else
        the text of `strerror_otherwise` (so no reason carries an unforeseen errno)."""
        return self.strerror_texts.get(err, self.strerror_otherwise)


def _placeholders(reason: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(reason) if name is not None]


def _errno(name: Any, where: str) -> int:
    value = getattr(errnos, name, None) if isinstance(name, str) else None
    if not isinstance(value, int) or not name.startswith("E"):
        raise ValueError(f"{TABLE_PATH.name}: {where}: {name!r} is not an errno name")
    return value


def _entry(raw: dict[str, Any], texts: Mapping[str, str]) -> Refusal:
    where = f"refusal {raw.get('code')!r}"
    unknown = set(raw) - _KEYS
    if unknown or not {"code", "errno", "reason"} <= set(raw):
        raise ValueError(f"{TABLE_PATH.name}: {where}: keys {sorted(raw)}")
    code, reason = raw["code"], raw["reason"]
    if not isinstance(code, str) or not _CODE.fullmatch(code) or not isinstance(reason, str):
        raise ValueError(f"{TABLE_PATH.name}: {where}: bad code or reason")
    parts = dict(raw.get("part", {}))
    if sorted(_placeholders(reason)) != sorted(parts):
        raise ValueError(f"{TABLE_PATH.name}: {where}: the parts of {reason!r} must each "
                         f"have one part.name description, not {sorted(parts)}")
    strerror_texts: dict[int, str] = {}
    otherwise = ""
    if "strerror" in parts:
        for name in [*raw["strerror"], raw["strerror_otherwise"]]:
            if name not in texts:
                raise ValueError(f"{TABLE_PATH.name}: {where}: no [strerror] text of {name}")
        strerror_texts = {_errno(name, where): texts[name] for name in raw["strerror"]}
        otherwise = texts[raw["strerror_otherwise"]]
    elif "strerror" in raw or "strerror_otherwise" in raw:
        raise ValueError(f"{TABLE_PATH.name}: {where}: strerror keys without a {{strerror}}")
    counted = raw.get("counted", True)
    if not isinstance(counted, bool):
        raise ValueError(f"{TABLE_PATH.name}: {where}: counted must be true or false")
    return Refusal(code, _errno(raw["errno"], where), raw["errno"], reason,
                   MappingProxyType(parts), counted, MappingProxyType(strerror_texts), otherwise)


def load(path: Path = TABLE_PATH) -> tuple[Refusal, ...]:
    """The table, checked: unique codes, and every reason told by the first entry whose
    beginning it has (an entry whose beginning begins a later one's would hide it)."""
    with path.open("rb") as f:
        data = tomllib.load(f)
    if set(data) - {"refusal", "strerror"}:
        raise ValueError(f"{path.name}: unknown tables {sorted(data)}")
    texts = data.get("strerror", {})
    table = tuple(_entry(raw, texts) for raw in data["refusal"])
    codes = [r.code for r in table]
    if len(set(codes)) != len(codes):
        raise ValueError(f"{path.name}: a code is given twice: {codes}")
    for i, first in enumerate(table):
        for later in table[i + 1:]:
            if later.prefix.startswith(first.prefix):
                raise ValueError(f"{path.name}: {first.code} hides {later.code}: put the "
                                 f"longer beginning first")
    return table


TABLE: Final = load()
BY_CODE: Final = MappingProxyType({r.code: r for r in TABLE})


def by_reason(reason: str) -> Refusal | None:
    """The refusal a reason text is an instance of: the first whose beginning it has."""
    return next((r for r in TABLE if reason.startswith(r.prefix)), None)


def _named(code: str) -> Refusal:
    return BY_CODE[code]  # a KeyError here: the table lost an entry this module names


MAC_INVALID: Final = _named("mac_invalid")
MOUNT_FD_FOREIGN: Final = _named("mount_fd_foreign")
FILE_TYPE_REFUSED: Final = _named("file_type_refused")
FILE_TYPE_NO_HANDLE: Final = _named("file_type_no_handle")
HANDLE_TOO_LARGE: Final = _named("handle_too_large")
SUBMOUNT: Final = _named("submount")
OUTSIDE_SHARE_MOUNT: Final = _named("outside_share_mount")
OUTSIDE_SHARE: Final = _named("outside_share")
OPENED_OUTSIDE_MOUNT: Final = _named("opened_outside_mount")
DIRECTORY_LEFT_SHARE: Final = _named("directory_left_share")
PLACE_UNVERIFIABLE: Final = _named("place_unverifiable")
SYSCALL_NOT_EMULATED: Final = _named("syscall_not_emulated")
CALLER_UID_FOREIGN: Final = _named("caller_uid_foreign")
