"""The `fhmon` command line: serve, launch, keygen, probe, status, check."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
from typing import Any

import trio

from monitor import __version__, log, signing
from monitor import config as cfg

DEFAULT_SOCKET = cfg.embedded_default().socket


def _serve(args: argparse.Namespace) -> int:
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
            _prepare_embedded(config)
        except (OSError, signing.KeyDirError) as exc:
            print(f"fhmon serve: cannot prepare {config.state_dir}: {exc}", file=sys.stderr)
            return 1
    log.setup(config.log_level)
    try:
        keys = signing.KeyRing.load(config.key_dir)
    except signing.KeyDirError as exc:
        print(f"fhmon serve: {exc}", file=sys.stderr)
        return 2
    for pattern in cfg.unmatched_globs(config.allow):
        log.event("allow_matches_nothing", logging.WARNING, glob=pattern,
                  hint="no share can be registered under it until a directory matching it "
                       "exists; check it for typos")
    service = Service(config, keys)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
                await nursery.start(service.serve)
                async for sig in sigs:
                    if sig == signal.SIGHUP:
                        service.reload_keys()
                        continue
                    log.event("stopping", signal=signal.Signals(sig).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except Exception as exc:  # a start-up failure: say what and where
        leaves = _leaves(exc)
        for leaf in leaves:
            print(f"fhmon serve: {leaf}", file=sys.stderr)
        return 1
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _prepare_embedded(config: cfg.Config) -> None:
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


def _demo(args: argparse.Namespace) -> int:
    from monitor.demo import run_demo

    return run_demo()


def _keeper(args: argparse.Namespace) -> int:
    from monitor.keeper import Keeper

    log.setup(args.log_level)
    keeper = Keeper(args.socket)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                await nursery.start(keeper.serve)
                async for _ in sigs:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)
    return 0


def _keygen(args: argparse.Namespace) -> int:
    try:
        key_id = signing.keygen(args.key_dir, make_signer=not args.no_sign)
    except (OSError, signing.KeyDirError) as exc:
        print(f"fhmon keygen: {exc}", file=sys.stderr)
        return 1
    print(f"{key_id:08x}")
    return 0


def _key(args: argparse.Namespace) -> int:
    """fhmon key list|use|retire: the rotation steps of docs/operations.md."""
    try:
        if args.action == "list":
            ring = signing.KeyRing.load(args.key_dir)
            for info in ring.describe():
                print(f"{info.key_id:08x}{'  signing' if info.signing else ''}")
            return 0
        if args.key_id is None:
            print(f"fhmon key {args.action}: give a key id", file=sys.stderr)
            return 2
        if not re.fullmatch(r"[0-9a-fA-F]{8}", args.key_id):
            print(f"fhmon key {args.action}: {args.key_id!r} is not a valid key id: give its "
                  f"8 hex digits, as `fhmon key list --key-dir {args.key_dir}` shows them",
                  file=sys.stderr)
            return 2
        key_id = int(args.key_id, 16)
        if not os.path.exists(os.path.join(args.key_dir, f"{key_id:08x}.key")):
            print(f"fhmon key {args.action}: unknown key id {key_id:08x}: no "
                  f"{key_id:08x}.key in {args.key_dir} (see `fhmon key list`)", file=sys.stderr)
            return 1
        if args.action == "use":
            signing.set_signer(args.key_dir, key_id)
        else:
            signing.retire(args.key_dir, key_id)
    except (OSError, ValueError, signing.KeyDirError) as exc:
        print(f"fhmon key {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def _launch(args: argparse.Namespace) -> int:
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


def _ask(socket_path: str, request: Any, timeout: float) -> Any:
    from protocol import native

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(native.encode(request))
        decoder = native.FrameDecoder()
        while (message := decoder.next_message()) is None:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("fhmon closed the connection")
            decoder.feed(data)
        return message


def _ask_json(command: str, args: argparse.Namespace, request: Any) -> Any:
    """Send one request, return the decoded JSON answer; None (reported) on failure."""
    from protocol import native

    try:
        return json.loads(_ask(args.socket, request, args.timeout).json)
    except (OSError, native.ProtocolError, ValueError, AttributeError) as exc:
        print(f"fhmon {command}: {args.socket}: {exc}", file=sys.stderr)
        return None


def _probe(args: argparse.Namespace) -> int:
    from protocol import native

    health = _ask_json("probe", args, native.Ping())
    if health is None:
        return 1
    print(json.dumps(health))
    return 0 if health.get("ok") else 1


def _status(args: argparse.Namespace) -> int:
    from protocol import native

    status = _ask_json("status", args, native.StatusRequest())
    if status is None:
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"fhmon pid {status['pid']}, signer {status['signer']}, keys {status['keys']}, "
          f"{status['fds']} fds")
    print(f"{'ID':>4} {'PID':>8} {'CALLS':>8}  SHARE")
    for t in status["targets"]:
        print(f"{t['id']:>4} {t['pid']:>8} {t['calls']:>8}  {t['share']}")
    for syscall, results in status["counters"].items():
        print(f"{syscall}: " + ", ".join(f"{k}={v}" for k, v in sorted(results.items())))
    return 0


def _check(args: argparse.Namespace) -> int:
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


def _inject(args: argparse.Namespace) -> int:
    from monitor.kubevirt import inject

    source = sys.stdin.buffer if args.filename == "-" else None
    try:
        if source is None:
            with open(args.filename, "rb") as f:
                data = f.read()
        else:
            data = source.read()
        text = inject.inject(data.decode("utf-8"), inject.Settings(image=args.image))
    except (OSError, UnicodeDecodeError, inject.InjectError) as exc:
        print(f"fhmon inject: {args.filename}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


def _install_launcher(args: argparse.Namespace) -> int:
    from monitor.kubevirt import bundle

    try:
        made = bundle.install_launcher(args.directory)
    except (OSError, bundle.BundleError) as exc:
        print(f"fhmon install-launcher: {args.directory}: {exc}", file=sys.stderr)
        return 1
    print(f"fhmon install-launcher: {made.size // 2**20} MiB in {made.root}: "
          f"{', '.join(made.packages)}", file=sys.stderr)
    return 0


def _webhook(args: argparse.Namespace) -> int:
    from monitor.kubevirt import inject, webhook

    log.setup(args.log_level)
    try:
        certificates = webhook.CertificateFiles(args.tls_cert, args.tls_key)
    except (OSError, ValueError) as exc:
        print(f"fhmon webhook: {exc}", file=sys.stderr)
        return 2
    settings = inject.Settings(image=args.image)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                await nursery.start(webhook.serve, args.address, certificates, settings)
                async for _ in sigs:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except Exception as exc:
        for leaf in _leaves(exc):
            print(f"fhmon webhook: {leaf}", file=sys.stderr)
        return 1
    return 0


def _device_plugin(args: argparse.Namespace) -> int:
    import asyncio

    from monitor.kubevirt import deviceplugin

    log.setup(args.log_level)
    config = deviceplugin.PluginConfig(resource=args.resource, plugin_dir=args.plugin_dir,
                                       socket_dir=args.socket_dir, devices=args.devices)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(deviceplugin.run(config))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fhmon", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fhmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the monitor service (root, foreground)")
    serve.add_argument("--socket", metavar="PATH",
                       help="unix socket clients register on (plain `fhmon serve`: "
                       f"{DEFAULT_SOCKET})")
    serve.add_argument("--key-dir", dest="key_dir", metavar="DIR",
                       help="directory of signing keys (`fhmon keygen` makes one)")
    serve.add_argument("--allow", action="append", metavar="GLOB",
                       help="host directories that may be registered as share roots "
                       "(repeatable; /, system directories and key directories are refused)")
    serve.add_argument("--config", metavar="FILE", help="TOML config file; flags override it")
    serve.add_argument("--socket-mode", dest="socket_mode", metavar="OCTAL",
                       help='socket permissions, e.g. 0600 (default) or 0660 with '
                       '--socket-group; in TOML a string: socket_mode = "0660"')
    serve.add_argument("--socket-owner", dest="socket_owner", metavar="USER",
                       help="user (name or uid) owning the socket")
    serve.add_argument("--socket-group", dest="socket_group", metavar="GROUP",
                       help="group (name or gid) of the socket, for unprivileged clients")
    serve.add_argument("--log-level", dest="log_level", metavar="LEVEL",
                       help="debug, info (default), warning or error: JSON log lines on "
                       "stderr from this level up")
    serve.add_argument("--metrics-address", dest="metrics_address", metavar="HOST:PORT",
                       help="serve Prometheus /metrics there (default: off)")
    serve.add_argument("--sandbox", action="store_const", const=True, default=None,
                       help="run fhmon itself under a seccomp allow-list after start-up")
    serve.add_argument("--keeper", dest="keeper_socket", metavar="SOCKET",
                       help="deposit OCI-registered listeners with `fhmon keeper` there and "
                       "take them back at start-up, so they survive restarts")
    serve.add_argument("--state-dir", dest="state_dir", default=cfg.DEFAULT_STATE_DIR,
                       help="where plain `fhmon serve` keeps its socket, keys and shares")
    serve.add_argument("--print-config", action="store_true",
                       help="print the effective configuration and exit")
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="see fhmon work: a private fhmon, a handle, a forgery "
                          "and an escape refused")
    demo.set_defaults(func=_demo)

    keeper = sub.add_parser("keeper", help="hold listener copies across fhmon restarts")
    keeper.add_argument("--socket", required=True, metavar="PATH",
                        help="unix socket fhmon serve --keeper deposits listeners on")
    keeper.add_argument("--log-level", dest="log_level", default="info", metavar="LEVEL",
                        help="debug, info (default), warning or error")
    keeper.set_defaults(func=_keeper)

    keygen = sub.add_parser("keygen", help="add a signing key to a key directory")
    keygen.add_argument("--key-dir", dest="key_dir", required=True, metavar="DIR",
                        help="key directory (created 0700 if missing)")
    keygen.add_argument("--no-sign", action="store_true",
                        help="add the key for verification only (do not make it the signer)")
    keygen.set_defaults(func=_keygen)

    key = sub.add_parser("key", help="list keys, switch the signer, retire a key")
    key.add_argument("action", choices=["list", "use", "retire"],
                     help="list the keys, make KEY_ID the signer, or remove KEY_ID")
    key.add_argument("key_id", nargs="?", help="8 hex digits (use and retire)")
    key.add_argument("--key-dir", dest="key_dir", required=True, metavar="DIR",
                     help="key directory")
    key.set_defaults(func=_key)

    launch = sub.add_parser("launch", help="run CMD under the filter, registered with fhmon")
    launch.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                        help=f"fhmon's socket (default {DEFAULT_SOCKET}, as plain "
                        f"`fhmon serve`)")
    launch.add_argument("--share", required=True, metavar="DIR",
                        help="the directory CMD shares (virtiofsd's --shared-dir); it must "
                        "match one of fhmon's --allow globs")
    launch.add_argument("--user", metavar="USER[:GROUP]",
                        help="user and group (names or ids) to run CMD as")
    launch.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command to run, usually virtiofsd with its full path")
    launch.set_defaults(func=_launch)

    check = sub.add_parser("check", help="report kernel support, capabilities, key and "
                           "socket dirs; exit non-zero naming what is missing")
    check.add_argument("--key-dir", dest="key_dir", metavar="DIR",
                       help="also check this key directory (keys load, modes private)")
    check.add_argument("--socket", metavar="PATH",
                       help="also check the directory this socket will be created in")
    check.add_argument("--allow", action="append", metavar="GLOB",
                       help="also check these allow globs (refused ones, ones matching "
                       "nothing)")
    check.set_defaults(func=_check)

    inject = sub.add_parser("inject", help="print a manifest with KubeVirt's virtiofs "
                            "containers of PVC volumes put under fhmon (offline)")
    inject.add_argument("-f", "--filename", required=True, metavar="FILE",
                        help="YAML or JSON (one document, several, or a List); - for stdin")
    inject.add_argument("--image", default="fhmon",
                        help="the fhmon image the launcher is copied from (default: fhmon)")
    inject.set_defaults(func=_inject)
    hook = sub.add_parser("webhook", help="serve the mutating admission webhook that puts "
                          "virt-launcher pods' virtiofs containers under fhmon")
    hook.add_argument("--address", default="0.0.0.0:8443", help="HOST:PORT (default %(default)s)")
    hook.add_argument("--tls-cert", dest="tls_cert", required=True, metavar="FILE",
                      help="PEM certificate (chain); re-read when the file changes")
    hook.add_argument("--tls-key", dest="tls_key", required=True, metavar="FILE",
                      help="PEM private key of --tls-cert; re-read with it")
    hook.add_argument("--image", default="fhmon",
                      help="the fhmon image the injected init container runs")
    hook.add_argument("--log-level", dest="log_level", default="info",
                      help="debug, info, warning or error (default %(default)s)")
    hook.set_defaults(func=_webhook)
    plugin = sub.add_parser("device-plugin", help="kubelet device plugin whose resource "
                            "mounts fhmon's socket directory into a container")
    plugin.add_argument("--resource", default="devices.kubevirt.io/fhmon",
                        help="the extended resource to advertise (default %(default)s)")
    plugin.add_argument("--plugin-dir", dest="plugin_dir",
                        default="/var/lib/kubelet/device-plugins",
                        help="the kubelet's device-plugins directory (kubelet.sock)")
    plugin.add_argument("--socket-dir", dest="socket_dir", default="/var/run/kubevirt/fhmon",
                        help="fhmon's socket directory, mounted at the same path")
    plugin.add_argument("--devices", type=int, default=1000,
                        help="how many containers per node may hold the resource")
    plugin.add_argument("--log-level", dest="log_level", default="info",
                        help="debug, info, warning or error (default %(default)s)")
    plugin.set_defaults(func=_device_plugin)
    install = sub.add_parser("install-launcher", help="copy a self-contained `fhmon launch` "
                             "into DIRECTORY (the injected init container runs this)")
    install.add_argument("directory", help="where to copy it (the launcher emptyDir)")
    install.set_defaults(func=_install_launcher)

    for name, func, text in (("probe", _probe, "health check: exit 0 if fhmon answers"),
                             ("status", _status, "show registered targets and counters")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                       help=f"fhmon's socket (default {DEFAULT_SOCKET}, as plain "
                       f"`fhmon serve`)")
        p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                       help="give up after this long (default 5)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print JSON, for tools")
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`fhmon status | head -1`): stop quietly, as a program that
        # SIGPIPE killed would, and keep the interpreter from flushing into the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
