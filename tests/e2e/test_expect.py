"""Fast checks of the host-side expectation (no VM): the e2e verdict is only as good as its
checker, so it must accept the modelled tree and reject every kind of damage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import expect

DIRS, FILES = 4, 16


def materialize(tree: expect.Tree, root: Path) -> None:
    """Writes the model to disk the way the guest would leave it."""
    root.chmod(0o755)
    made: dict[int, str] = {}
    for path in sorted(tree.paths, key=lambda p: p.count("/")):
        node, target = tree.paths[path], root / path
        if node.kind == "dir":
            target.mkdir()
        elif node.kind == "symlink":
            os.symlink(node.target, target)
        elif id(node) in made:
            os.link(root / made[id(node)], target)
        else:
            target.write_bytes(node.content)
            made[id(node)] = path
    for path, node in tree.paths.items():
        if node.kind != "symlink":
            (root / path).chmod(node.mode)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    root = tmp_path / "share"
    root.mkdir()
    materialize(expect.expected_tree(DIRS, FILES), root)
    return root


def test_model_matches_itself(share: Path) -> None:
    assert expect.check_share(share, DIRS, FILES) == []
    manifest = expect.host_manifest(share)
    assert expect.check_guest_manifest(share, manifest) == []
    counts = expect.expected_counts(DIRS, FILES)
    assert counts["entries"] == sum(1 for line in manifest if line.startswith("S "))
    assert counts["nlinks"] == sum(1 for line in manifest if line.startswith("L "))


def test_hard_links_and_directory_link_counts(share: Path) -> None:
    assert (share / "links/h0").stat().st_nlink == 2
    assert (share / "links/h0").read_bytes().endswith(b"via link 0\n")
    tree = expect.expected_tree(DIRS, FILES)
    assert tree.nlink("data/d0") == 4  # sub_r and moved
    assert tree.nlink("data/d1") == 2  # its sub moved away


@pytest.mark.parametrize("damage", ["content", "mode", "missing", "extra", "symlink", "link"])
def test_damage_is_reported(share: Path, damage: str) -> None:
    f = share / "data/d2/f13"
    if damage == "content":
        f.write_bytes(f.read_bytes().replace(b"line 1", b"line X"))
    elif damage == "mode":
        f.chmod(0o666)
    elif damage == "missing":
        f.unlink()
    elif damage == "extra":
        (share / "data/d2/f10").write_text("unlinked file came back\n")
    elif damage == "symlink":
        os.unlink(share / "sym/l1")
        os.symlink("../data/d1/f7", share / "sym/l1")
    elif damage == "link":
        os.link(f, share / "tree/a1/extra-link")
    assert expect.check_share(share, DIRS, FILES) != []


def test_guest_manifest_difference_is_reported(share: Path) -> None:
    guest = expect.host_manifest(share)
    guest[3] = guest[3].replace("|644|", "|600|")
    assert expect.check_guest_manifest(share, guest) != []
    assert expect.check_guest_manifest(share, guest[:-1]) != []
