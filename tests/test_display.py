"""Who holds a lease and where, as the commands and the admin show it: one text for both.

A pid of 0 (or none) is an unknown process: shown as ``?``, never as ``pid 0``.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_dynlock.admin import make_row
from django_dynlock.admin.breaks import not_broken_message
from django_dynlock.engine.items import LeaseInfo
from django_dynlock.management import formatting as fmt
from django_dynlock.management.listing import table_row

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)


def held(**fields: object) -> LeaseInfo:
    values: dict = {
        "key": "invoice:42",
        "stored_key": "invoice:42",
        "token": 7,
        "owner": "web-1:1234:x:y",
        "rvn": "r",
        "lease_seconds": 30.0,
        "expires_at": NOW + dt.timedelta(seconds=20),
        "acquired_at": NOW - dt.timedelta(seconds=10),
        "host": "web-1",
        "pid": 1234,
        "holder": {"view": "shop.views.pay", "user": "42", "request_id": "9f1c"},
    }
    return LeaseInfo(**{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({}, "web-1:1234"),
        ({"pid": 0}, "web-1:?"),
        ({"pid": None}, "web-1:?"),
        ({"host": None, "pid": 0}, "?:?"),
    ],
)
def test_commands_and_admin_show_the_same_holder_and_place(fields, where):
    info = held(**fields)
    assert info.where() == where
    assert info.describe() == f"shop.views.pay on {where}"
    # The commands: showlocks' HOLDER column, and breaklock's and runlocked's summary line.
    assert fmt.holder_text(info) == f"shop.views.pay (user 42) on {where}"
    assert table_row(info, NOW, show_state=False)[2] == f"shop.views.pay (user 42) on {where}"
    assert f"held by shop.views.pay (user 42) on {where}, " in fmt.summary(info, NOW)
    # The admin: the row's columns, and the message of a break that found another token.
    row = make_row(info, NOW)
    assert (row.what, row.user, row.where) == ("shop.views.pay", "42", where)
    assert row.metadata == [("request_id", "9f1c")]
    assert f"(held by shop.views.pay (user 42) on {where})" in not_broken_message("invoice:42", 6, info, NOW)


@pytest.mark.parametrize("pid", [0, None])
def test_an_unknown_pid_is_never_shown_as_0(pid):
    info = held(pid=pid, holder={})
    shown = [
        info.describe(),
        fmt.holder_text(info),
        fmt.summary(info, NOW),
        *table_row(info, NOW, show_state=True),
        make_row(info, NOW).where,
    ]
    assert all(":0" not in text and "pid 0" not in text for text in shown), shown
    assert info.describe() == fmt.holder_text(info) == make_row(info, NOW).where == "web-1:?"
