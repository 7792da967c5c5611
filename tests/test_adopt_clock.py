"""``adopt()`` in a fresh process stamps by DynamoDB's clock, as acquire does, whatever the
process' wall clock says, and never hands out a lease that has already ended (issue 29).

Before, a fresh worker a minute slow stamped the adopted lease a minute in the past (the
key was free to anyone while it believed it held it), and one a minute fast stamped it
66 s ahead. The adopter reaches the server through a fault proxy that can reset its first
read, so that its adopt goes out before it knows DynamoDB's clock.
"""

from __future__ import annotations

import json
import time

import pytest

from localdynamo.faultproxy import FaultProxy
from tests.support.clients import client_for
from tests.support.polling import wait_for
from tests.test_takeover import lines, scenario  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

LEASE = 6.0  # heartbeats 1.5 s apart: the adopt's own stamp is what the test reads


@pytest.mark.parametrize("first_read", ["answered", "lost"])
@pytest.mark.parametrize("offset", [-60.0, 60.0], ids=["adopter-60s-slow", "adopter-60s-fast"])
def test_a_fresh_process_adopts_by_dynamodbs_clock(scenario, server, offset, first_read):  # noqa: F811
    giver = client_for(server.endpoint_url, scenario.table)
    probe = client_for(server.endpoint_url, scenario.table)
    try:
        handover = giver.acquire("k").hand_over(keep=20)
        with FaultProxy(server.endpoint_url, max_seconds=60) as link:
            if first_read == "lost":
                link.add_fault("reset", operation="GetItem")
            report = scenario.start(
                "adopt",
                "adopter",
                offset=offset,
                seconds=4,
                key=json.dumps(handover.as_dict()),
                endpoint=link.endpoint_url,
                lease=LEASE,
            )
            words = wait_for(lambda: [w for w in lines(report) if w[0] in ("ADOPTED", "REFUSED")], 30, "the adoption")
            assert words[0] == ["ADOPTED", str(handover.token)], words
            info = probe.get("k")
            now = time.time()
            assert info is not None and info.owner == handover.owner
            stored = info.expires_at.timestamp()
            assert now + 1.0 <= stored <= now + LEASE + 1.5, (
                f"adopted lease stored to expire {stored - now:+.1f}s from now"
            )
            assert probe.try_acquire("k") is None, "the key of a held adopted lease was free"
            scenario.children[-1].wait(30)
        beliefs = [w[0] for w in lines(report) if w[0] in ("HELD", "LOST")]
        assert beliefs and set(beliefs) == {"HELD"}
    finally:
        giver.close()
        probe.close()
