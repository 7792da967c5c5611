"""DynamoDB's clock, as one client can bound it from the ``Date`` header of the replies.

No host's wall clock is trusted for takeover. Every reply from DynamoDB (and from
DynamoDB Local, moto and dynalite) carries an HTTP ``Date`` header: the server's
clock, truncated to the second, at some instant while it handled the request. A
request sent at ``s`` and answered at ``r`` on this process' monotonic clock, with
``Date: D``, bounds the offset ``θ`` (server time = monotonic time + θ):

    D - r  <=  θ  <  D + 1 - s

Replies narrow the interval that the earlier ones left; replies that straddle a
second boundary narrow it to about one round trip. Between replies the bounds widen
by ``DRIFT`` per second, for the rates of the two clocks may differ a little. A
reply outside the interval means the server's clock jumped, or that this reply (or
the earlier ones) came from a front end or an intermediary with another clock: the
interval widens to cover both, and later replies narrow it again. A reply inside it
may come from another clock too, so no reply narrows it alone: a bound moves inwards
only as far as this reply and the one before it both allow. One lone outlier can then
widen the interval but never narrow it past DynamoDB's clock; two replies in a row
from one other clock are believed (docs/protocol.md, "Known limits").

The holder writes its expiry with the upper bound and stops trusting its lease
before the server's clock can reach it; a taker compares the stored expiry with
the lower bound. See docs/protocol.md, "Takeover by DynamoDB's clock".
"""

from __future__ import annotations

import logging
import threading
import time
from email.utils import mktime_tz, parsedate_tz
from typing import Any

logger = logging.getLogger("django_dynlock")

# How fast the bounds widen between replies (seconds per second): ten times the worst
# rate error of a clock that NTP steers (it slews at most 500 ppm).
DRIFT = 5e-3


def monotonic() -> float:
    """The engine's clock for leases, timeouts and the offset below: seconds that never go
    back, and that count the time the host spent suspended where the platform has such a
    clock (``CLOCK_BOOTTIME`` on Linux). ``time.monotonic()`` stops while a host sleeps, so a
    holder resumed after a suspend longer than its lease would still trust it while others
    took the key; elsewhere it is all there is.
    """
    boottime = getattr(time, "CLOCK_BOOTTIME", None)  # looked up at each call: tests replace `time`
    return time.monotonic() if boottime is None else time.clock_gettime(boottime)


def parse_http_date(value: str | None) -> float | None:
    """Epoch seconds of an HTTP ``Date`` header, or None when missing or unreadable."""
    if not value:
        return None
    parts = parsedate_tz(value)
    if parts is None:
        return None
    try:
        return float(mktime_tz(parts))
    except (OverflowError, ValueError):
        return None


def reply_date(response: dict[str, Any] | None) -> float | None:
    """The ``Date`` of a botocore reply (a parsed response or a ClientError's response)."""
    headers = ((response or {}).get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    return parse_http_date(headers.get("date"))


class ServerClock:
    """Bounds on the server's clock, as an offset to this process' monotonic clock.

    Thread-safe. ``bounds()`` is None until the first reply with a Date header.
    """

    def __init__(self, *, describe: str = "DynamoDB") -> None:
        self._lock = threading.Lock()
        self._describe = describe
        # (offset bound, monotonic time the bound refers to)
        self._low: tuple[float, float] | None = None
        self._high: tuple[float, float] | None = None
        # The last reply's own bounds on the offset, and when it came: the next reply
        # narrows the interval only as far as both allow.
        self._last: tuple[float, float, float] | None = None
        self.jumps = 0
        self.replies = 0  # replies taken in, with or without a Date

    @property
    def known(self) -> bool:
        return self._low is not None

    @property
    def dateless(self) -> bool:
        """Replies came, and none carried a Date: the server's clock cannot be learnt."""
        return self.replies > 0 and self._low is None

    def observe(self, sent: float, received: float, date: float | None) -> None:
        """Take in one reply: sent and received on the monotonic clock, its Date in epoch seconds."""
        with self._lock:
            self.replies += 1
        if date is None or received < sent:
            return
        low, high = date - received, date + 1.0 - sent
        with self._lock:
            last, self._last = self._last, (low, high, received)
            if self._low is None or self._high is None:
                self._low, self._high = (low, received), (high, received)
                return
            cur_low, cur_high = self._offset_bounds(received)
            if low >= cur_high or high <= cur_low:
                # This reply and the earlier ones cannot all be right: the server's clock
                # jumped, or one reply came from a front end or an intermediary whose
                # clock is off. Which one is wrong we cannot tell, so keep both: the
                # interval widens to cover them, never narrows on one reply's word (a
                # holder's expiry stamped early, or a taker's earliest moved late, would
                # let two hold the key). Agreeing replies narrow it again as usual.
                self.jumps += 1
                moved = (low + high) / 2 - (cur_low + cur_high) / 2
                logger.warning(
                    "%s's clock disagrees by about %+.1fs with its earlier replies: "
                    "the uncertainty of lock expiries widens to cover both",
                    self._describe,
                    moved,
                )
                self._low, self._high = (min(cur_low, low), received), (max(cur_high, high), received)
                return
            if last is not None:
                # Inside the interval, but perhaps from another clock all the same (a reply
                # 2 s behind, inside bounds a slow first reply left 3.4 s wide, narrowed the
                # upper bound 1.17 s below DynamoDB's clock: schedule explorer, seed 1251).
                last_low, last_high, last_at = last
                widened = DRIFT * max(0.0, received - last_at)
                low, high = min(low, last_low - widened), max(high, last_high + widened)
            self._low = (max(cur_low, low), received)
            self._high = (min(cur_high, high), received)

    def _offset_bounds(self, at: float) -> tuple[float, float]:
        assert self._low is not None and self._high is not None
        low, low_at = self._low
        high, high_at = self._high
        return low - DRIFT * max(0.0, at - low_at), high + DRIFT * max(0.0, at - high_at)

    def bounds(self, at: float | None = None) -> tuple[float, float] | None:
        """(earliest, latest) the server's clock can read at monotonic time ``at`` (default: now)."""
        at = monotonic() if at is None else at
        with self._lock:
            if self._low is None:
                return None
            low, high = self._offset_bounds(at)
        return at + low, at + high

    def latest(self, at: float) -> float | None:
        found = self.bounds(at)
        return None if found is None else found[1]

    def earliest(self, at: float) -> float | None:
        found = self.bounds(at)
        return None if found is None else found[0]

    def now(self) -> float:
        """Best estimate of the server's clock now (epoch seconds); this host's wall clock until known."""
        found = self.bounds()
        if found is None:
            return time.time()
        return (found[0] + found[1]) / 2

    def uncertainty(self) -> float | None:
        """Width of the interval now (seconds), or None until known."""
        found = self.bounds()
        return None if found is None else found[1] - found[0]

    def fresh_copy(self) -> ServerClock:
        """The same bounds behind a new lock (for a forked child: a parent thread may hold the old one)."""
        copy = ServerClock(describe=self._describe)
        copy._low, copy._high, copy._last = self._low, self._high, self._last
        copy.jumps, copy.replies = self.jumps, self.replies
        return copy
