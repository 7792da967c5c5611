"""End to end in a real browser: Debian's chromium, headless, driven by Playwright.

The test project runs as a real server (``tests.support.admin_server``) against a moto
server; another process holds the lease ``victim``. A staff user with exactly
``view_lease`` and ``break_lease`` logs in, sees the lease, breaks it through the
confirmation page, sees it gone and the break in "Recent actions"; the holder process
finds out that it lost the lease. A second lease is broken through the list's action.
Then the list's auto-refresh (issue 31): a demo run watched from the demo page and from
the list beside it, and a selection the refresh keeps. Then the layout (issue 35): each
lease page against Django's own Users page, on whichever Django runs the test (not
``slow``, so the Django 6.1 and 6.0 passes of ``make test-latest`` run it too).

Needs ``/usr/bin/chromium`` (``make test`` installs it) and the ``playwright`` package
(the ``dev`` extras); without them the test is skipped, except under ``CI=true`` where it
fails. ``DYNLOCK_SCREENSHOTS=1`` also saves the pages shown in docs/admin.md and the
demo's in README.md to docs/img/.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localdynamo.servers import REPO_ROOT, server_env, table_name
from tests.support.admin_server import PASSWORD, SUPERUSER, SUPERUSER_PASSWORD, USERNAME, start_admin_server
from tests.support.tables import fresh_table

# The layout test is not `slow`: the newest-Django passes (-m "not slow") run it too.
pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
SCREENSHOTS = os.environ.get("DYNLOCK_SCREENSHOTS") == "1"
IMG = REPO_ROOT / "docs" / "img"
STEP_TIMEOUT_MS = 20_000


def need_browser() -> None:
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (Debian's chromium: `make browser`)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (`make venv`: the dev extras)")
    if missing:
        from tests.support.tools import missing_tool

        missing_tool("browser test needs " + " and ".join(missing))


def wait_for_line(path: Path, pattern: str, timeout: float) -> re.Match | None:
    """The first line of ``path`` matching ``pattern`` within ``timeout`` seconds (polling)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05) + 1):
        if path.exists():
            for line in path.read_text().splitlines():
                found = re.match(pattern, line)
                if found:
                    return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return None


@pytest.fixture
def browser_table(moto_server, settings):
    name = "django_dynlock" if SCREENSHOTS else table_name()  # the default name, for the docs' pictures
    # client_for()'s lease and botocore's own timeouts and retries, as before
    with fresh_table(
        settings, moto_server.endpoint_url, TABLE_NAME=name, LEASE_DURATION=5.0, CLIENT_CONFIG={}
    ) as client:
        yield moto_server.endpoint_url, name, client


@pytest.fixture
def admin_server(browser_table, tmp_path):
    need_browser()
    endpoint, table, _ = browser_table
    server = start_admin_server(endpoint, table, str(tmp_path))
    yield server
    server.stop()


@pytest.fixture
def holder_process(browser_table, tmp_path):
    """Another process holding ``victim`` (8 s lease, renewed every 2 s) for up to 120 s."""
    endpoint, table, _ = browser_table
    report = tmp_path / "holder.report"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.workers", endpoint, table, "8", str(report), "120"],
        cwd=str(REPO_ROOT),
        env=server_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        acquired = wait_for_line(report, r"ACQUIRED (\d+)$", timeout=30)
        assert acquired, "the holder process did not acquire its lease"
        yield int(acquired.group(1)), report
    finally:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium, headless, closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            yield browser
        finally:
            browser.close()


def log_in(page, base: str, username: str = USERNAME, password: str = PASSWORD) -> None:
    """Log in as the operator (or ``username``): the admin sends us to the login page first."""
    from playwright.sync_api import expect

    page.goto(f"{base}/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page).to_have_url(f"{base}/admin/")


@pytest.mark.slow
def test_break_a_lease_held_by_another_process(admin_server, browser_table, holder_process):
    from playwright.sync_api import expect

    token, report = holder_process
    _, _, client = browser_table
    # Leases of this process: one to break through the list's action, others for the screenshot.
    batch = client.acquire("report:nightly", lease=30, holder={"command": "build_reports", "user": "7"})
    others = [
        client.acquire("invoice:42", lease=30, holder={"view": "shop.views.pay", "user": "42", "path": "/pay/42/"}),
        client.acquire("event:1", lease=30, holder={"view": "booking.views.book", "user": "3"}),
    ]
    base = admin_server.url
    changelist = f"{base}/admin/django_dynlock/lease/"

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.set_default_timeout(STEP_TIMEOUT_MS)

        log_in(page, base)

        # The index lists "Leases"; the list shows the other process' lease and its token.
        page.locator("#content-main").get_by_role("link", name="Leases").click()
        expect(page).to_have_url(changelist)
        row = page.locator('tr[data-key="victim"]')
        expect(row).to_be_visible()
        expect(row.locator("td.field-token")).to_have_text(str(token))
        expect(row.locator(".dynlock-state")).to_have_text("held")
        expect(page.locator("tr.dynlock-row")).to_have_count(4)
        if SCREENSHOTS:
            IMG.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(IMG / "admin-leases.png"))

        # Detail page -> "Break this lease" -> the confirmation page shows the token.
        row.get_by_role("link", name="victim").click()
        expect(page.locator("table.dynlock-detail")).to_contain_text(str(token))
        page.click("a.dynlock-break")
        expect(page).to_have_url(re.compile(r"/admin/django_dynlock/lease/victim/break/$"))
        expect(page.locator("#dynlock-token")).to_have_text(str(token))
        page.fill("#id_reason", "holder stuck (browser test)")
        if SCREENSHOTS:
            page.screenshot(path=str(IMG / "admin-break.png"))
        page.click("input.dynlock-confirm")

        # Back on the list: a success message, and the lease is gone.
        expect(page).to_have_url(changelist)
        expect(page.locator("ul.messagelist li.success")).to_contain_text(
            f"Broke the lease on 'victim' (token {token})"
        )
        expect(page.locator('tr[data-key="victim"]')).to_have_count(0)
        expect(page.locator('tr[data-key="invoice:42"]')).to_have_count(1)

        # The list's action, on one selected row.
        page.check('tr[data-key="report:nightly"] input.action-select')
        page.select_option("#dynlock-action", "break_leases")
        page.get_by_role("button", name="Go").click()
        expect(page.locator("tr.dynlock-row")).to_contain_text(str(batch.token))
        page.fill("#id_reason", "nightly run hung (browser test)")
        page.click("input.dynlock-confirm")
        expect(page.locator("ul.messagelist li.success")).to_contain_text("Broke 1 lease: 'report:nightly'")
        expect(page.locator('tr[data-key="report:nightly"]')).to_have_count(0)

        # Released and expired included (issue 31): a broken lease says why, and no key
        # is broken over two lines beside the wider rows of this view.
        page.goto(f"{changelist}?all=1")
        expect(page.locator('tr[data-key="victim"] .dynlock-why')).to_contain_text("holder stuck (browser test)")
        lines = page.locator("th.field-key a").evaluate_all("links => links.map(a => a.getClientRects().length)")
        assert len(lines) == 4 and set(lines) == {1}, lines
        expect(page.locator("p.paginator")).to_contain_text(f"{len(lines)} leases")

        # Both breaks are in "Recent actions" on the admin index.
        page.goto(f"{base}/admin/")
        recent = page.locator("#recent-actions-module")
        expect(recent.get_by_role("link", name="victim")).to_be_visible()
        expect(recent.get_by_role("link", name="report:nightly")).to_be_visible()
        # ...and lead to the detail page, which records who broke it and why.
        recent.get_by_role("link", name="victim").click()
        expect(page.locator("table.dynlock-detail")).to_contain_text("holder stuck (browser test)")
        expect(page.locator("table.dynlock-detail")).to_contain_text(f"admin:{USERNAME}")

    # The holder finds out at its next renewal (every 2 s).
    assert wait_for_line(report, r"LOST ", timeout=15), "the holder process never saw that its lease was broken"
    deadline = time.monotonic() + 15  # this process' holder, too, learns it at its next renewal
    while batch.is_held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not batch.is_held and batch.lost_reason == "broken"
    assert all(lease.is_held for lease in others)
    for lease in others:
        lease.release()


@pytest.mark.slow
def test_a_demo_run_shows_its_lock_on_the_page_and_in_the_refreshing_admin_list(admin_server):
    """Issue 31: during a demo run nothing showed that it was running, and its lock never
    appeared in the admin (the list did not refresh; a run lasted 3 s)."""
    from playwright.sync_api import expect

    base = admin_server.url
    with chromium() as browser:
        # Two windows, as a person would put them side by side: the demo, and the admin.
        demo = browser.new_context(viewport={"width": 900, "height": 700}).new_page()
        admin = browser.new_context(viewport={"width": 1280, "height": 700}).new_page()
        for page in (demo, admin):
            page.set_default_timeout(STEP_TIMEOUT_MS)
        demo.goto(f"{base}/demo/events/1/")  # the event the demo's migration creates
        expect(demo.locator("#lock-state")).to_have_text("free")

        # The page's link: the admin's list on the event's key, refreshing every second.
        log_in(admin, base)
        admin.goto(base + demo.locator("#admin-link").get_attribute("href"))
        expect(admin.locator("#dynlock-refresh")).to_have_value("1")
        expect(admin.locator('tr[data-key="event:1"]')).to_have_count(0)
        admin.evaluate("window.notReloaded = true")  # gone if the page were loaded again

        # A locked run whose five payments take 1 s each: the page shows it going...
        demo.select_option("#think", "1")
        demo.click("#locked")
        expect(demo.locator("#indicator")).to_have_class("running")
        expect(demo.locator("#run-title")).to_contain_text("Running: the locked run")
        # The lock changes hands 40 times in the run: state and details are read in one
        # go, from a moment it was held (the page updates both at once).
        detail = demo.wait_for_function(
            """() => document.getElementById("lock-state").textContent === "held"
                     && document.getElementById("lock-detail").textContent""",
            timeout=STEP_TIMEOUT_MS,
        ).json_value()
        assert re.fullmatch(
            r"by testproject\.booking\.views\.book_view on \S+:\d+, token \d+: held for \d+\.\d s "
            r"\(since \d\d:\d\d:\d\d\.\d{3} UTC\), lease ends in \d+\.\d s \(\d\d:\d\d:\d\d\.\d{3} UTC\) "
            r"unless renewed or released",
            detail,
        ), detail
        expect(demo.locator("#lock-seen")).to_contain_text(re.compile(r"^Holders seen during this run: [1-9]"))
        expect(demo.locator("#run-count")).to_contain_text(re.compile(r"^[1-9]\d* of 40 answered$"))
        if SCREENSHOTS:  # README's picture of the demo
            IMG.mkdir(parents=True, exist_ok=True)
            demo.screenshot(path=str(IMG / "demo.png"))

        # ...and the admin's list shows the lease without being reloaded.
        # (Read in one go too: the next refresh may fall between two holders.)
        state, holder = admin.wait_for_function(
            """() => { const row = document.querySelector('tr[data-key="event:1"]');
                       return row && [row.dataset.state, row.querySelector("td.field-holder").textContent]; }""",
            timeout=STEP_TIMEOUT_MS,
        ).json_value()
        assert state == "held" and "testproject.booking.views.book_view" in holder, (state, holder)

        # The run ends: five bookings, the lock free on the page, the lease gone from the list.
        expect(demo.locator("#result")).to_have_text(
            "5 bookings for 5 seats (seats left: 0): nobody double-booked.", timeout=60_000
        )
        expect(demo.locator("#run-title")).to_contain_text("Finished: the locked run, in ")
        expect(demo.locator("#run-count")).to_have_text("40 of 40 answered")
        expect(demo.locator("#indicator")).not_to_have_class("running")
        expect(demo.locator("#lock-state")).to_have_text("free", timeout=STEP_TIMEOUT_MS)
        expect(admin.locator('tr[data-key="event:1"]')).to_have_count(0, timeout=STEP_TIMEOUT_MS)
        assert admin.evaluate("window.notReloaded") is True


@pytest.mark.slow
def test_auto_refresh_keeps_the_operators_selection_and_can_be_turned_off(admin_server, browser_table):
    from playwright.sync_api import expect

    _, _, client = browser_table
    first = client.acquire("job:first", lease=30)
    base = admin_server.url
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 700})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        log_in(page, base)
        page.goto(f"{base}/admin/django_dynlock/lease/?refresh=1")
        page.evaluate("window.notReloaded = true")
        status = page.locator("#dynlock-refresh-status")

        # A ticked row pauses the refresh: a lease taken meanwhile is not swapped in.
        page.check('tr[data-key="job:first"] input.action-select')
        second = client.acquire("job:second", lease=30)
        expect(status).to_have_text("Auto-refresh paused while leases are selected.", timeout=STEP_TIMEOUT_MS)
        time.sleep(2.5)  # two more periods
        expect(page.locator('tr[data-key="job:second"]')).to_have_count(0)
        expect(page.locator('tr[data-key="job:first"] input.action-select')).to_be_checked()

        # Unticked, the next refresh shows it.
        page.uncheck('tr[data-key="job:first"] input.action-select')
        expect(page.locator('tr[data-key="job:second"]')).to_have_count(1, timeout=STEP_TIMEOUT_MS)
        expect(status).to_have_text("")
        assert page.evaluate("window.notReloaded") is True

        # Choosing a period, or off, loads the list with it in the URL.
        page.select_option("#dynlock-refresh", "5")
        expect(page).to_have_url(re.compile(r"[?&]refresh=5(&|$)"))
        expect(page.locator("#changelist")).to_have_attribute("data-refresh", "5")
        page.select_option("#dynlock-refresh", "")
        expect(page).to_have_url(re.compile(r"[?&]refresh=(&|$)"))
        expect(page.locator("#changelist")).not_to_have_attribute("data-refresh", re.compile(".*"))
        second.release()
        page.evaluate("window.notReloaded = true")
        time.sleep(2.5)  # off: the list stays as it was read
        expect(page.locator('tr[data-key="job:second"]')).to_have_count(1)
        assert page.evaluate("window.notReloaded") is True
    first.release()


# What the layout test reads on each page, in one go: the breadcrumbs element (its tag,
# its children's tags, whether the last one is the current page, its computed style and
# its first link's), the search toolbar's box against the list's table, the widths.
LAYOUT = """() => {
    const pick = (element, names) => element && Object.fromEntries(names.map(name => [name, getComputedStyle(element)[name]]));
    const box = element => element && element.getBoundingClientRect().toJSON();
    const crumbs = document.querySelector(".breadcrumbs");
    const children = crumbs ? Array.from(crumbs.children) : [];
    const last = children[children.length - 1];
    return {
        crumbs: crumbs && {
            tag: crumbs.tagName,
            parent: crumbs.parentElement.tagName,
            children: Array.from(new Set(children.map(child => child.tagName))).sort(),
            current: last ? last.getAttribute("aria-current") : null,
            style: pick(crumbs, ["display", "backgroundColor", "color", "fontSize", "paddingTop", "paddingRight",
                                 "paddingBottom", "paddingLeft", "marginTop", "marginBottom", "listStyleType"]),
            item: pick(crumbs.querySelector("li"), ["display", "fontSize"]),
            link: pick(crumbs.querySelector("a"), ["color", "fontSize", "textDecorationLine"]),
            width: box(crumbs).width,
        },
        toolbar: box(document.getElementById("toolbar")),
        toolbarStyle: pick(document.getElementById("toolbar"), ["backgroundColor", "paddingTop", "paddingLeft", "marginBottom"]),
        table: box(document.getElementById("result_list")),
        header: pick(document.querySelector("#result_list thead th"), ["backgroundColor", "fontSize", "paddingTop", "paddingLeft"]),
        container: box(document.querySelector("#changelist .changelist-form-container")),
        scrollWidth: document.documentElement.scrollWidth,
        innerWidth: window.innerWidth,
    };
}"""


def test_the_lease_pages_are_laid_out_like_djangos_own(admin_server, browser_table):
    """Issue 35: on Django 6 the breadcrumbs were unstyled (6.1 styles ``ol.breadcrumbs``,
    the pages emitted 5.2's ``div``), the search toolbar sat beside the table (6.x makes
    ``.changelist-form-container`` a flex box) and the list was 1,531 px wide in a 1,280 px
    window. Each page is compared with Django's own Users page in the same browser."""
    from playwright.sync_api import expect

    _, _, client = browser_table
    # The demo's holder, the longest dotted path of the docs' pictures, and a 32-character key.
    leases = [
        client.acquire("event:1", lease=30, holder={"view": "testproject.booking.views.book_view", "user": "3"}),
        client.acquire("invoice:42", lease=30, holder={"view": "shop.views.pay", "user": "42", "path": "/pay/42/"}),
        client.acquire("report:nightly:2026-11-27:europe", lease=30, holder={"command": "build_reports"}),
    ]
    base = admin_server.url
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        log_in(page, base, SUPERUSER, SUPERUSER_PASSWORD)

        page.goto(f"{base}/admin/auth/user/")
        django = page.evaluate(LAYOUT)
        assert django["crumbs"] and django["toolbar"] and django["table"], django
        assert django["scrollWidth"] <= django["innerWidth"], django

        def same_crumbs(ours: dict) -> None:
            theirs = django["crumbs"]
            assert ours["crumbs"], "no .breadcrumbs element"
            for name in ("tag", "parent", "children", "current", "style", "item", "link"):
                assert ours["crumbs"][name] == theirs[name], (name, ours["crumbs"][name], theirs[name])
            assert ours["crumbs"]["width"] == theirs["width"]

        def fits(ours: dict, what: str) -> None:
            assert ours["scrollWidth"] <= ours["innerWidth"], (what, ours["scrollWidth"], ours["innerWidth"])

        def toolbar_above_table(layout: dict) -> tuple[bool, bool, bool]:
            toolbar, table, container = layout["toolbar"], layout["table"], layout["container"]
            return (
                toolbar["bottom"] <= table["top"],  # above, not beside
                abs(toolbar["width"] - table["width"]) <= 1 and abs(toolbar["left"] - table["left"]) <= 1,
                table["right"] <= container["right"] + 1,  # the table within the list, not scrolled
            )

        # The list: breadcrumbs, toolbar and table as on the Users page, within the window.
        page.goto(f"{base}/admin/django_dynlock/lease/")
        expect(page.locator("tr.dynlock-row")).to_have_count(3)
        ours = page.evaluate(LAYOUT)
        same_crumbs(ours)
        assert toolbar_above_table(ours) == toolbar_above_table(django) == (True, True, True), (ours, django)
        assert ours["toolbarStyle"] == django["toolbarStyle"] and ours["header"] == django["header"], (ours, django)
        fits(ours, "list")
        # The table's last column is inside the list (the state was cut off at its edge), the
        # acquired time's date and time of day keep their lines (they wrapped to four), and
        # so do the keys.
        state = page.locator("td.field-state").evaluate_all("cells => cells.map(c => c.getBoundingClientRect().right)")
        assert max(state) <= ours["container"]["right"] + 1, (state, ours["container"])
        lines = page.locator("td.field-acquired time > span").evaluate_all(
            "spans => spans.map(s => s.getClientRects().length)"
        )
        assert lines == [1] * 6, lines
        lines = page.locator("th.field-key a").evaluate_all("links => links.map(a => a.getClientRects().length)")
        assert lines == [1] * 3, lines

        # The detail page and the confirmation page.
        page.locator('tr[data-key="event:1"]').get_by_role("link", name="event:1").click()
        expect(page.locator("table.dynlock-detail")).to_contain_text(str(leases[0].token))
        ours = page.evaluate(LAYOUT)
        same_crumbs(ours)
        fits(ours, "detail")
        page.click("a.dynlock-break")
        expect(page.locator("#dynlock-token")).to_have_text(str(leases[0].token))
        ours = page.evaluate(LAYOUT)
        same_crumbs(ours)
        fits(ours, "break")
        # The list action's confirmation page, for all three.
        page.goto(f"{base}/admin/django_dynlock/lease/")
        for lease in leases:
            page.check(f'tr[data-key="{lease.key}"] input.action-select')
        page.select_option("#dynlock-action", "break_leases")
        page.get_by_role("button", name="Go").click()
        expect(page.locator("tr.dynlock-row")).to_have_count(3)
        ours = page.evaluate(LAYOUT)
        same_crumbs(ours)
        fits(ours, "break selected")
    for lease in leases:
        lease.release()


def test_an_elections_badge_keeps_the_list_within_the_window(admin_server, browser_table):
    """issue 37: an election's term shows a badge and its age above the holder; the list
    still fits a 1,280 px window beside the nav sidebar, with the longest holder of the
    layout test above, and the state column inside the list."""
    from playwright.sync_api import expect

    _, _, client = browser_table
    term = client.election("celery-beat:europe-west", lease=30, holder={"command": "celery beat"}).campaign(wait=5)
    lease = client.acquire("event:1", lease=30, holder={"view": "testproject.booking.views.book_view", "user": "3"})
    base = admin_server.url
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            log_in(page, base, SUPERUSER, SUPERUSER_PASSWORD)
            page.goto(f"{base}/admin/django_dynlock/lease/")
            expect(page.locator("tr.dynlock-row")).to_have_count(2)
            row = page.locator(f'tr[data-key="{term.key}"]')
            expect(row.locator(".dynlock-badge")).to_have_text("election celery-beat:europe-west")
            expect(row.locator(".dynlock-term")).to_contain_text("term age ")
            ours = page.evaluate(LAYOUT)
            assert ours["scrollWidth"] <= ours["innerWidth"], ours
            state = page.locator("td.field-state").evaluate_all(
                "cells => cells.map(c => c.getBoundingClientRect().right)"
            )
            assert max(state) <= ours["container"]["right"] + 1, (state, ours["container"])
    finally:
        lease.release()
        term.release()
