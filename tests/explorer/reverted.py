"""Issue 29's fixes reverted, for the explorer's tests only: each test replays a schedule
that breaks an invariant with its fix reverted and passes with it (test_explorer.py).

What the engine sends can be reverted at the wire (``WIRE``: each request rewritten into
what the engine sent before the fix); what it decides inside a process is reverted by
patching in the code from before the fix, copied from git history (``PATCHES``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from django_dynlock.engine import handover as handover_module
from django_dynlock.engine import requests as rq
from django_dynlock.engine.clock import ServerClock, monotonic
from django_dynlock.engine.handover import Handover, Handovers
from django_dynlock.engine.holding import Keeper
from django_dynlock.engine.lease import Lease
from django_dynlock.engine.stamps import Stamper

Rewrite = Callable[[str, dict[str, Any]], dict[str, Any]]


def _conditions(fix: str) -> Rewrite:
    def rewrite(operation: str, params: dict[str, Any]) -> dict[str, Any]:
        params = copy.deepcopy(params)
        for update in [entry["Update"] for entry in params.get("TransactItems", [])] or [params]:
            for old, new in CONDITIONS[fix]:
                if "ConditionExpression" in update:
                    update["ConditionExpression"] = update["ConditionExpression"].replace(old, new)
        return params

    return rewrite


# Fixes of earlier rounds, reverted at the wire by a change of the condition.
CONDITIONS = {
    # Findings 1 and 2: renewals and acquire retries conditioned on the owner only, so a
    # delayed one could land after a later one and move the expiry (or the rvn) back.
    "ordered-writes": [("#owner = :me AND #seq < :seq", "#owner = :me")],
    # Finding 5: no release-slot guard, so an attempt landing after its undo holds the key.
    "release-slots": [
        ("OR NOT contains(#slot, :tag))", "OR NOT contains(#slot, :tag) OR attribute_not_exists(#owner))")
    ],
    # Issue 29 (3): an acquire sent before its client knew DynamoDB's clock could start a
    # new fencing counter, from the base it carries: its host's wall clock (commit 348c132).
    "fence-base": [(" AND attribute_exists(#fence)", "")],
}


def _release_handover_on_owner_only(operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """Issue 29 (4): release_handover conditioned on the owner id only, so it ended an
    adopter's lease too (commit fc3eff1)."""
    if params.get("ConditionExpression") != "#owner = :me AND #seq = :handed":
        return params
    params = copy.deepcopy(params)
    params["ConditionExpression"] = "#owner = :me"
    del params["ExpressionAttributeValues"][":handed"]
    del params["ExpressionAttributeNames"]["#seq"]
    return params


WIRE: dict[str, Rewrite] = {fix: _conditions(fix) for fix in CONDITIONS}
WIRE["handover-seq"] = _release_handover_on_owner_only


def _observe_resetting(self: ServerClock, sent: float, received: float, date: float | None) -> None:
    """Issue 29 (1): ServerClock.observe before commit d606329: a reply outside the bounds
    replaced them, so one disagreeing Date reset the client's clock."""
    with self._lock:
        self.replies += 1
    if date is None or received < sent:
        return
    low, high = date - received, date + 1.0 - sent
    with self._lock:
        if self._low is None or self._high is None:
            self._low, self._high = (low, received), (high, received)
            return
        cur_low, cur_high = self._offset_bounds(received)
        if low >= cur_high or high <= cur_low:
            # The server's clock moved against ours by more than the interval allows.
            self.jumps += 1
            self._low, self._high = (low, received), (high, received)
            return
        self._low = (max(cur_low, low), received)
        self._high = (min(cur_high, high), received)


def _adopt_remote_unstamped(self: Handovers, handover: Handover, stored: str, lease_seconds: float) -> Lease:
    """Issue 29 (4): Handovers._adopt_remote (then HandingOver's) before commit fc3eff1: stamped by this host's
    wall clock when its first read got no answer, never restamped, and returned even if the
    lease had ended by then."""
    seq = handover.seq + 1
    rvn = handover_module.uuid.uuid4().hex
    self.stamper.learn_clock(stored)
    sent = monotonic()
    stamp = self.stamper.stamp(sent)
    request = rq.adopt(
        self.options,
        stored,
        owner=handover.owner,
        token=handover.token,
        handed_seq=handover.seq,
        rvn=rvn,
        seq=seq,
        lease_seconds=lease_seconds,
        stamp=stamp,
        host=handover_module.socket.gethostname(),
        pid=handover_module.os.getpid(),
        thread=handover_module.threading.current_thread().name,
        watch_only=self.stamper.watch_only(),
    )
    try:
        reply = self.store.call("update_item", "adopt a handed-over lease", ReturnValues="ALL_NEW", **request)
        item = reply.get("Attributes", {})
    except handover_module.ClientError as exc:
        item = self.store.old_item(exc, stored) or {}
        if not (
            item.get(handover_module.it.OWNER, {}).get("S") == handover.owner
            and item.get(handover_module.it.RVN, {}).get("S") == rvn
        ):
            raise self._not_adopted(handover, item) from None
    info = self.keeper.info(item)
    return Lease(
        self.client,
        keeper=self.keeper,
        key=handover.key,
        stored_key=stored,
        owner=handover.owner,
        token=handover.token,
        lease_seconds=lease_seconds,
        sent_at=sent,
        ends_at=self.stamper.holder_end(sent, lease_seconds, stamp + lease_seconds),
        seq=seq,
        holder=dict(info.holder) if info is not None else None,
    )


_release_remote = Keeper.release_remote


def _release_remote_unreported(self: Keeper, lease: Lease, *, quiet: bool, **options: Any) -> None:
    """Issue 29 (5): a release retried in the background (``quiet``) that found the lease
    taken over or broken only disowned it, before commit 6b5d1b9: no lost event, no WARNING."""
    if not quiet:
        return _release_remote(self, lease, quiet=quiet, **options)
    emit = self.events.emit

    def unreported(event: str, *args: Any, **info: Any) -> None:
        if event != "lost":
            emit(event, *args, **info)

    with mock.patch.object(self.events, "emit", unreported):
        return _release_remote(self, lease, quiet=quiet, **options)


PATCHES: dict[str, list[tuple[type, str, Any]]] = {
    "clock-outliers": [(ServerClock, "observe", _observe_resetting)],
    # Issue 29 (2), before commit 66f9b45: no read before a client's first write, and a
    # client whose replies carry no Date stamped its expiry by its wall clock. Its fence base
    # too, as before (3) (348c132), which needs that read to start a counter at all.
    "date-less": [
        (Stamper, "clock_unread", lambda self: False),
        (Stamper, "watch_only", lambda self: False),
        (Stamper, "fence_base", lambda self, stamp: stamp),
    ],
    "adopt-restamp": [(Handovers, "_adopt_remote", _adopt_remote_unstamped)],
    "release-lost": [(Keeper, "release_remote", _release_remote_unreported)],
}

FIXES = sorted([*WIRE, *PATCHES])


@contextlib.contextmanager
def reverted(fix: str | None) -> Iterator[Rewrite | None]:
    """The engine with ``fix`` reverted (None: as it is): yields the wire's rewrite, if any."""
    if fix is not None and fix not in FIXES:
        raise ValueError(f"no such fix to revert: {fix!r} (one of {', '.join(FIXES)})")
    with contextlib.ExitStack() as stack:
        for owner, name, old in PATCHES.get(fix or "", []):
            stack.enter_context(mock.patch.object(owner, name, old))
        yield WIRE.get(fix or "")
