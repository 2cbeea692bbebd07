"""monitor.config: validation of every key, error messages that name the key, TOML round trip."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import config as cfg
from monitor.config import Config, ConfigError, apply, finish

FAST = settings(max_examples=200, deadline=None)

ALL_KEYS = ["allow", "data_plane", "data_plane_threads",
            "drop_capabilities", "keeper_socket", "key_dir", "log_level", "max_connections",
            "max_connections_per_uid", "max_targets", "metrics_address",
            "registration_timeout", "sandbox", "signing", "socket", "socket_group",
            "socket_mode", "socket_owner", "state_dir", "sync_wakeup", "workers"]


def _apply(values: dict[str, Any]) -> Config:
    return apply(Config(), values, "test.toml")


def _good() -> Config:
    return Config(socket="/run/fhmon.sock", key_dir="/etc/fhmon/keys", allow=["/srv/*"])


# --- defaults -------------------------------------------------------------------------------


def test_field_names_are_the_documented_keys() -> None:
    assert sorted(f.name for f in dataclasses.fields(Config)) == ALL_KEYS


def test_defaults() -> None:
    c = Config()
    assert (c.socket, c.key_dir, c.allow, c.socket_mode, c.socket_owner, c.socket_group) == (
        "", "", [], 0o600, None, None)
    assert (c.log_level, c.registration_timeout, c.max_connections, c.max_targets) == (
        "info", 5.0, 1024, 4096)
    assert (c.metrics_address, c.sync_wakeup, c.signing, c.state_dir) == ("", True, True, "")


def test_embedded_default_layout() -> None:
    c = cfg.embedded_default()
    assert cfg.DEFAULT_STATE_DIR == "/var/lib/fhmon"
    assert c.socket == "/var/lib/fhmon/fhmon.sock"
    assert c.key_dir == "/var/lib/fhmon/keys"
    assert c.allow == ["/var/lib/fhmon/shares/*"]
    assert c.state_dir == "/var/lib/fhmon"
    assert c.socket_mode == 0o600
    assert finish(c) is c


def test_embedded_default_other_state_dir() -> None:
    c = cfg.embedded_default("/tmp/fh")
    assert (c.socket, c.key_dir, c.allow, c.state_dir) == (
        "/tmp/fh/fhmon.sock", "/tmp/fh/keys", ["/tmp/fh/shares/*"], "/tmp/fh")


# --- apply: unknown keys and types ----------------------------------------------------------


@pytest.mark.parametrize("key", ["sockets", "Socket", "key-dir", "", "allow_list", "mode"])
def test_unknown_key_is_named(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({key: "x"})
    message = str(info.value)
    assert message.startswith(f"test.toml: unknown config key {key!r}; known keys: ")
    assert message.endswith(", ".join(ALL_KEYS))


@pytest.mark.parametrize(("key", "value", "expected", "got"), [
    ("socket", 5, "str", "int 5"),
    ("socket", ["/a"], "str", "list ['/a']"),
    ("key_dir", None, "str", "NoneType None"),
    ("metrics_address", 9090, "str", "int 9090"),
    ("state_dir", 1.5, "str", "float 1.5"),
    ("allow", "/srv/*", "list", "str '/srv/*'"),
    ("allow", ["/srv/*", 3], "str", "int 3"),
    ("log_level", 10, "str", "int 10"),
    ("registration_timeout", "5", "int or float", "str '5'"),
    ("max_connections", 1.0, "int", "float 1.0"),
    ("max_targets", "10", "int", "str '10'"),
    ("sync_wakeup", 1, "bool", "int 1"),
    ("signing", "true", "bool", "str 'true'"),
    ("socket_mode", 1.5, "int", "float 1.5"),
])
def test_wrong_type_names_key_and_type(key: str, value: Any, expected: str, got: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({key: value})
    assert str(info.value) == f"test.toml: config key {key!r}: expected {expected}, got {got}"


@pytest.mark.parametrize(("key", "expected"), [
    ("socket", "str"), ("max_connections", "int"), ("max_targets", "int"),
    ("registration_timeout", "int or float"), ("socket_mode", "int"), ("log_level", "str"),
])
def test_booleans_are_not_numbers_or_strings(key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({key: True})
    assert str(info.value) == (f"test.toml: config key {key!r}: expected {expected}, "
                               f"got a boolean")


@pytest.mark.parametrize("key", ["socket_owner", "socket_group"])
@pytest.mark.parametrize("value", [True, 1.5, None, ["root"]])
def test_owner_group_types(key: str, value: Any) -> None:
    what = "user name or uid" if key == "socket_owner" else "group name or gid"
    with pytest.raises(ConfigError, match=f"config key {key!r}: expected a {what}"):
        _apply({key: value})


def test_source_prefixes_every_error() -> None:
    with pytest.raises(ConfigError, match=r"^command line: config key 'socket'"):
        apply(Config(), {"socket": 1}, "command line")


def test_apply_returns_the_same_object_with_values_set() -> None:
    c = Config()
    out = apply(c, {"socket": "/s", "max_targets": 7, "signing": False}, "x")
    assert out is c
    assert (c.socket, c.max_targets, c.signing) == ("/s", 7, False)


def test_apply_empty_is_a_no_op() -> None:
    assert apply(Config(), {}, "x") == Config()


# --- apply: values --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "mode"), [
    ("0660", 0o660), ("0600", 0o600), ("660", 0o660), ("0o640", 0o640), ("0000", 0),
    ("0770", 0o770), ("0700", 0o700),
])
def test_socket_mode(value: Any, mode: int) -> None:
    assert _apply({"socket_mode": value}).socket_mode == mode


@pytest.mark.parametrize("value", ["0666", "0606", "0777", "0601", "0604", "0664"])
def test_socket_mode_world_bits_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"config key 'socket_mode': mode \d{4} lets any "
                                          r"local user connect; use 0600 or 0660"):
        _apply({"socket_mode": value})


@pytest.mark.parametrize(("value", "shown"), [("01000", "1000"), ("04600", "4600"),
                                              ("07770", "7770"), ("-0600", "-600")])
def test_socket_mode_beyond_0777_refused(value: Any, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({"socket_mode": value})
    assert str(info.value) == (f"test.toml: config key 'socket_mode': mode {shown} has bits "
                               f"beyond 0777")


@pytest.mark.parametrize("value", [660, 0o600, 0, -1, 384])
def test_socket_mode_integer_refused(value: int) -> None:
    """TOML reads `socket_mode = 660` as decimal (0o1224): only a string says octal."""
    with pytest.raises(ConfigError) as info:
        _apply({"socket_mode": value})
    assert str(info.value) == (f"test.toml: config key 'socket_mode': write the mode as a "
                               f'string of octal digits, e.g. socket_mode = "0660"; the TOML '
                               f"integer {value} is not read as octal")


@pytest.mark.parametrize("value", ["rw", "0x180", "", "08", "0o9", "06 60"])
def test_socket_mode_not_octal(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({"socket_mode": value})
    assert str(info.value) == (f"test.toml: config key 'socket_mode': {value!r} is not an "
                               f"octal mode")


@pytest.mark.parametrize("key", ["socket", "key_dir", "state_dir"])
@pytest.mark.parametrize("path", ["relative/path", "./x", "fhmon.sock", "~/keys", " /x"])
def test_relative_paths_refused(key: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({key: path})
    assert str(info.value) == (f"test.toml: config key {key!r}: {path!r} must be an "
                               f"absolute path")


@pytest.mark.parametrize("key", ["socket", "key_dir", "state_dir"])
def test_absolute_and_empty_paths(key: str) -> None:
    assert getattr(_apply({key: "/a/b"}), key) == "/a/b"
    assert getattr(_apply({key: ""}), key) == ""


@pytest.mark.parametrize("item", ["srv/*", "*", "", "./shares"])
def test_allow_globs_must_be_absolute(item: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({"allow": ["/ok/*", item]})
    assert str(info.value) == (f"test.toml: config key 'allow': {item!r} must be an "
                               f"absolute glob")


def test_allow_is_copied() -> None:
    globs = ["/srv/*"]
    c = _apply({"allow": globs})
    globs.append("/other")
    assert c.allow == ["/srv/*"]
    assert _apply({"allow": []}).allow == []


@pytest.mark.parametrize(("value", "level"), [("debug", "debug"), ("info", "info"),
                                              ("warning", "warning"), ("error", "error"),
                                              ("DEBUG", "debug"), ("Warning", "warning")])
def test_log_levels(value: str, level: str) -> None:
    assert _apply({"log_level": value}).log_level == level


@pytest.mark.parametrize("value", ["warn", "critical", "trace", "", " info"])
def test_bad_log_level(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        _apply({"log_level": value})
    assert str(info.value) == (f"test.toml: config key 'log_level': {value!r} is not one of "
                               f"['debug', 'error', 'info', 'warning']")


@pytest.mark.parametrize(("value", "seconds"), [(1, 1.0), (0.5, 0.5), (300, 300.0),
                                                (1e-3, 0.001)])
def test_registration_timeout(value: float, seconds: float) -> None:
    got = _apply({"registration_timeout": value}).registration_timeout
    assert got == seconds
    assert isinstance(got, float)


@pytest.mark.parametrize("value", [0, 0.0, -1, 300.01, 301, float("inf"), float("nan")])
def test_registration_timeout_range(value: float) -> None:
    with pytest.raises(ConfigError, match=r"'registration_timeout': must be in \(0, 300\] s"):
        _apply({"registration_timeout": value})


@pytest.mark.parametrize("key", ["max_connections", "max_connections_per_uid", "max_targets"])
def test_counts(key: str) -> None:
    assert getattr(_apply({key: 1}), key) == 1
    assert getattr(_apply({key: 10**6}), key) == 10**6
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"config key {key!r}: must be at least 1"):
            _apply({key: bad})


def test_workers() -> None:
    assert _apply({}).workers == 0
    for good in (0, 1, 64):
        assert _apply({"workers": good}).workers == good
    for bad in (-1, 65):
        with pytest.raises(ConfigError, match=r"'workers': must be in \[0, 64\]"):
            _apply({"workers": bad})
    for wrong in (True, "2", 2.0):
        with pytest.raises(ConfigError, match="'workers': expected int"):
            _apply({"workers": wrong})


@pytest.mark.parametrize("value", ["127.0.0.1:9090", "[::1]:9090", ":9090", "localhost:1", ""])
def test_metrics_address(value: str) -> None:
    assert _apply({"metrics_address": value}).metrics_address == value


@pytest.mark.parametrize("value", ["9090", "localhost", "/run/metrics.sock"])
def test_metrics_address_needs_a_port(value: str) -> None:
    with pytest.raises(ConfigError, match=f"'metrics_address': {value!r} must be HOST:PORT"):
        _apply({"metrics_address": value})


@pytest.mark.parametrize("key", ["sync_wakeup", "signing"])
def test_booleans(key: str) -> None:
    assert getattr(_apply({key: False}), key) is False
    assert getattr(_apply({key: True}), key) is True


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("socket_owner", 0, 0), ("socket_owner", 1000, 1000), ("socket_owner", "1000", 1000),
    ("socket_owner", "root", 0), ("socket_group", 0, 0), ("socket_group", "65534", 65534),
    ("socket_group", "root", 0),
])
def test_owner_and_group(key: str, value: Any, expected: int) -> None:
    assert getattr(_apply({key: value}), key) == expected


def test_unknown_user_and_group() -> None:
    with pytest.raises(ConfigError, match="config key 'socket_owner': no user 'no-such-user-x'"):
        _apply({"socket_owner": "no-such-user-x"})
    with pytest.raises(ConfigError, match="config key 'socket_group': no group 'no-such-grp-x'"):
        _apply({"socket_group": "no-such-grp-x"})


# --- finish ---------------------------------------------------------------------------------


def test_finish_accepts_a_complete_config() -> None:
    c = _good()
    assert finish(c) is c


@pytest.mark.parametrize(("socket", "key_dir", "missing"), [
    ("", "", "socket, key_dir"), ("", "/k", "socket"), ("/s", "", "key_dir")])
def test_finish_missing_socket_or_key_dir(socket: str, key_dir: str, missing: str) -> None:
    with pytest.raises(ConfigError) as info:
        finish(Config(socket=socket, key_dir=key_dir, allow=["/srv/*"]))
    assert str(info.value).startswith(f"missing {missing}: give --socket and --key-dir")
    assert "fhmon serve" in str(info.value)


def test_finish_needs_allow() -> None:
    c = _good()
    c.allow = []
    with pytest.raises(ConfigError, match="no --allow globs: nothing could ever be registered"):
        finish(c)


@pytest.mark.parametrize("mode", [0o660, 0o640, 0o610, 0o670, 0o070])
def test_finish_group_mode_needs_a_group(mode: int) -> None:
    c = _good()
    c.socket_mode = mode
    with pytest.raises(ConfigError, match="socket_mode gives group access but no socket_group"):
        finish(c)
    c.socket_group = 0
    assert finish(c) is c


# --- to_toml --------------------------------------------------------------------------------


def test_to_toml_default_text() -> None:
    assert Config().to_toml() == (
        'socket = ""\n'
        'key_dir = ""\n'
        "allow = []\n"
        'socket_mode = "0600"\n'
        "# socket_owner = (unset)\n"
        "# socket_group = (unset)\n"
        'log_level = "info"\n'
        "registration_timeout = 5.0\n"
        "max_connections = 1024\n"
        "max_connections_per_uid = 32\n"
        "max_targets = 4096\n"
        'metrics_address = ""\n'
        "sync_wakeup = true\n"
        "signing = true\n"
        'state_dir = ""\n'
        'keeper_socket = ""\n'
        "drop_capabilities = true\n"
        "workers = 0\n"
        "sandbox = false\n"
        'data_plane = "native"\n'
        'data_plane_threads = "auto"\n')


def test_to_toml_quotes() -> None:
    c = _good()
    c.allow = ['/srv/"quoted"/*', "/srv/back\\slash", "/srv/é"]
    text = c.to_toml()
    assert 'allow = ["/srv/\\"quoted\\"/*", "/srv/back\\\\slash", "/srv/é"]' in text
    assert tomllib.loads(text)["allow"] == c.allow


def _round_trip(c: Config) -> Config:
    return apply(Config(), tomllib.loads(c.to_toml()), "printed config")


def test_to_toml_round_trip_examples() -> None:
    for c in (Config(), cfg.embedded_default(), _good()):
        assert _round_trip(c) == c
    full = Config(socket="/s", key_dir="/k", allow=["/a/*", "/b"], socket_mode=0o660,
                  socket_owner=1000, socket_group=0, log_level="debug",
                  registration_timeout=0.25, max_connections=3, max_targets=9,
                  metrics_address="127.0.0.1:9", sync_wakeup=False, signing=False,
                  state_dir="/st")
    assert _round_trip(full) == full


def test_to_toml_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "fhmon.toml"
    path.write_text(cfg.embedded_default("/x").to_toml())
    assert apply(Config(), cfg.load_file(str(path)), str(path)) == cfg.embedded_default("/x")


def test_load_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*missing\.toml: No such file"):
        cfg.load_file(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("socket = \n")
    with pytest.raises(ConfigError, match=r"config file .*bad\.toml: not valid TOML"):
        cfg.load_file(str(bad))


_PATH_TEXT = st.text(st.characters(exclude_categories=["Cs", "Cc"]), max_size=20)
_PATHS = _PATH_TEXT.map(lambda s: "/" + s)


def _shareable(glob: str) -> bool:
    """apply() refuses globs that could name /, a system directory or fhmon's state."""
    try:
        cfg.refuse_protected_glob(glob, ())
    except ConfigError:
        return False
    return True


@st.composite
def _configs(draw: st.DrawFn) -> Config:
    return Config(
        socket=draw(st.one_of(st.just(""), _PATHS)),
        key_dir=draw(st.one_of(st.just(""), _PATHS)),
        allow=draw(st.lists(_PATHS.filter(_shareable), max_size=3)),
        socket_mode=draw(st.integers(0, 0o777).map(lambda m: m & ~0o007)),
        socket_owner=draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))),
        socket_group=draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))),
        log_level=draw(st.sampled_from(["debug", "info", "warning", "error"])),
        registration_timeout=draw(st.floats(min_value=0, max_value=300, exclude_min=True)),
        max_connections=draw(st.integers(1, 2**63 - 1)),
        max_targets=draw(st.integers(1, 2**31)),
        metrics_address=draw(st.one_of(st.just(""), _PATH_TEXT.map(lambda s: s + ":9"))),
        sync_wakeup=draw(st.booleans()),
        signing=draw(st.booleans()),
        state_dir=draw(st.one_of(st.just(""), _PATHS)),
    )


@FAST
@given(c=_configs())
def test_to_toml_round_trip(c: Config) -> None:
    assert _round_trip(c) == c


@pytest.mark.parametrize("path", ["/srv/a\nb", "/srv/a\x7fb", "/srv/a\x01b"])
def test_to_toml_round_trip_control_characters(path: str) -> None:
    c = _good()
    c.allow = [path]
    assert _round_trip(c) == c


@pytest.mark.parametrize(("value", "message"), [
    ("rust", "'rust' is not 'python' or 'native'"),
    (1, "expected str, got int 1"),
])
def test_data_plane_is_python_or_native(value: Any, message: str) -> None:
    assert _apply({"data_plane": "native"}).data_plane == "native"
    assert _apply({"data_plane": "python"}).data_plane == "python"
    with pytest.raises(ConfigError, match=message):
        _apply({"data_plane": value})


@pytest.mark.parametrize("value", [0, 65, True, "Auto", "2", 1.5])
def test_data_plane_threads_bounded(value: Any) -> None:
    assert _apply({"data_plane_threads": 4}).data_plane_threads == 4
    assert _apply({"data_plane_threads": "auto"}).data_plane_threads == "auto"
    with pytest.raises(ConfigError, match="data_plane_threads"):
        _apply({"data_plane_threads": value})


@pytest.mark.parametrize("key", ["recv_thread", "dispatch_thread"])
@pytest.mark.parametrize("value", [True, False])
def test_retired_answering_modes_are_refused_with_the_reason(key: str, value: bool) -> None:
    """A config written for a retired answering mode must not silently run another one."""
    with pytest.raises(ConfigError, match=f"test.toml: config key '{key}' was retired: .*"
                       r"us of CPU per .*docs/performance.md"):
        _apply({key: value})


# --- the documented table -------------------------------------------------------------------


def _documented_rows() -> dict[str, list[str]]:
    """docs/operations.md's configuration table: key -> [type, default, flag, what]."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_documented_table_has_every_key_once() -> None:
    assert sorted(_documented_rows()) == ALL_KEYS


def test_the_documented_defaults_are_what_print_config_prints() -> None:
    printed = tomllib.loads(cfg.embedded_default(cfg.DEFAULT_STATE_DIR).to_toml())
    for key, (_, default, _, _) in _documented_rows().items():
        if default == "unset":
            assert key not in printed, key
        else:
            assert tomllib.loads(f"v = {default.strip('`')}")["v"] == printed[key], key


def test_the_documented_flags_set_their_keys() -> None:
    from monitor.cli import build_parser

    parser = build_parser()
    serve = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
                 if a.dest == "command").choices["serve"]
    dests = {opt: action.dest for action in serve._actions for opt in action.option_strings}
    for key, (_, _, flag, _) in _documented_rows().items():
        for named in flag.replace("(repeatable)", "").split():
            assert dests[named.strip("`")] == key, (key, flag)
