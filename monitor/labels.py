"""The fixed label values of fhmon's metrics and audit log: nothing a target or a client
does can create a new Prometheus series or a new refusal code."""

from __future__ import annotations

import errno

from protocol import refusals

# A client may register a listener of a filter of its own that traps any syscall number; a
# handler's errno may come from any OSError. Whatever is not in these sets counts as OTHER.
OTHER = "other"
SYSCALL_LABELS = frozenset({"name_to_handle_at", "open_by_handle_at"})
RESULT_LABELS = frozenset({
    "ok", "gone",
    # what name_to_handle_at(2) / open_by_handle_at(2) and the open they do can answer, and
    # what fhmon answers itself (docs/semantics.md)
    "E2BIG", "EACCES", "EAGAIN", "EBADF", "EBUSY", "EDQUOT", "EEXIST", "EFAULT", "EFBIG",
    "EINTR", "EINVAL", "EIO", "EISDIR", "ELOOP", "EMFILE", "EMLINK", "ENAMETOOLONG",
    "ENFILE", "ENODEV", "ENOENT", "ENOMEM", "ENOSPC", "ENOSYS", "ENOTDIR", "ENOTSUP",
    "ENXIO", "EOPNOTSUPP", "EOVERFLOW", "EPERM", "EROFS", "ESRCH", "ESTALE", "ETXTBSY",
    "EWOULDBLOCK", "EXDEV",
})
# Why fhmon refused a call, as a metric label: a fixed snake_case identifier per refusal,
# from the one table of refusals (protocol/refusals.toml), in its order. The human text
# (SyscallError.reason) stays in the audit log; it is matched here by its beginning (some
# texts carry details, e.g. the syscall number). A reason the table does not know counts as
# "other": add the refusal to the table (tests/unit/test_refusal_home.py holds every reason
# raised in monitor/ and native/ to it). A refusal the table marks as not counted has no
# code here (it is audited without one).
REFUSAL_CODES: tuple[tuple[str, str], ...] = tuple(
    (refusal.prefix, refusal.code) for refusal in refusals.TABLE if refusal.counted)
REFUSAL_LABELS = frozenset({code for _, code in REFUSAL_CODES} | {OTHER})
MAC_INVALID = refusals.MAC_INVALID.code  # the refusal fhmon_mac_failures_total counts


def syscall_label(name: str) -> str:
    return name if name in SYSCALL_LABELS else OTHER


def result_label(result: str) -> str:
    return result if result in RESULT_LABELS else OTHER


def refusal_code(reason: str) -> str:
    """The fixed identifier of a refusal's human reason ("other" if unknown)."""
    for text, code in REFUSAL_CODES:
        if reason.startswith(text):
            return code
    return reason if reason in REFUSAL_LABELS else OTHER


def errno_name(err: int) -> str:
    """A refused call's result label: its errno's name."""
    return errno.errorcode.get(err, str(err))
