"""The history checker: does a record of critical sections show a safety violation?

Every worker records one :class:`Section` per critical section it entered:

``start``
    wall clock (``time.time()``) just after ``acquire()`` returned;
``end``
    the last moment the holder may have believed it held the lock: just before
    ``release()`` for a section that wrote, and for a section whose lease was lost,
    the earlier of the failed ``raise_if_lost()`` and the end of the lease's local
    validity (``Lease.valid_until``) on the wall clock;
``wrote`` / ``read``
    whether the section updated the shared counter of its key (it reads the counter,
    waits, calls ``raise_if_lost()`` and writes ``read + 1`` only if that passed),
    and the value it read.

All processes run on one host, so their wall clocks are the same clock and their
intervals can be compared directly. :func:`check` returns every violation of:

1. **exclusion**: no two intervals on one key overlap (touching is fine);
2. **fencing**: tokens on a key strictly increase in the order of acquisition;
3. **no lost update**: each section that wrote read the value the previous writer
   on its key wrote, and each final counter equals the number of sections that wrote.

The checker is plain Python (no Django, no boto3) so it can be unit-tested with
hand-made bad histories (``test_history.py``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Section", "Violation", "check", "load_sections", "summarize"]


@dataclass(frozen=True)
class Section:
    key: str
    token: int
    start: float
    end: float
    wrote: bool = True
    read: int | None = None
    worker: str = ""
    lost_reason: str | None = None  # why raise_if_lost() failed, for sections that did not write

    def describe(self) -> str:
        what = "wrote" if self.wrote else f"lost ({self.lost_reason or '?'})"
        return f"{self.worker or '?'} token {self.token} [{self.start:.6f}, {self.end:.6f}] read {self.read} {what}"

    def to_json(self) -> str:
        return json.dumps({"type": "section", **asdict(self)})


@dataclass(frozen=True)
class Violation:
    kind: str  # "overlap", "token-order", "lost-update", "bad-record"
    key: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} on {self.key!r}: {self.detail}"


def check(
    sections: Iterable[Section],
    counters: Mapping[str, int] | None = None,
    *,
    initial: int = 0,
) -> list[Violation]:
    """Every violation in ``sections``; ``counters`` are the final counter values by key.

    Keys present in ``counters`` but without sections must still be at ``initial``.
    """
    by_key: dict[str, list[Section]] = defaultdict(list)
    violations: list[Violation] = []
    for section in sections:
        if section.end < section.start:
            violations.append(Violation("bad-record", section.key, f"ends before it starts: {section.describe()}"))
        if section.wrote and section.read is None:
            violations.append(
                Violation("bad-record", section.key, f"wrote without recording what it read: {section.describe()}")
            )
        by_key[section.key].append(section)

    for key, history in sorted(by_key.items()):
        history.sort(key=lambda s: (s.start, s.end))
        violations.extend(_overlaps(key, history))
        violations.extend(_token_order(key, history))
        violations.extend(
            _lost_updates(key, history, initial, None if counters is None else counters.get(key, initial))
        )
    for key, value in sorted((counters or {}).items()):
        if key not in by_key and value != initial:
            violations.append(Violation("lost-update", key, f"counter is {value} but no section ran on it"))
    return violations


def _overlaps(key: str, history: list[Section]) -> list[Violation]:
    """Sweep by start: a section that starts before the latest end so far overlaps it."""
    found = []
    latest: Section | None = None
    for section in history:
        if latest is not None and section.start < latest.end:
            found.append(
                Violation(
                    "overlap",
                    key,
                    f"{section.describe()} started {latest.end - section.start:.6f}s before {latest.describe()} ended",
                )
            )
        if latest is None or section.end > latest.end:
            latest = section
    return found


def _token_order(key: str, history: list[Section]) -> list[Violation]:
    found = []
    for before, after in zip(history, history[1:]):
        if after.token <= before.token:
            found.append(
                Violation(
                    "token-order",
                    key,
                    f"token {after.token} ({after.describe()}) acquired after token {before.token} ({before.describe()})",
                )
            )
    return found


def _lost_updates(key: str, history: list[Section], initial: int, final: int | None) -> list[Violation]:
    found = []
    expected = initial
    writers = 0
    for section in history:
        if not section.wrote:
            continue
        writers += 1
        if section.read is None:
            expected += 1  # already reported as a bad record
            continue
        if section.read != expected:
            found.append(
                Violation(
                    "lost-update",
                    key,
                    f"{section.describe()} read {section.read}, but {writers - 1} earlier sections had written "
                    f"(counter should have been {expected})",
                )
            )
        expected = section.read + 1
    if final is not None and final != initial + writers:
        found.append(
            Violation(
                "lost-update",
                key,
                f"final counter is {final}, but {writers} sections wrote (expected {initial + writers})",
            )
        )
    return found


def load_sections(paths: Iterable[Path | str]) -> tuple[list[Section], list[dict]]:
    """Read the JSON-lines files the workers wrote: (sections, every other record)."""
    sections: list[Section] = []
    others: list[dict] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by SIGKILL
            if record.get("type") == "section":
                del record["type"]
                sections.append(Section(**record))
            else:
                others.append(record)
    return sections, others


def summarize(sections: list[Section], violations: list[Violation]) -> str:
    keys = sorted({s.key for s in sections})
    wrote = sum(s.wrote for s in sections)
    lines = [
        f"{len(sections)} sections on {len(keys)} keys, {wrote} wrote, "
        f"{len(sections) - wrote} saw their lease lost; {len(violations)} violations"
    ]
    lines += [f"  {v}" for v in violations[:20]]
    return "\n".join(lines)
