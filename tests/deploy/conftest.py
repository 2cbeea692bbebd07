"""Fixtures of the deploy checks: the rendered base and the artefacts each test file reads."""

from __future__ import annotations

import configparser
import json
from typing import Any, cast

import pytest

from tests.deploy.render import (
    BASE,
    LAUNCH_POD,
    LISTENER_POD,
    OVERLAYS,
    SECCOMP_PROFILE,
    SERVICE_UNIT,
    load_docs,
    one,
    render,
)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(BASE)


@pytest.fixture(scope="module")
def daemonset(base: list[dict[str, Any]]) -> dict[str, Any]:
    return one(base, "DaemonSet")


@pytest.fixture(scope="module")
def servicemonitor() -> dict[str, Any]:
    return one(render(OVERLAYS / "prometheus-operator"), "ServiceMonitor")


@pytest.fixture(scope="module")
def profile() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(SECCOMP_PROFILE.read_text()))


@pytest.fixture(scope="module")
def launch_pod() -> dict[str, Any]:
    (pod,) = load_docs(LAUNCH_POD)
    return pod


@pytest.fixture(scope="module")
def listener_pod() -> dict[str, Any]:
    (pod,) = load_docs(LISTENER_POD)
    return pod


@pytest.fixture(scope="module")
def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(SERVICE_UNIT.read_text())
    return parser


@pytest.fixture(scope="module")
def prometheusrule() -> dict[str, Any]:
    return one(render(OVERLAYS / "prometheus-operator"), "PrometheusRule")
