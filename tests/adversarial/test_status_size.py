"""STATUS with more targets than one frame holds.

The status reply was one frame and outgrew the 16 KiB limit at ~70 targets: fhmon dropped
the connection, so `fhmon status` (what an operator looks at during an incident) failed
exactly when a node was busiest. Now STATUS is answered in pages of one frame each.
"""

from __future__ import annotations

import json
import subprocess

from tests.adversarial.common import EXHAUSTION
from tests.adversarial.recording import Recorder
from tests.support import FHMON, Service, World
from tests.support.listeners import registered_children

TARGETS = 120


def test_status_with_more_targets_than_a_frame_holds(fhmon: Service, world: World,
                                                     record: Recorder) -> None:
    with registered_children(fhmon.socket, str(world.main), TARGETS) as children:
        res = subprocess.run([FHMON, "status", "--socket", fhmon.socket, "--json"],
                             capture_output=True, text=True, timeout=60)
        listed = ({t["pid"] for t in json.loads(res.stdout)["targets"]}
                  if res.returncode == 0 else set())
        mine = {c.pid for c in children}
        record(EXHAUSTION, f"`fhmon status` with {TARGETS} more targets registered (the "
               "reply outgrew its 16 KiB frame at ~70)", "exit 0, every target listed",
               f"exit {res.returncode}, {len(listed & mine)} of {TARGETS} listed"
               + (f": {res.stderr.strip()[:80]}" if res.returncode else ""),
               ok=res.returncode == 0 and mine <= listed)
