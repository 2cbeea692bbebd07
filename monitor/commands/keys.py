"""`fhmon keygen` and `fhmon key list|use|retire`: the rotation steps of docs/operations.md."""

from __future__ import annotations

import argparse
import os
import re
import sys

from monitor import signing


def keygen(args: argparse.Namespace) -> int:
    try:
        key_id = signing.keygen(args.key_dir, make_signer=not args.no_sign)
    except (OSError, signing.KeyDirError) as exc:
        print(f"fhmon keygen: {exc}", file=sys.stderr)
        return 1
    print(f"{key_id:08x}")
    return 0


def key(args: argparse.Namespace) -> int:
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
