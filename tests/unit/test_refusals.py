"""The one table of refusals (protocol/refusals.toml): what it says, what it rejects, and
that what the Python plane and the metrics take from it is what it says."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from protocol import refusals

PROTOCOL = Path(refusals.__file__).resolve().parent


def test_every_entry_has_its_constant_and_nothing_else_is_named() -> None:
    source = (PROTOCOL / "refusals.py").read_text()
    named = dict(re.findall(r'^([A-Z_]+): Final = _named\("([a-z_]+)"\)$', source, re.M))
    assert sorted(named.values()) == sorted(refusals.BY_CODE)
    for constant, code in named.items():
        assert constant == code.upper()
        assert getattr(refusals, constant) is refusals.BY_CODE[code]


def test_the_strerror_texts_are_the_c_librarys() -> None:
    unverifiable = refusals.PLACE_UNVERIFIABLE
    assert set(unverifiable.strerror_texts) == {errno.ENAMETOOLONG, errno.ENOENT, errno.EMFILE,
                                                errno.ENFILE, errno.ENOMEM, errno.EACCES}
    for err, text in unverifiable.strerror_texts.items():
        assert text == os.strerror(err)
    assert unverifiable.strerror_otherwise == os.strerror(errno.EIO)
    assert unverifiable.strerror(errno.ELOOP) == os.strerror(errno.EIO)


def test_reasons_fill_in_their_parts() -> None:
    assert refusals.SYSCALL_NOT_EMULATED.text(nr=1234, arch=0xC000003E) == \
        "syscall 1234 arch 0xc000003e is not emulated"
    unverifiable = refusals.PLACE_UNVERIFIABLE
    assert unverifiable.text(strerror=unverifiable.strerror(errno.ENAMETOOLONG)) == \
        "file's place cannot be checked (File name too long)"
    assert refusals.CALLER_UID_FOREIGN.text(uid=5, peer_uid=7) == \
        "caller uid 5 is not the registering client's uid 7"
    assert refusals.MAC_INVALID.text() == "bad or foreign MAC"
    with pytest.raises(TypeError):
        refusals.SYSCALL_NOT_EMULATED.text(nr=1)
    with pytest.raises(TypeError):
        refusals.MAC_INVALID.text(detail="x")


def test_errnos_are_the_ones_the_planes_answered() -> None:
    """The errnos as they were before the table (docs/semantics.md describes them)."""
    want = {"mac_invalid": errno.ESTALE, "mount_fd_foreign": errno.ESTALE,
            "file_type_refused": errno.EACCES, "file_type_no_handle": errno.EOPNOTSUPP,
            "handle_too_large": errno.EOPNOTSUPP, "submount": errno.EOPNOTSUPP,
            "outside_share_mount": errno.EACCES, "outside_share": errno.EACCES,
            "opened_outside_mount": errno.ESTALE, "directory_left_share": errno.ESTALE,
            "place_unverifiable": errno.EOPNOTSUPP, "syscall_not_emulated": errno.ENOSYS,
            "caller_uid_foreign": errno.EPERM}
    assert {r.code: r.errno for r in refusals.TABLE} == want
    assert [r.code for r in refusals.TABLE if not r.counted] == ["caller_uid_foreign"]


def test_a_reason_finds_its_refusal_by_its_beginning() -> None:
    assert refusals.by_reason("object outside the share (other mount)") is \
        refusals.OUTSIDE_SHARE_MOUNT
    assert refusals.by_reason("object outside the share") is refusals.OUTSIDE_SHARE
    assert refusals.by_reason("syscall 7 arch 0x1 is not emulated") is \
        refusals.SYSCALL_NOT_EMULATED
    assert refusals.by_reason("a reason no table knows") is None


def test_the_metric_codes_are_the_tables_counted_refusals() -> None:
    from monitor import labels

    counted = tuple((r.prefix, r.code) for r in refusals.TABLE if r.counted)
    assert counted == labels.REFUSAL_CODES
    for refusal in refusals.TABLE:
        if refusal.counted:
            example = refusal.text(**dict.fromkeys(refusal.parts, 0))
            assert labels.refusal_code(example) == refusal.code
    assert labels.MAC_INVALID == "mac_invalid"
    assert labels.refusal_code("caller uid 1 is not the registering client's uid 2") == \
        labels.OTHER  # audited without a code, never counted


ENTRY = '[[refusal]]\ncode = "{code}"\nerrno = "{errno}"\nreason = "{reason}"\n'


@pytest.mark.parametrize(("table", "complaint"), [
    (ENTRY.format(code="a", errno="EACCES", reason="same") * 2, "given twice"),
    (ENTRY.format(code="short", errno="EACCES", reason="object")
     + ENTRY.format(code="long", errno="EACCES", reason="object outside"), "hides"),
    (ENTRY.format(code="a", errno="ENOTANERRNO", reason="x"), "not an errno name"),
    (ENTRY.format(code="Bad-Code", errno="EACCES", reason="x"), "bad code"),
    (ENTRY.format(code="a", errno="EACCES", reason="x {n}"), "part.name"),
    (ENTRY.format(code="a", errno="EACCES", reason="x") + 'colour = "red"\n', "keys"),
    (ENTRY.format(code="a", errno="EACCES", reason="x ({strerror})")
     + 'part.strerror = "d"\nstrerror = ["ENOENT"]\nstrerror_otherwise = "EIO"\n',
     "no [strerror] text"),
])
def test_the_loader_refuses_a_table_it_cannot_trust(tmp_path: Path, table: str,
                                                    complaint: str) -> None:
    path = tmp_path / "refusals.toml"
    path.write_text(table)
    with pytest.raises(ValueError, match=re.escape(complaint)):
        refusals.load(path)


def test_the_native_plane_compiled_the_same_table() -> None:
    """native/build.rs reads refusals.toml by hand: what it made of it is what tomllib
    reads, entry for entry (the finished {strerror} texts included)."""
    from monitor import _native

    def finished(refusal: refusals.Refusal) -> tuple[list[tuple[int, str]], str]:
        if "strerror" not in refusal.parts:
            return [], ""
        return ([(err, refusal.text(strerror=text))
                 for err, text in refusal.strerror_texts.items()],
                refusal.text(strerror=refusal.strerror_otherwise))

    python = [(r.code, r.errno, r.errno_name, r.reason, list(r.parts), r.counted,
               *finished(r)) for r in refusals.TABLE]
    assert _native.refusal_table() == python
