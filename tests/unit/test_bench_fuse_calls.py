"""bench/fuse_calls.py gives each handle call to the FUSE request its thread logged last."""

from __future__ import annotations

from bench import fuse_calls

LOG = [
    '101  write(2, "Received request: opcode=Init", 30) = 30',
    "101  name_to_handle_at(5, \"\", {handle_bytes=8, f_handle=0xaa}, [1], AT_EMPTY_PATH) = 0",
    '102  write(2, "Received request: opcode=Readdirplus", 37) = 37',
    '101  write(2, "Received request: opcode=Lookup", 32) = 32',
    "102  name_to_handle_at(6, \"a\", {handle_bytes=8, f_handle=0xbb}, [1], 0) = 0",
    "102  open_by_handle_at(5, {handle_bytes=8, f_handle=0xbb}, O_PATH) = 7",
    "101  name_to_handle_at(6, \"b\", {handle_bytes=8, f_handle=0xcc}, [1], 0) = 0",
    '101  write(2, "Received request: opcode=Statfs", 32) = 32',
    '102  write(2, "Received request: opcode=Readdirplus", 37) = 37',
    "102  name_to_handle_at(6, \"a\", {handle_bytes=8, f_handle=0xbb}, [1], 0) = 0",
    "102  name_to_handle_at(6, \"x\", 0x7ffd <unfinished ...>",
    "102  open_by_handle_at(5, {handle_bytes=8, f_handle=0xbb}, O_PATH) = -1 ESTALE",
    '101  write(2, "Received request: opcode=Statfs", 32) = 32',
    '101  write(2, "Received request: opcode=Getattr", 32) = 32',
    "not a line of strace",
]


def test_calls_go_to_the_thread_s_last_request_and_statfs_splits_the_phases() -> None:
    phases = fuse_calls.attribute(LOG)
    assert len(phases) == 3
    first, second, third = phases
    assert first.ops == {"Init": 1, "Readdirplus": 1, "Lookup": 1}
    assert first.calls == {"Init": {"n2h": 1}, "Readdirplus": {"n2h": 1, "obh": 1},
                           "Lookup": {"n2h": 1}}
    assert second.ops == {"Readdirplus": 1}
    assert second.calls == {"Readdirplus": {"n2h": 2, "obh": 1}}
    assert third.ops == {"Getattr": 1} and not third.calls


def test_repeats_count_only_answered_n2h_calls_by_their_handle() -> None:
    counts = fuse_calls.repeats(fuse_calls.attribute(LOG))
    # 0xaa, 0xbb, 0xcc, then 0xbb again; the unfinished call has no handle yet.
    assert counts == {"n2h_decoded": 4, "distinct": 3, "repeated": 1}


def test_the_table_gives_calls_per_file_for_each_phase() -> None:
    phases = fuse_calls.attribute(LOG)
    out = fuse_calls.table(phases, ("find", "ls -lR"), files=2)
    lines = out.splitlines()
    assert "| find | Readdirplus | 1 | 1 | 1 |" in lines
    assert "| find | **all** | 3 | 3 | 1 (2.00/file) |" in lines
    assert "| ls -lR | **all** | 1 | 2 | 1 (1.50/file) |" in lines
    assert not any(line.startswith("| after") for line in lines)  # zip stops at the names
