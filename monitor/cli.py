"""The `fhmon` command line: serve, launch, keygen, probe, status, check."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from monitor import __version__
from monitor import config as cfg
from monitor.commands import ask, daemons, keys, kubevirt, node
from monitor.kubevirt.containers import DEFAULT_IMAGE, DEFAULT_RESOURCE

DEFAULT_SOCKET = cfg.embedded_default().socket


def _client_socket(parser: argparse.ArgumentParser) -> None:
    """--socket of a command that talks to a running fhmon (default: plain `fhmon serve`'s)."""
    parser.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                        help=f"fhmon's socket (default {DEFAULT_SOCKET}, as plain "
                        f"`fhmon serve`)")


def _injection_options(parser: argparse.ArgumentParser) -> None:
    """What `inject` and `webhook` put into a pod (monitor/kubevirt/containers.Settings)."""
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help="the fhmon image the launcher is copied from (default "
                        "%(default)s, what deploy/ builds)")
    parser.add_argument("--runtime", choices=("containerd", "cri-o"), default="containerd",
                        help="the nodes' container runtime: whose RuntimeDefault the "
                        "injected container's seccomp profile replaces (default %(default)s)")
    parser.add_argument("--seccomp-default", dest="seccomp_default", action="store_true",
                        help="the kubelets run with --seccomp-default: a pod without a "
                        "seccomp profile runs under RuntimeDefault")


def _log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", dest="log_level", default="info",
                        help="debug, info, warning or error (default %(default)s)")


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
    serve.set_defaults(func=daemons.serve)

    demo = sub.add_parser("demo", help="see fhmon work: a private fhmon, a handle, a forgery "
                          "and an escape refused")
    demo.set_defaults(func=node.demo)

    keeper = sub.add_parser("keeper", help="hold listener copies across fhmon restarts")
    keeper.add_argument("--socket", required=True, metavar="PATH",
                        help="unix socket fhmon serve --keeper deposits listeners on")
    keeper.add_argument("--log-level", dest="log_level", default="info", metavar="LEVEL",
                        help="debug, info (default), warning or error")
    keeper.set_defaults(func=daemons.keeper)

    keygen = sub.add_parser("keygen", help="add a signing key to a key directory")
    keygen.add_argument("--key-dir", dest="key_dir", required=True, metavar="DIR",
                        help="key directory (created 0700 if missing)")
    keygen.add_argument("--no-sign", action="store_true",
                        help="add the key for verification only (do not make it the signer)")
    keygen.set_defaults(func=keys.keygen)

    key = sub.add_parser("key", help="list keys, switch the signer, retire a key")
    key.add_argument("action", choices=["list", "use", "retire"],
                     help="list the keys, make KEY_ID the signer, or remove KEY_ID")
    key.add_argument("key_id", nargs="?", help="8 hex digits (use and retire)")
    key.add_argument("--key-dir", dest="key_dir", required=True, metavar="DIR",
                     help="key directory")
    key.set_defaults(func=keys.key)

    launch = sub.add_parser("launch", help="run CMD under the filter, registered with fhmon")
    _client_socket(launch)
    launch.add_argument("--share", required=True, metavar="DIR",
                        help="the directory CMD shares (virtiofsd's --shared-dir); it must "
                        "match one of fhmon's --allow globs")
    launch.add_argument("--user", metavar="USER[:GROUP]",
                        help="user and group (names or ids) to run CMD as")
    node.add_launch_options(launch)
    launch.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command to run, usually virtiofsd with its full path")
    launch.set_defaults(func=node.launch)

    check = sub.add_parser("check", help="report kernel support, capabilities, key and "
                           "socket dirs; exit non-zero naming what is missing")
    check.add_argument("--key-dir", dest="key_dir", metavar="DIR",
                       help="also check this key directory (keys load, modes private)")
    check.add_argument("--socket", metavar="PATH",
                       help="also check the directory this socket will be created in")
    check.add_argument("--allow", action="append", metavar="GLOB",
                       help="also check these allow globs (refused ones, ones matching "
                       "nothing)")
    check.set_defaults(func=node.check)

    inject = sub.add_parser("inject", help="print a manifest with KubeVirt's virtiofs "
                            "containers of PVC volumes put under fhmon (offline)")
    inject.add_argument("-f", "--filename", required=True, metavar="FILE",
                        help="YAML or JSON (one document, several, or a List); - for stdin")
    _injection_options(inject)
    inject.set_defaults(func=kubevirt.inject)
    hook = sub.add_parser("webhook", help="serve the mutating admission webhook that puts "
                          "virt-launcher pods' virtiofs containers under fhmon")
    hook.add_argument("--address", default="0.0.0.0:8443", help="HOST:PORT (default %(default)s)")
    hook.add_argument("--tls-cert", dest="tls_cert", required=True, metavar="FILE",
                      help="PEM certificate (chain); re-read when the file changes")
    hook.add_argument("--tls-key", dest="tls_key", required=True, metavar="FILE",
                      help="PEM private key of --tls-cert; re-read with it")
    _injection_options(hook)
    _log_level(hook)
    hook.set_defaults(func=kubevirt.webhook)
    plugin = sub.add_parser("device-plugin", help="kubelet device plugin whose resource "
                            "mounts fhmon's socket directory into a container")
    plugin.add_argument("--resource", default=DEFAULT_RESOURCE,
                        help="the extended resource to advertise (default %(default)s)")
    plugin.add_argument("--plugin-dir", dest="plugin_dir",
                        default="/var/lib/kubelet/device-plugins",
                        help="the kubelet's device-plugins directory (kubelet.sock)")
    plugin.add_argument("--socket-dir", dest="socket_dir", default="/var/run/kubevirt/fhmon",
                        help="fhmon's socket directory, mounted at the same path")
    plugin.add_argument("--devices", type=int, default=1000,
                        help="how many containers per node may hold the resource")
    _log_level(plugin)
    plugin.set_defaults(func=kubevirt.device_plugin)
    profiles = sub.add_parser("install-seccomp-profiles", help="copy fhmon's seccomp profiles "
                              "for confined virtiofs containers into DIRECTORY (the DaemonSet "
                              "runs this for <kubelet seccomp root>/fhmon)")
    profiles.add_argument("directory", help="where to put them")
    profiles.add_argument("--from", dest="source", default="/usr/share/fhmon/seccomp",
                          metavar="DIR", help="the profiles to install (default %(default)s, "
                          "where the image has them)")
    profiles.set_defaults(func=kubevirt.install_seccomp_profiles)
    install = sub.add_parser("install-launcher", help="copy a self-contained `fhmon launch` "
                             "into DIRECTORY (the injected init container runs this)")
    install.add_argument("directory", help="where to copy it (the launcher emptyDir)")
    install.set_defaults(func=kubevirt.install_launcher)

    for name, func, text in (("probe", ask.probe, "health check: exit 0 if fhmon answers"),
                             ("status", ask.status, "show registered targets and counters")):
        p = sub.add_parser(name, help=text)
        _client_socket(p)
        p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                       help="give up after this long (default 5)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print JSON, for tools")
        else:
            p.add_argument("--liveness", action="store_true",
                           help="exit 0 whenever fhmon answers, even with a key error (a "
                           "restart cannot mend the key directory: it would stop at start-up)")
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
