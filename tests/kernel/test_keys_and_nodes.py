"""Key rotation under load, retired keys, and two fhmon instances standing for two nodes."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

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


def _add_keys(key_dir: Path, count: int) -> list[Path]:
    """count valid verify-only keys, each written atomically (as `fhmon keygen` does)."""
    from monitor import signing

    added = []
    for n in range(count):
        path = key_dir / f"{0x7e000000 + n:08x}.key"
        tmp = key_dir / f".{path.name}.tmp"
        tmp.write_text(signing.key_file_text(os.urandom(signing.MIN_KEY_BYTES)))
        tmp.chmod(0o600)
        tmp.rename(path)
        added.append(path)
    return added


def _probe(service: Service, *extra: str) -> int:
    return _probe_run(service, *extra).returncode


def _probe_run(service: Service, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FHMON, "probe", "--socket", service.socket, *extra],
                          capture_output=True, text=True)


def _reload_failed(service: Service, words: str) -> bool:
    return any(e.get("event") == "keys_reload_failed" and words in e.get("error", "")
               for e in service.events())


def test_too_many_keys_are_refused_and_the_old_keys_serve(world: World) -> None:
    """20,000 valid keys once made the reload fail to lock their memory and `fhmon serve`
    exit. More than MAX_KEYS is now a refusal like any bad key directory: the ring in use
    stays, the key-directory health goes to 0, and a start-up says why."""
    from monitor import signing

    with Service(world.base, [str(world.shares / "*")], name="many-keys") as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            handle = signed_handle_args(agent, "file")
            signer = key_id_of(handle)
            added = _add_keys(service.key_dir, signing.MAX_KEYS)  # one more than the bound
            service.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
            assert wait_until(lambda: _reload_failed(service, f"at most {signing.MAX_KEYS}"),
                              30), service.log_text()[-2000:]
            assert service.proc.poll() is None  # type: ignore[union-attr]
            assert agent.call("obh", **handle)["errno"] == 0
            assert key_id_of(signed_handle_args(agent, "file")) == signer
            # readiness fails and names the limit; liveness holds (issue 37.3: a restart
            # would only stop at start-up on the same directory, in a loop)
            refused_probe = _probe_run(service)
            assert refused_probe.returncode == 1
            assert f"at most {signing.MAX_KEYS} are loaded" in refused_probe.stderr
            assert _probe(service, "--liveness") == 0
            for _ in range(3):  # the watcher's ticks pass: still the old keys, still serving
                time.sleep(1.1)
                assert agent.call("obh", **handle)["errno"] == 0
            assert key_id_of(signed_handle_args(agent, "file")) == signer
            try:
                started = Service(world.base, [str(world.shares / "*")],
                                  name="many-keys-start", key_dir=service.key_dir)
            except RuntimeError as refused:  # it exited, saying why
                assert f"at most {signing.MAX_KEYS} are loaded" in str(refused)
            else:
                started.stop()
                pytest.fail("fhmon serve started with more than MAX_KEYS keys")
            for path in added:
                path.unlink()
            assert wait_until(lambda: _probe(service) == 0, 30), service.log_text()[-3000:]
        finally:
            agent.close()


def test_a_ring_whose_memory_cannot_be_locked_keeps_the_old_keys(world: World,
                                                                  tmp_path: Path) -> None:
    """The native plane locks a page per key, counted against RLIMIT_MEMLOCK (fhmon keeps
    no CAP_IPC_LOCK): a reload it cannot lock used to end `fhmon serve` (ENOMEM out of the
    key watcher). Now it keeps the old ring, logs why, and reports the key directory
    unhealthy until the limit allows the new ring. Real mlock under a real limit, set on
    the running fhmon with prlimit."""
    native = tmp_path / "native.toml"
    native.write_text('data_plane = "native"\n')
    with Service(world.base, [str(world.shares / "*")], name="memlock",
                 extra=["--config", str(native)]) as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            handle = signed_handle_args(agent, "file")
            signer = key_id_of(handle)
            status = Path(f"/proc/{service.pid}/status").read_text()
            locked_kib = int(next(line.split()[1] for line in status.splitlines()
                                  if line.startswith("VmLck:")))
            assert locked_kib >= 4  # the ring in use: one locked page per key
            limits = resource.prlimit(service.pid, resource.RLIMIT_MEMLOCK)
            # room for one more page: the new ring's four keys cannot all be locked
            resource.prlimit(service.pid, resource.RLIMIT_MEMLOCK,
                             (locked_kib * 1024 + 4096, limits[1]))
            try:
                _add_keys(service.key_dir, 3)
                service.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
                assert wait_until(lambda: _reload_failed(service, "cannot lock"), 30), \
                    service.log_text()[-2000:]
                assert service.proc.poll() is None  # type: ignore[union-attr]
                assert agent.call("obh", **handle)["errno"] == 0
                assert key_id_of(signed_handle_args(agent, "file")) == signer
                assert _probe(service) == 1
            finally:
                resource.prlimit(service.pid, resource.RLIMIT_MEMLOCK, limits)
            service.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
            assert wait_until(lambda: _probe(service) == 0, 30)
            assert agent.call("obh", **handle)["errno"] == 0
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
