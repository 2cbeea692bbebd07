"""What the tests build on: the world tree, a running fhmon, target agents, raw intake
clients and handle shorthands. conftest.py only turns these into fixtures.

- world.py: World and build_world, NOBODY, FHMON, SYSTEM_PYTHON, wait_until, ready and readable,
  thread_syscalls, nobodys_directory, deep_directory (a chain of directories deeper than PATH_MAX),
  lease_break_time
- service.py: Service (a `fhmon serve`), Runner and unprivileged_runner (fhmon as uid 65534)
- agent.py: Agent, the driver of target_agent.py (the target program itself), and
  NamespaceAgent (through `unshare -Urm`)
- listeners.py, handles.py, mounts.py: filtered children and raw intake messages, the
  N2HResult of a name_to_handle_at (and signed_handle_args, key_id_of), mounts for a
  test's lifetime
- load.py: a busy target across fhmon restarts; keeper.py: a `fhmon keeper` process
- pids.py: reuse_number, a freed pid or thread id handed to a new task of the test's choosing
- oci_runtime.py: a stand-in OCI runtime (`python -m tests.support.oci_runtime`)
- kubevirt.py: the virt-launcher pod, the launcher bundle, the webhook on loopback TLS
- http_attack.py: connections held open against the HTTP endpoint (tests and bench)
- plane_target.py: a real target served by a monitor._native.Plane in the test's process
- native_hooks.py: require_test_hooks, for the tests that call the extension's test hooks
"""

from tests.support.agent import Agent
from tests.support.service import Runner, Service, unprivileged_runner
from tests.support.world import (
    FHMON,
    NOBODY,
    REPO,
    SYSTEM_PYTHON,
    World,
    build_world,
    readable,
    thread_syscalls,
    wait_until,
)

__all__ = ["FHMON", "NOBODY", "REPO", "SYSTEM_PYTHON", "Agent", "Runner", "Service", "World",
           "build_world", "readable", "thread_syscalls", "unprivileged_runner", "wait_until"]
