"""The real command line accepts what the deploy files pass (when fhmon is installed)."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.flags import (
    CLI_USES,
    assert_effective,
    ds_flags,
    effective_config,
    fhmon_container,
    needs_cli,
    run_fhmon,
    serve_flags,
)
from tests.deploy.render import one


@needs_cli
@pytest.mark.parametrize("subcommand", sorted(CLI_USES))
def test_cli_has_the_subcommands_and_flags_used(subcommand: str) -> None:
    result = run_fhmon(subcommand, "--help")
    assert result.returncode == 0, f"`fhmon {subcommand}` is used by deploy/: {result.stderr}"
    for flag in CLI_USES[subcommand]:
        assert flag in result.stdout, f"`fhmon {subcommand}` lacks {flag}"


@needs_cli
def test_cli_accepts_daemonset_args(
    daemonset: dict[str, Any], base: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The ConfigMap's config.toml, where the DaemonSet's --config points.
    config = tmp_path / "config.toml"
    config.write_text(one(base, "ConfigMap")["data"]["config.toml"])
    args = list(fhmon_container(daemonset)["args"])
    args[args.index("--config") + 1] = str(config)
    assert_effective(effective_config(args), ds_flags(daemonset))


@needs_cli
def test_cli_accepts_unit_args(unit: configparser.ConfigParser) -> None:
    argv = shlex.split(unit["Service"]["ExecStart"])[1:]
    flags, problems = serve_flags(argv)
    assert problems == []
    assert_effective(effective_config(argv), flags)
