"""`fhmon launch`, `fhmon check` and `fhmon demo`: what runs on the node itself."""

from __future__ import annotations

import argparse
import sys


def launch(args: argparse.Namespace) -> int:
    from monitor import launcher

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        user = launcher.parse_user(args.user) if args.user else None
        return launcher.launch(args.socket, args.share, user, argv)
    except launcher.LaunchError as exc:
        print(f"fhmon launch: {exc}", file=sys.stderr)
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
