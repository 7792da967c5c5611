"""Writers for ``showlocks``: table, JSON and CSV, each streaming one lease at a time.

Memory stays constant however many leases there are: nothing keeps the leases it
has written. The table takes its column widths from the first rows only, so a
longer value further down pushes its line out instead of making us buffer all.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ..engine.items import LeaseInfo
from ..engine.text import printable
from . import formatting as fmt


class Writer(Protocol):
    """Where the listings go: a text file, or a command's output without its line endings."""

    def write(self, text: str, /) -> object: ...


WIDTH_SAMPLE = 100  # rows that decide the table's column widths
MAX_WIDTH = 48  # no column gets wider than this from the sample alone

CSV_FIELDS = (
    "key",
    "state",
    "token",
    "host",
    "pid",
    "thread",
    "holder",
    "owner",
    "acquired_at",
    "expires_at",
    "expires_in",
    "lease_seconds",
    "released_at",
    "released_by",
    "break_reason",
    "reserved_by",
    "problems",
    "election",
    "term_age",
    "semaphore",
    "slot",
)


@dataclass
class Counts:
    """For the summary line: leases written, and leases hidden because expired."""

    written: int = 0
    hidden_expired: int = 0  # their holders stopped renewing: crashed, or gone
    hidden_kept: int = 0  # kept by runlocked --at-least after their runs, as asked


def visible(infos: Iterable[LeaseInfo], now: dt.datetime, show_all: bool, counts: Counts) -> Iterator[LeaseInfo]:
    """Without ``--all``, leases whose stored expiry passed (a holder that died) are hidden."""
    for info in infos:
        if not show_all and fmt.state(info, now) == "expired":
            if fmt.kept_after_its_run(info):
                counts.hidden_kept += 1
            else:
                counts.hidden_expired += 1
            continue
        counts.written += 1
        yield info


@dataclass(frozen=True)
class Semaphore:
    """A semaphore's holders, shown together: ``export:acme 3/5`` and a row for each."""

    key: str
    limit: int | None
    holders: list[LeaseInfo]

    def title(self) -> str:
        return f"{self.key} {len(self.holders)}/{self.limit if self.limit is not None else '?'}"


def grouped(infos: Iterable[LeaseInfo], limit_of: Callable[[str], int | None]) -> Iterator[LeaseInfo | Semaphore]:
    """The leases, but a semaphore's holders as one Semaphore after all the rest.

    A Scan returns a semaphore's slots anywhere among its pages: its holders are kept
    until the end (only theirs: the rest streams as before). ``limit_of(key)`` reads
    the limit stored for a semaphore's key (one read each)."""
    groups: dict[str, list[LeaseInfo]] = {}
    for info in infos:
        if fmt.semaphore(info) is None:
            yield info
        else:
            groups.setdefault(info.key, []).append(info)
    for key in sorted(groups):
        holders = sorted(groups[key], key=lambda info: fmt.slot(info) or 0)
        limit = limit_of(key)
        yield Semaphore(key, limit if limit is not None else fmt.semaphore(holders[0]), holders)


def write_json(infos: Iterable[LeaseInfo], now: dt.datetime, out: Writer) -> None:
    """One JSON array, written element by element."""
    empty = True
    out.write("[")
    for info in infos:
        out.write(("\n  " if empty else ",\n  ") + json.dumps(fmt.record(info, now)))
        empty = False
    out.write("]\n" if empty else "\n]\n")


# A spreadsheet opening the CSV runs a cell that starts with one of these as a formula
# (OWASP, "CSV Injection"); keys, holders and break reasons come from anyone who can
# reach a locked view or run breaklock.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A text value that a spreadsheet would read as a formula gets a leading apostrophe,
    which shows it as text; numbers are written as they are."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_csv(infos: Iterable[LeaseInfo], now: dt.datetime, out: Writer) -> None:
    # RFC 4180's CRLF: the writer then quotes a field holding a CR as well as one holding
    # a LF (with "\n" alone, a key with a CR was written bare and broke the row).
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\r\n")
    writer.writeheader()
    for info in infos:
        row = fmt.record(info, now)
        row["holder"] = json.dumps(row["holder"], sort_keys=True)
        row["problems"] = "; ".join(row["problems"])
        writer.writerow({k: csv_cell(row[k]) for k in CSV_FIELDS})


def table_rows(row: LeaseInfo | Semaphore, now: dt.datetime, show_state: bool) -> list[list[str]]:
    """A lease's row; a semaphore's title row and its holders' rows, by slot, beneath it."""
    if isinstance(row, LeaseInfo):
        return [table_row(row, now, show_state)]
    blank = [""] * (6 if show_state else 5)
    return [[printable(row.title()), *blank]] + [
        table_row(info, now, show_state, key=f"  #{fmt.slot(info)}") for info in row.holders
    ]


def table_row(info: LeaseInfo, now: dt.datetime, show_state: bool, *, key: str | None = None) -> list[str]:
    cells = [info.key if key is None else key]
    if show_state:
        cells.append(fmt.state_text(info, now))
    cells += [
        str(info.token) if info.token is not None else "-",
        fmt.holder_text(info),
        fmt.ago(info.acquired_at, now),
        fmt.expires(info, now),
        fmt.metadata_text(info, now),
    ]
    return [printable(cell) for cell in cells]


def write_table(
    infos: Iterable[LeaseInfo | Semaphore],
    now: dt.datetime,
    out: Writer,
    *,
    show_state: bool,
    header_style: Callable[[str], str] = str,
) -> None:
    header = ["KEY"] + (["STATE"] if show_state else []) + ["TOKEN", "HOLDER", "ACQUIRED", "EXPIRES", "METADATA"]
    rows = (cells for row in infos for cells in table_rows(row, now, show_state))
    sample = list(itertools.islice(rows, WIDTH_SAMPLE))
    if not sample:
        return
    widths = [min(MAX_WIDTH, max(len(cells[i]) for cells in [header, *sample])) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        # The last column is free text: not padded.
        return "  ".join(cell.ljust(width) for cell, width in zip(cells[:-1], widths)) + "  " + cells[-1]

    out.write(header_style(line(header).rstrip()) + "\n")
    for cells in itertools.chain(sample, rows):
        out.write(line(cells).rstrip() + "\n")
