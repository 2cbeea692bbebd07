"""Key rotation under load, retired keys, and two fhmon instances standing for two nodes."""

from __future__ import annotations

import errno
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import FHMON, Agent, Service, World, wait_until
from tests.support.handles import key_id_of, signed_handle_args


def fhmon_key(*args: str) -> str:
    out = subprocess.run([FHMON, "key", *args], capture_output=True, text=True, check=True)
    return out.stdout


def keygen(key_dir: Path, *extra: str) -> str:
    out = subprocess.run([FHMON, "keygen", "--key-dir", str(key_dir), *extra],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_rotation_runbook_under_load(world: World) -> None:
    """docs/operations.md: add key, switch signer, wait, retire; no restart, no failed call."""
    with Service(world.base, [str(world.shares / "*")], name="rotation") as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        busy = Agent(world, "fhmon", world.main, service.socket)
        try:
            old_key = fhmon_key("list", "--key-dir", str(service.key_dir)).split()[0]
            old_handle = signed_handle_args(agent, "file")
            assert key_id_of(old_handle) == old_key
            load: dict[str, Any] = {}
            done = world.base / "rotation.done"  # the load lasts the whole runbook, not a count
            worker = threading.Thread(target=lambda: load.update(busy.call(
                "hammer", op2="mix", path="dir/inner", obh=signed_handle_args(busy, "dir/inner"),
                until=str(done), threads=2)))
            worker.start()
            # 1. add a key that only verifies; 2. switch the signer to it
            new_key = keygen(service.key_dir, "--no-sign")
            fhmon_key("use", new_key, "--key-dir", str(service.key_dir))
            assert wait_until(lambda: key_id_of(signed_handle_args(agent, "file")) == new_key)
            new_handle = signed_handle_args(agent, "file")
            assert agent.call("obh", **old_handle)["errno"] == 0  # old handles still verify
            # 3. (wait for old handles to age out) 4. retire the old key
            fhmon_key("retire", old_key, "--key-dir", str(service.key_dir))
            assert wait_until(lambda: agent.call("obh", **old_handle)["errno"] == errno.ESTALE)
            assert agent.call("obh", **new_handle)["errno"] == 0
            time.sleep(0.2)  # the load goes on past the retirement
            done.touch()
            worker.join(timeout=120)
            assert load["ended_by_until"], "the load ended before the runbook did"
            # handles of the hammer were signed by the old key: they went stale at retirement,
            # which is the runbook's point; every call before that succeeded.
            assert set(load["results"]) <= {"0", str(errno.ESTALE)}, load
            reloads = [e for e in service.events() if e.get("event") == "keys_reloaded"]
            assert len(reloads) >= 2
        finally:
            agent.close()
            busy.close()


def test_sighup_reloads_and_a_broken_key_dir_keeps_the_old_keys(world: World) -> None:
    with Service(world.base, [str(world.shares / "*")], name="reload") as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            h = signed_handle_args(agent, "file")
            signer_file = service.key_dir / "signing-key-id"
            saved = signer_file.read_text()
            signer_file.write_text("zzzz\n")
            service.proc.send_signal(1)  # type: ignore[union-attr]
            assert wait_until(lambda: any(e.get("event") == "keys_reload_failed"
                                          for e in service.events()))
            assert agent.call("obh", **h)["errno"] == 0  # still serving with the old ring
            probe = subprocess.run([FHMON, "probe", "--socket", service.socket],
                                   capture_output=True, text=True)
            assert probe.returncode == 1 and "signing-key-id" in probe.stdout
            signer_file.write_text(saved)
            assert wait_until(lambda: subprocess.run(
                [FHMON, "probe", "--socket", service.socket], capture_output=True).returncode == 0)
        finally:
            agent.close()


def test_two_nodes_share_handles(world: World) -> None:
    """Two instances, same key dir, separate sockets: byte-identical handles, cross-opening."""
    keys_b = world.base / "node-b-keys"
    with Service(world.base, [str(world.shares / "*")], name="node-a") as node_a:
        shutil.copytree(node_a.key_dir, keys_b)  # the Secret mounted on another node
        with Service(world.base, [str(world.shares / "*")], name="node-b",
                     key_dir=keys_b) as node_b:
            on_a = Agent(world, "fhmon", world.main, node_a.socket)
            on_b = Agent(world, "fhmon", world.main, node_b.socket)
            try:
                for path in ("file", "dir", "dir/deep/leaf", "nobodys"):
                    from_a, from_b = signed_handle_args(on_a, path), signed_handle_args(on_b, path)
                    assert from_a == from_b, path  # virtiofsd compares the bytes after migration
                    opened = on_b.call("obh", **from_a)
                    assert opened["errno"] == 0, (path, opened)
                # a node with other keys refuses them
                with Service(world.base, [str(world.shares / "*")], name="node-c") as other:
                    stranger = Agent(world, "fhmon", world.main, other.socket)
                    try:
                        assert stranger.call(
                            "obh", **signed_handle_args(on_a, "file"))["errno"] == errno.ESTALE
                    finally:
                        stranger.close()
            finally:
                on_a.close()
                on_b.close()
