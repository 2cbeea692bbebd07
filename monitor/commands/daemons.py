"""`fhmon serve` (the monitor service) and `fhmon keeper` (listener copies across restarts)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from monitor import config as cfg
from monitor import log, signing
from monitor.commands.running import report_failure, run_service


def serve(args: argparse.Namespace) -> int:
    from monitor.key_watch import key_dir_fingerprint
    from monitor.server import Service

    overrides: dict[str, Any] = {}
    for key in ("socket", "key_dir", "allow", "socket_mode", "socket_owner", "socket_group",
                "log_level", "metrics_address", "keeper_socket", "sandbox"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    embedded = False
    try:
        if args.config:
            config = cfg.apply(cfg.Config(), cfg.load_file(args.config), args.config)
        elif not overrides.get("socket") and not overrides.get("key_dir"):
            config = cfg.embedded_default(args.state_dir)
            embedded = True
        else:
            config = cfg.Config()
        config = cfg.finish(cfg.apply(config, overrides, "command line"))
    except cfg.ConfigError as exc:
        print(f"fhmon serve: {exc}", file=sys.stderr)
        return 2
    if args.print_config:  # pure: creates nothing, generates no key
        sys.stdout.write(config.to_toml())
        return 0
    if os.geteuid() != 0:
        print("fhmon serve: must run as root (it needs CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, "
              "CAP_SETUID, CAP_SETGID and CAP_KILL); try `sudo fhmon serve`, or "
              "`fhmon serve --print-config` to see what it would use", file=sys.stderr)
        return 2
    if embedded:
        try:
            prepare_embedded(config)
        except (OSError, signing.KeyDirError) as exc:
            print(f"fhmon serve: cannot prepare {config.state_dir}: {exc}", file=sys.stderr)
            return 1
    log.setup(config.log_level)
    keys_loaded_from = key_dir_fingerprint(config.key_dir)  # before reading: see key_watch
    try:
        keys = signing.KeyRing.load(config.key_dir)
    except signing.KeyDirError as exc:
        print(f"fhmon serve: {exc}", file=sys.stderr)
        return 2
    for pattern in cfg.unmatched_globs(config.allow):
        log.event("allow_matches_nothing", logging.WARNING, glob=pattern,
                  hint="no share can be registered under it until a directory matching it "
                       "exists; check it for typos")
    service = Service(config, keys, keys_loaded_from)
    try:
        run_service(service.serve, on_hangup=service.reload_keys, log_stopping=True,
                    before_stop=service.before_stop)
    except Exception as exc:  # a start-up failure: say what and where
        return report_failure("serve", exc)
    return 0


def prepare_embedded(config: cfg.Config) -> None:
    """Plain `fhmon serve`: everything under one state dir, created on first use."""
    base = config.state_dir
    os.makedirs(base, mode=0o755, exist_ok=True)
    os.makedirs(os.path.join(base, "shares"), mode=0o755, exist_ok=True)
    if not os.path.isdir(config.key_dir) or not any(
            n.endswith(".key") for n in os.listdir(config.key_dir)):
        key_id = signing.keygen(config.key_dir)
        print(f"fhmon: generated signing key {key_id:08x} in {config.key_dir}", file=sys.stderr)
    print(f"fhmon: embedded default under {base}\n"
          f"  socket:   {config.socket}\n"
          f"  keys:     {config.key_dir}\n"
          f"  allow:    {', '.join(config.allow)} (put shares there)\n"
          f"  try:      fhmon launch --socket {config.socket} --share {base}/shares/NAME "
          f"--user 65534 -- CMD", file=sys.stderr)


def keeper(args: argparse.Namespace) -> int:
    from monitor.keeper import Keeper

    log.setup(args.log_level)
    run_service(Keeper(args.socket).serve)
    return 0
