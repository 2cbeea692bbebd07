"""The KubeVirt subcommands: `inject` (offline), the admission `webhook`, the kubelet
`device-plugin`, and `install-launcher` (what the injected init container runs)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from monitor import log
from monitor.commands.running import report_failure, run_service

if TYPE_CHECKING:
    from monitor.kubevirt import containers


def inject(args: argparse.Namespace) -> int:
    from monitor.kubevirt import inject

    source = sys.stdin.buffer if args.filename == "-" else None
    try:
        if source is None:
            with open(args.filename, "rb") as f:
                data = f.read()
        else:
            data = source.read()
        text = inject.inject(data.decode("utf-8"), injection_settings(args))
    except (OSError, UnicodeDecodeError, inject.InjectError) as exc:
        print(f"fhmon inject: {args.filename}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


def injection_settings(args: argparse.Namespace) -> containers.Settings:
    from monitor.kubevirt import containers

    return containers.Settings(image=args.image, runtime=args.runtime,
                               seccomp_default=args.seccomp_default)


def install_launcher(args: argparse.Namespace) -> int:
    from monitor import launcher

    try:
        installed = launcher.install(args.directory)
    except OSError as exc:
        print(f"fhmon install-launcher: {args.directory}: {exc}", file=sys.stderr)
        return 1
    print(f"fhmon install-launcher: {installed} ({installed.stat().st_size} bytes, the "
          f"native launcher)", file=sys.stderr)
    return 0


def install_seccomp_profiles(args: argparse.Namespace) -> int:
    from pathlib import Path

    from monitor.kubevirt import seccomp

    try:
        written = seccomp.install(Path(args.source), Path(args.directory))
    except (OSError, seccomp.ProfileError) as exc:
        print(f"fhmon install-seccomp-profiles: {exc}", file=sys.stderr)
        return 1
    print(f"fhmon install-seccomp-profiles: {args.directory}: "
          f"{', '.join(written) if written else 'up to date'}", file=sys.stderr)
    return 0


def webhook(args: argparse.Namespace) -> int:
    from monitor.kubevirt import webhook

    log.setup(args.log_level)
    try:
        certificates = webhook.CertificateFiles(args.tls_cert, args.tls_key)
    except (OSError, ValueError) as exc:
        print(f"fhmon webhook: {exc}", file=sys.stderr)
        return 2
    settings = injection_settings(args)
    try:
        run_service(webhook.serve, args.address, certificates, settings)
    except Exception as exc:
        return report_failure("webhook", exc)
    return 0


def device_plugin(args: argparse.Namespace) -> int:
    import asyncio

    from monitor.kubevirt import deviceplugin

    log.setup(args.log_level)
    config = deviceplugin.PluginConfig(resource=args.resource, plugin_dir=args.plugin_dir,
                                       socket_dir=args.socket_dir, devices=args.devices)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(deviceplugin.run(config))
    return 0
