"""The pieces of bench/inodes.py (and tests/e2e/walk.py) that run no guest: parsing
/proc/slabinfo and the guest's result line, the tree and script it hands the guest, the
summary (medians, walls, ratios to root) and the markdown table it writes into the docs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import inodes
from tests.e2e import walk

SLABINFO = """slabinfo - version: 2.1
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables
ext4_inode_cache  231394 231546   1128   14    4 : tunables    0    0    0 : slabdata  16539
filp                 663    693    192   21    1 : tunables    0    0    0 : slabdata     33
inode_cache          263    286    624   13    2 : tunables    0    0    0 : slabdata     22
dentry            250943 251223    192   21    1 : tunables    0    0    0 : slabdata  11963
"""


def test_parse_slabinfo_reads_active_objects_and_sizes() -> None:
    assert inodes.parse_slabinfo(SLABINFO) == {
        "ext4_inode_cache": (231394, 1128), "filp": (663, 192), "dentry": (250943, 192)}
    assert inodes.parse_slabinfo("garbage\ndentry x y z\n") == {}


def test_pinned_bytes_is_one_file_dentry_and_inode_per_fd() -> None:
    sizes = inodes.parse_slabinfo(SLABINFO)
    assert inodes.pinned_bytes(1000, sizes) == 1000 * (1128 + 192 + 192)
    assert inodes.pinned_bytes(0, sizes) == 0


def test_parse_walk_result_takes_the_last_result_line() -> None:
    console = ("FHMON-E2E-BOOT uptime=3.1\r\n[ 3.2] noise FHMON-E2E-RESULT status=fail x=1\n"
               "FHMON-E2E-RESULT status=pass found=600 stated=600 lookup=ok walk_s=0.32\r\n")
    assert walk.parse_walk_result(console) == {
        "status": "pass", "found": "600", "stated": "600", "lookup": "ok", "walk_s": "0.32"}
    assert walk.parse_walk_result("FHMON-E2E-BOOT uptime=1\n") is None


def test_make_tree_and_walk_script(tmp_path: Path) -> None:
    tree = walk.make_tree(tmp_path, 25, per_dir=10)
    assert (tree.files, tree.dirs, tree.per_dir) == (25, 3, 10)
    assert tree.last == "tree/d00002/f0000024"
    names = sorted(str(p.relative_to(tmp_path)) for p in tree.root.rglob("f*"))
    assert len(names) == 25 and names[-1] == tree.last
    assert (tmp_path / tree.last).stat().st_mode & 0o777 == 0o644
    script = walk.write_walk_script(tmp_path / "walk.sh", tree, 7).read_text()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[1:5] == ["WALK_FILES=25", "WALK_LAST=tree/d00002/f0000024", "WALK_PER_DIR=10",
                          "WALK_HOLD=7"]
    # The guest derives the left-out names with the same scheme as make_tree.
    assert 'sprintf("tree/d%05d/f%07d", int(i / per), i)' in script


def _run(arm: str, files: int, round_: int, *, fds: int, walk_s: float,
         passed: bool = True, ok: bool = True, found: int | None = None) -> dict[str, Any]:
    return {"arm": arm, "files": files, "round": round_, "ok": ok, "walk_passed": passed,
            "found": files if found is None else found, "walk_s": walk_s, "vm_s": walk_s + 20,
            "at_hold": {"virtiofsd_fds": fds, "virtiofsd_rss_kib": 6144,
                        "cgroup_kmem": 3 * inodes.MIB, "pinned_bytes": fds * 1512,
                        "cgroup_kmem_squeezed": 2 * inodes.MIB,
                        "slab_growth": {"dentry": files, "ext4_inode_cache": files},
                        **({"fhmon_fds": 22, "fhmon_rss_kib": 40960} if arm == "fhmon" else {})}}


def _report() -> dict[str, Any]:
    runs = []
    for i, (root_s, fhmon_s) in enumerate([(1.0, 1.2), (2.0, 2.0), (1.5, 1.65)]):
        runs += [_run("root", 1000, i, fds=20, walk_s=root_s),
                 _run("fhmon", 1000, i, fds=20, walk_s=fhmon_s),
                 _run("unprivileged", 1000, i, fds=1020, walk_s=1.4),
                 _run("root", 100000, i, fds=20, walk_s=40.0),
                 _run("unprivileged", 100000, i, fds=20000, walk_s=9.0, passed=False,
                      found=19_000 + i)]
    runs.append(_run("fhmon", 100000, 0, fds=20, walk_s=50.0, ok=False))
    return {"runs": runs, "rounds": 3, "accel": "tcg", "guest_memory": "2G",
            "loadavg_before": [6.0, 5, 4], "loadavg_after": [7.5, 5, 4]}


def test_summarize_medians_walls_and_ratios() -> None:
    summary = inodes.summarize(_report()["runs"])
    assert list(summary) == ["1000", "100000"]
    small = summary["1000"]
    assert small["root"]["walk_s"] == 1.5 and small["fhmon"]["walk_s"] == 1.65
    assert small["fhmon"]["walk_ratio"] == 1.1 and small["root"]["walk_ratio"] == 1.0
    # Per round: 1.2/1.0, 2.0/2.0, 1.65/1.5.
    assert small["fhmon"]["round_ratios"] == [1.2, 1.0, 1.1]
    assert small["fhmon"]["median_round_ratio"] == 1.1
    assert small["unprivileged"]["virtiofsd_fds"] == 1020
    assert small["fhmon"]["fhmon_fds"] == 22 and small["root"]["fhmon_fds"] is None
    big = summary["100000"]
    # A walk cut short by the wall: its fds count, its time does not.
    wall = big["unprivileged"]
    assert (wall["runs"], wall["walls"], wall["found"]) == (3, 3, 19_001)
    assert wall["virtiofsd_fds"] == 20000 and wall["walk_s"] is None
    assert wall["walk_ratio"] is None and wall["median_round_ratio"] is None
    # A run that was not sampled is counted as failed and left out.
    assert (big["fhmon"]["runs"], big["fhmon"]["failed"]) == (0, 1)
    assert big["fhmon"]["virtiofsd_fds"] is None


def test_markdown_table_and_section_replacement() -> None:
    report = _report()
    report["summary"] = inodes.summarize(report["runs"])
    table = inodes.markdown(report)
    rows = [line for line in table.splitlines() if line.startswith("| 1")]
    assert len(rows) == 6
    assert rows[1] == ("| 1,000 | fhmon | 20 | 6.0 | 3.0 | 2.0 | 0.0 | 22 / 40.0 "
                       "| 1.65 (1.10x; 1.10x) |")
    wall_row = next(r for r in rows if r.startswith("| 100,000 | unprivileged"))
    assert "**wall**: the guest saw 19,001 files" in wall_row and "| 20,000 |" in wall_row
    assert "| 100,000 | fhmon, 1 failed | - | - | - | - | - | - | - |" in table
    assert "load average 6.0 -> 7.5" in table
    doc = f"intro\n{inodes.BEGIN}\nold table\n{inodes.END}\noutro\n"
    want = f"intro\n{inodes.BEGIN}\nnew\n{inodes.END}\noutro\n"
    assert inodes.replace_section(doc, "new") == want
    with pytest.raises(ValueError):
        inodes.replace_section("no markers", "new")


def test_merge_reports_keeps_every_run() -> None:
    one, two = _report(), _report()
    two["runs"] = [_run("fhmon", 1_000_000, 0, fds=20, walk_s=600.0)]
    two.update(rounds=1, guest_memory="3G", loadavg_before=[9.0, 1, 1],
               loadavg_after=[11.0, 1, 1])
    merged = inodes.merge_reports([one, two])
    assert len(merged["runs"]) == len(one["runs"]) + 1
    assert merged["rounds"] == 3 and merged["guest_memory"] == "2G/3G"
    assert (merged["loadavg_before"][0], merged["loadavg_after"][0]) == (6.0, 11.0)
    merged["summary"] = inodes.summarize(merged["runs"])
    assert list(merged["summary"]) == ["1000", "100000", "1000000"]
    table = inodes.markdown(merged)
    assert "| 1,000,000 | fhmon | 20 |" in table
    assert "Medians of 3 rounds (1 at 1,000,000 files), TCG guest with 2G/3G" in table
    with pytest.raises(ValueError):
        inodes.merge_reports([])


def test_a_build_arm_is_summarized_after_the_named_arms_with_its_ratio_to_root() -> None:
    runs = _report()["runs"]
    for i, before_s in enumerate([1.4, 2.4, 1.8]):
        runs.append(_run("before", 1000, i, fds=20, walk_s=before_s))
    small = inodes.summarize(runs)["1000"]
    assert list(small) == ["unprivileged", "fhmon", "root", "before"]
    # Per round: 1.4/1.0, 2.4/2.0, 1.8/1.5; over all: 1.8/1.5.
    assert small["before"]["round_ratios"] == [1.4, 1.2, 1.2]
    assert small["before"]["walk_ratio"] == 1.2
    assert inodes.served("before") and inodes.served("fhmon")
    assert not inodes.served("root") and not inodes.served("unprivileged")


@pytest.mark.parametrize("build", ["=/bin/true", "root=/bin/true", "before=/nonexistent"])
def test_a_build_arm_needs_a_new_name_and_an_executable(build: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        inodes.main(["--build", build, "--arms", "fhmon"])
    assert exit_.value.code == 2
    assert "expected NAME=PATH of an fhmon executable" in capsys.readouterr().err


def test_an_arm_must_be_named_or_built(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        inodes.main(["--build", "before=/bin/true", "--arms", "fhmon,after"])
    assert "arms from unprivileged, fhmon, root, refmon, before" in capsys.readouterr().err


def test_the_refmon_arm_is_served_under_fhmon_launch_and_only_when_asked_for() -> None:
    assert inodes.REFMON_ARM not in inodes.ARMS  # not in a default run
    assert inodes.served(inodes.REFMON_ARM)
    wrapper = ["fhmon", "launch", "--socket", "s", "--share", "d", "--user", "65534", "--"]
    assert inodes.arm_argv(inodes.REFMON_ARM, None, wrapper)[-len(wrapper):] == wrapper
    with pytest.raises(SystemExit):
        inodes.main(["--arms", "refmon,nonesuch", "--files", "10"])
    with pytest.raises(SystemExit):  # a --build may not take the arm's name
        inodes.main(["--arms", "refmon", "--build", "refmon=/bin/true", "--files", "10"])
