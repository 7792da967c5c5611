"""One lease as the admin's templates show it."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from ..engine.items import USER_KEY, LeaseInfo
from ..management import formatting as fmt


def _json_value(value: Any) -> str:
    """A raw item's binary attribute (``B``, ``BS``) in the JSON shown: base64, as DynamoDB's JSON has it."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return repr(value)


@dataclass
class Row:
    """One lease as the templates show it (everything is escaped by the templates)."""

    info: LeaseInfo
    state: str
    what: str
    user: str
    where: str
    metadata: list[tuple[str, str]]
    acquired_ago: str
    expires: str
    left: float  # seconds of lease left by our clock (0 once past)
    left_percent: int
    lease_seconds: str
    detail_url: str = ""
    break_url: str = ""
    task_id: str = ""  # a Celery task's id (django_dynlock.celery): shown with the task's name
    election: str = ""  # the election whose term this is (client.election): a badge by the holder
    term_age: str = ""  # how long the term has lasted, while it is held
    # A semaphore's holder: its slot, and on the first of its key's rows the title above
    # them ("export:acme 3/5"). Slot 1 and up have no page of their own: breaklock --token.
    slot: int | None = None
    group: str = ""

    @property
    def key(self) -> str:
        return self.info.key

    @property
    def token(self) -> int | None:
        return self.info.token

    @property
    def state_label(self) -> str:
        return str(fmt.STATE_LABELS.get(self.state, self.state))

    @property
    def broken_why(self) -> str:
        return fmt.broken_why(self.info)

    @property
    def breakable(self) -> bool:
        return self.info.is_breakable and not self.slot

    @property
    def has_page(self) -> bool:
        """Its key's page shows it: not a semaphore's holder in slot 1 and up."""
        return not self.slot


def make_row(info: LeaseInfo, now: dt.datetime) -> Row:
    state = fmt.state(info, now)
    left = info.expires_in(now) if info.is_held else None
    seconds = info.lease_seconds or 0.0
    percent = 0
    if left is not None and left > 0 and seconds > 0:
        percent = max(0, min(100, round(100 * left / seconds)))
    what_key = info.what_key()
    return Row(
        info=info,
        state=state,
        what=info.holder.get(what_key, "") if what_key else "",
        user=info.holder.get(USER_KEY, ""),
        where=info.where(),
        metadata=fmt.metadata(info),
        acquired_ago=fmt.ago(info.acquired_at, now),
        expires=fmt.expires(info, now),
        left=max(0.0, left or 0.0),
        left_percent=percent,
        lease_seconds=fmt.duration(seconds) if seconds else "-",
        task_id=info.holder.get("task_id", "") if what_key == "task" else "",
        election=fmt.election(info) or "",
        term_age=fmt.duration(age) if (age := fmt.term_age(info, now)) is not None else "",
    )


def raw_json(info: LeaseInfo) -> str:
    """The item as stored, for the detail page."""
    return json.dumps(info.raw, indent=2, sort_keys=True, ensure_ascii=False, default=_json_value)
