"""monitor.policy's pure path predicates: glob_matches (allow list) and is_below (inside)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.policy import glob_matches, is_below

FAST = settings(max_examples=300, deadline=None)

# Path components without '/', NUL or glob metacharacters.
COMPONENT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/\x00*?[]\\"),
                    min_size=1, max_size=12)
ABS_PATH = st.lists(COMPONENT, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts))


# --- glob_matches ---------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    # '*' matches within one component only.
    ("/srv/shares/*", "/srv/shares/vm1", True),
    ("/srv/shares/*", "/srv/shares/vm1/data", False),
    ("/srv/shares/*", "/srv/shares", False),
    ("/srv/shares/*", "/srv/shares/", False),
    ("/srv/shares/*", "/srv/sharesX/vm1", False),
    ("/srv/shares/*", "/srv/vm1", False),
    ("/srv/*/data", "/srv/vm1/data", True),
    ("/srv/*/data", "/srv/vm1/x/data", False),
    ("/srv/*/data", "/srv/data", False),
    ("/srv/**", "/srv/a/b", False),
    ("/srv/**", "/srv/a", True),
    ("/*", "/srv", True),
    ("/*", "/srv/a", False),
    ("/*", "/", False),
    ("/srv/vm*", "/srv/vm12", True),
    ("/srv/vm*", "/srv/vm", True),
    ("/srv/vm*", "/srv/v", False),
    ("/srv/vm?", "/srv/vm1", True),
    ("/srv/vm?", "/srv/vm12", False),
    ("/srv/vm[12]", "/srv/vm2", True),
    ("/srv/vm[12]", "/srv/vm3", False),
    ("/srv/vm[!12]", "/srv/vm3", True),
    # Exact paths.
    ("/srv/shares/vm1", "/srv/shares/vm1", True),
    ("/srv/shares/vm1", "/srv/shares/vm10", False),
    ("/srv/shares/vm1", "/srv/shares/vm", False),
    ("/srv/shares/vm1", "/srv/shares", False),
    ("/srv/shares/vm1", "/srv/shares/vm1/x", False),
    ("/srv/shares/vm1", "/SRV/shares/vm1", False),
    # Trailing slashes on either side do not matter.
    ("/srv/shares/vm1", "/srv/shares/vm1/", True),
    ("/srv/shares/vm1/", "/srv/shares/vm1", True),
    ("/srv/shares/*/", "/srv/shares/vm1", True),
    ("/srv/shares/*", "/srv/shares/vm1/", True),
    ("/srv/shares/*/", "/srv/shares/vm1/x", False),
    # The root.
    ("/", "/", True),
    ("/", "/srv", False),
    ("/srv", "/", False),
    ("/", "//", True),
])
def test_glob_matches(pattern: str, path: str, expected: bool) -> None:
    assert glob_matches(pattern, path) is expected


@FAST
@given(path=ABS_PATH)
def test_literal_pattern_matches_itself_only(path: str) -> None:
    assert glob_matches(path, path)
    assert glob_matches(path, path + "/")
    assert not glob_matches(path, path + "x")
    assert not glob_matches(path, path + "/x")
    assert not glob_matches(path + "/x", path)


@FAST
@given(root=ABS_PATH, name=COMPONENT, rest=st.lists(COMPONENT, min_size=1, max_size=3))
def test_star_never_crosses_a_slash(root: str, name: str, rest: list[str]) -> None:
    pattern = root + "/*"
    assert glob_matches(pattern, f"{root}/{name}")
    assert not glob_matches(pattern, f"{root}/{name}/" + "/".join(rest))
    assert not glob_matches(pattern, root)


@FAST
@given(parts=st.lists(COMPONENT, min_size=1, max_size=6))
def test_one_star_per_component(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    for k in range(1, 8):
        assert glob_matches("/" + "/".join(["*"] * k), path) is (k == len(parts))


# --- is_below -------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "root", "expected"), [
    # The prefix-sibling trap.
    ("/a/share-evil", "/a/share", False),
    ("/a/share-evil/x", "/a/share", False),
    ("/a/shared", "/a/share", False),
    ("/a/share.bak/secret", "/a/share", False),
    ("/a/sharex", "/a/share/", False),
    # Equality and descendants.
    ("/a/share", "/a/share", True),
    ("/a/share", "/a/share/", True),
    ("/a/share/", "/a/share", True),
    ("/a/share/x", "/a/share", True),
    ("/a/share/x/y/z", "/a/share/", True),
    ("/a/share/share-evil", "/a/share", True),
    # Ancestors and strangers.
    ("/a", "/a/share", False),
    ("/", "/a/share", False),
    ("/b/share", "/a/share", False),
    ("/A/share", "/a/share", False),
    # The root contains everything.
    ("/", "/", True),
    ("/a", "/", True),
    ("/a/share-evil/x", "/", True),
])
def test_is_below(path: str, root: str, expected: bool) -> None:
    assert is_below(path, root) is expected


@FAST
@given(root=ABS_PATH, rest=st.lists(COMPONENT, max_size=4))
def test_descendants_are_below(root: str, rest: list[str]) -> None:
    path = "/".join([root, *rest])
    assert is_below(path, root)
    assert is_below(path, root + "/")
    assert is_below(path, "/")


@FAST
@given(root=ABS_PATH, suffix=COMPONENT, rest=st.lists(COMPONENT, max_size=3))
def test_prefix_siblings_are_not_below(root: str, suffix: str, rest: list[str]) -> None:
    sibling = "/".join([root + suffix, *rest])  # e.g. /a/share -> /a/share-evil/...
    assert not is_below(sibling, root)
    assert not is_below(sibling, root + "/")


@FAST
@given(root=ABS_PATH, extra=COMPONENT)
def test_ancestors_are_not_below(root: str, extra: str) -> None:
    child_root = f"{root}/{extra}"
    assert not is_below(root, child_root)
    assert is_below(child_root, root)
