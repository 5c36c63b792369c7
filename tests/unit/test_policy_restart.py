"""A restarted policy engine decides again within seconds (issue 10, item 3: fail-over).

It keeps its identity over a restart in place: the same static group member (no
wait for its dead self's session) and the same lease holder (no wait for the
lease to expire). Before, both waited: the lease TTL, then the session timeout.
"""

from __future__ import annotations

from pathlib import Path

from graylane.kafka.membership import claim_instance
from graylane.policy_engine.logic.lease import Lease, holds, next_claim
from graylane.policy_engine.service import PolicyConfig, create_app
from graylane.settings import Settings


def test_the_faust_consumer_is_a_static_member_with_a_short_session() -> None:
    app = create_app(Settings(), PolicyConfig(instance_id="policy-h-0"))
    assert app.conf.consumer_group_instance_id == "policy-h-0"
    assert app.conf.broker_session_timeout <= 10.0  # a standby's take-over: <= 10 s
    assert app.conf.broker_heartbeat_interval * 3 <= app.conf.broker_session_timeout
    dynamic = create_app(Settings(), PolicyConfig())
    assert dynamic.conf.consumer_group_instance_id is None


def test_a_restart_in_place_holds_its_lease_on_at_once(tmp_path: Path) -> None:
    before = claim_instance("policy", "p-policy", host="h", lock_dir=tmp_path)
    lease = Lease(holder=before.instance_id, term=4, expires_ms=10_000)
    before.release()  # kill -9: the kernel drops the lock
    after = claim_instance("policy", "p-policy", host="h", lock_dir=tmp_path)
    assert after.instance_id == before.instance_id
    claim = next_claim(lease, after.instance_id, 5_000, 6_000)
    assert claim is not None and claim.term == 4  # a renewal, not a wait for expiry
    assert holds(lease, after.instance_id, 5_000)
    after.release()


def test_a_second_live_engine_gets_another_identity(tmp_path: Path) -> None:
    one = claim_instance("policy", "p-policy", host="h", lock_dir=tmp_path)
    two = claim_instance("policy", "p-policy", host="h", lock_dir=tmp_path)
    assert one.instance_id != two.instance_id  # never fenced, never two lease holders
    one.release()
    two.release()
