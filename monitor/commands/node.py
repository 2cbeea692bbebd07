"""`fhmon launch`, `fhmon check` and `fhmon demo`: what runs on the node itself."""

from __future__ import annotations

import argparse
import os
import sys


def add_launch_options(launch: argparse.ArgumentParser) -> None:
    """The launch options (the native launcher takes the same ones)."""
    launch.add_argument("--fail-open", action="store_true",
                        help="when fhmon cannot serve CMD (unreachable, silent, refusing, no "
                        "filter, or the start-up handle probe fails), run CMD exactly as "
                        "given instead of exiting 125 (what KubeVirt pods use)")
    launch.add_argument("--virtiofsd-handles", choices=["prefer", "mandatory"],
                        help="once fhmon serves, give virtiofsd --inode-file-handles=MODE "
                        "(replacing its own); CMD unchanged otherwise")
    launch.add_argument("--virtiofsd-migration", choices=["file-handles"],
                        help="once fhmon serves, turn virtiofsd's --migration-mode (where "
                        "given) into file-handles: only when every migration target runs "
                        "under fhmon with the same keys")
    launch.add_argument("--registration-timeout", type=float, metavar="SECONDS",
                        help="how long fhmon may take to answer (and the probe to pass); "
                        "default 30, or 5 with --fail-open")


def launch(args: argparse.Namespace) -> int:
    """`fhmon launch`: check the arguments as before, then become the native launcher
    (monitor/_bin/fhmon-launch, native/launcher), which does the launch in this very process:
    one launcher for the command line and KubeVirt's pods, and CMD run unserved keeps this pid."""
    from monitor import launcher

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        if not argv:
            raise launcher.LaunchError("no command given after --")
        user = launcher.parse_user(args.user) if args.user else None
        timeout = args.registration_timeout  # None: the native launcher's default
        if timeout is not None and not timeout > 0:
            raise launcher.LaunchError("--registration-timeout must be positive")
        native = launcher.native_argv(args.socket, args.share, user, argv, launcher.Options(
            fail_open=args.fail_open, virtiofsd_handles=args.virtiofsd_handles,
            migration_by_handle=args.virtiofsd_migration == "file-handles",
            registration_timeout=timeout))
    except launcher.LaunchError as exc:
        print(f"fhmon launch: {exc}", file=sys.stderr)
        return 125
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(native[0], native)
    except OSError as exc:
        print(f"fhmon launch: cannot run the native launcher {native[0]}: {exc.strerror} "
              f"(scripts/setup.sh builds it)", file=sys.stderr)
    return 125


def check(args: argparse.Namespace) -> int:
    from monitor.check import run_checks

    results = run_checks(args.key_dir, args.socket, args.allow or [])
    width = max(len(r.name) for r in results)
    for r in results:
        mark = "ok  " if r.ok else ("FAIL" if r.required else "warn")
        print(f"{mark} {r.name:<{width}}  {r.detail}")
    missing = [r.name for r in results if r.required and not r.ok]
    if missing:
        print(f"fhmon check: missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def demo(args: argparse.Namespace) -> int:
    from monitor.demo import run_demo

    return run_demo()
