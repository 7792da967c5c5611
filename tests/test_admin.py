"""The "Leases" admin page, through Django's test client against real DynamoDB servers.

Every permission case, the break flow (confirmation, stale token, LogEntry, signal),
CSRF, escaping, DynamoDB failures, one Scan per page, cursors and aliases.
"""

from __future__ import annotations

import contextlib
import html
import re
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.http import HttpResponse
from django.test import Client
from django.urls import path, reverse
from django.utils.timezone import localtime

from django_dynlock import dynamo_lock, get_lock_client
from django_dynlock.admin import LeaseAdmin, decode_cursor, encode_cursor
from django_dynlock.engine import items as it
from django_dynlock.engine import requests as rq
from django_dynlock.models import Lease
from django_dynlock.signals import lock_broken
from localdynamo.servers import DUMMY_REGION, dummy_client, table_name
from testproject.urls import urlpatterns as project_urlpatterns
from tests.support.aliases import alias_settings
from tests.support.calls import count_calls
from tests.support.tables import delete_table, fresh_table

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_dynlock_lease_changelist"
PASSWORD = "pw-for-tests"


# -- fixtures and helpers ------------------------------------------------------------------
@pytest.fixture
def table(moto_server, settings):
    """A fresh lock table on the moto server (the default alias); yields its LockClient."""
    with fresh_table(settings, moto_server.endpoint_url) as client:
        yield client


def make_user(django_user_model, *perms: str, staff: bool = True):
    user = django_user_model.objects.create_user(f"u-{uuid.uuid4().hex[:8]}", password=PASSWORD, is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="django_dynlock", codename=codename))
    return user


def client_for(user, **kwargs) -> Client:
    browser = Client(**kwargs)
    browser.force_login(user)
    return browser


@pytest.fixture
def viewer(django_user_model):
    return client_for(make_user(django_user_model, "view_lease"))


@pytest.fixture
def operator_user(django_user_model):
    return make_user(django_user_model, "view_lease", "break_lease")


@pytest.fixture
def operator(operator_user):
    return client_for(operator_user)


@pytest.fixture
def broken_signals():
    received = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    lock_broken.connect(receiver, dispatch_uid="test-admin-broken")
    yield received
    lock_broken.disconnect(dispatch_uid="test-admin-broken")


def changelist_url(**query) -> str:
    url = reverse(CHANGELIST)
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def detail_url(key: str) -> str:
    return reverse("admin:django_dynlock_lease_change", args=(quote(key),))


def break_url(key: str) -> str:
    return reverse("admin:django_dynlock_lease_break", args=(quote(key),))


def keys_on(response) -> list[str]:
    return [
        html.unescape(k) for k in re.findall(r'<tr class="dynlock-row" data-key="([^"]*)"', response.content.decode())
    ]


def next_link(response) -> str | None:
    found = re.search(r'<a href="([^"]*)" class="dynlock-next">', response.content.decode())
    return html.unescape(found.group(1)) if found else None


def put_leases(client, keys, *, holder=None, expires_in=60.0, held=True) -> None:
    """Write lock items directly (BatchWriteItem): many leases without heartbeat threads."""
    now = time.time()
    requests = []
    for n, key in enumerate(keys):
        item = {
            client.options.key_attribute: {"S": client.options.key_prefix + key},
            it.FENCE: {"N": str(1000 + n)},
            it.RVN: {"S": uuid.uuid4().hex},
            it.LEASE_MS: {"N": "60000"},
            it.EXPIRES_AT: {"N": repr(now + expires_in)},
            it.ACQUIRED_AT: {"N": repr(now - 5)},
            it.HOST: {"S": "worker-7"},
            it.PID: {"N": "4242"},
            it.THREAD: {"S": "MainThread"},
            it.HOLDER: rq.holder_map(holder or {"function": "tasks.export"}),
            client.options.ttl_attribute: {"N": str(int(now) + 3600)},
        }
        if held:
            item[it.OWNER] = {"S": f"worker-7:4242:{uuid.uuid4().hex[:8]}"}
        else:
            item[it.RELEASED_AT] = {"N": repr(now - 1)}
            item[it.RELEASED_BY] = {"S": "someone"}
        requests.append({"PutRequest": {"Item": item}})
    for start in range(0, len(requests), 25):
        batch = {client.options.table_name: requests[start : start + 25]}
        for _ in range(10):  # unprocessed items are retried, a bounded number of times
            reply = client.boto.batch_write_item(RequestItems=batch)
            batch = reply.get("UnprocessedItems") or {}
            if not batch:
                break
        assert not batch, "the server kept items unprocessed"


def content(response) -> str:
    return response.content.decode()


# -- the placeholder model -------------------------------------------------------------------
def test_lease_model_is_an_unmanaged_placeholder():
    opts = Lease._meta
    assert opts.managed is False
    assert opts.default_permissions == ()
    assert {codename for codename, _ in opts.permissions} == {"view_lease", "break_lease"}
    assert opts.pk.name == "key"
    assert set(
        Permission.objects.filter(content_type__app_label="django_dynlock").values_list("codename", flat=True)
    ) == {"view_lease", "break_lease"}


def test_url_names_for_tools():
    assert (
        reverse("admin:django_dynlock_lease_break", args=(quote("a/b c"),))
        == "/admin/django_dynlock/lease/a_2Fb%20c/break/"
    )
    assert reverse("admin:django_dynlock_lease_change", args=(quote("x"),)) == "/admin/django_dynlock/lease/x/"
    assert reverse(CHANGELIST) == "/admin/django_dynlock/lease/"


def test_cursor_round_trip():
    for stored in ["a", "job:42/é", "<script>", "x" * 2048]:
        cursor = encode_cursor({"key": {"S": stored}}, "key")
        assert re.fullmatch(r"[A-Za-z0-9_-]+", cursor)
        assert decode_cursor(cursor, "key") == {"key": {"S": stored}}
    assert encode_cursor(None, "key") is None
    assert decode_cursor("", "key") is None
    for bad in ["!!!", "a", "_w"]:
        with pytest.raises(ValueError):
            decode_cursor(bad, "key")


# -- permissions -------------------------------------------------------------------------------
def all_urls(key: str = "job:1") -> list[str]:
    return [changelist_url(), detail_url(key), break_url(key)]


def test_anonymous_users_go_to_the_login_page(table):
    table.acquire("job:1", lease=30)
    anonymous = Client()
    for url in all_urls():
        response = anonymous.get(url)
        assert response.status_code == 302
        login = urlsplit(response["Location"])
        assert login.path == reverse("admin:login")
        assert "next=" in login.query
    response = anonymous.post(break_url("job:1"), {"token": "1", "reason": "x"})
    assert response.status_code == 302 and urlsplit(response["Location"]).path == reverse("admin:login")
    assert table.get("job:1") is not None


def test_non_staff_users_with_the_permissions_go_to_the_login_page(table, django_user_model):
    user = make_user(django_user_model, "view_lease", "break_lease", staff=False)
    browser = client_for(user)
    for url in all_urls():
        assert browser.get(url).status_code == 302


def test_staff_without_view_lease_get_403_everywhere(table, django_user_model):
    lease = table.acquire("job:1", lease=30)
    for perms in [(), ("break_lease",)]:
        browser = client_for(make_user(django_user_model, *perms))
        for url in all_urls():
            assert browser.get(url).status_code == 403, (perms, url)
        assert browser.post(break_url("job:1"), {"token": str(lease.token), "reason": "x"}).status_code == 403
        response = browser.post(changelist_url(), {"action": "break_leases", "_selected_action": ["job:1"]})
        assert response.status_code == 403
        response = browser.post(
            changelist_url(),
            {"action": "break_leases", "post": "yes", "key": "job:1", "token": str(lease.token), "reason": "x"},
        )
        assert response.status_code == 403
    assert lease.is_held and table.get("job:1").token == lease.token


def test_the_index_lists_leases_only_for_users_who_may_view_them(table, django_user_model, viewer):
    index = reverse("admin:index")
    assert changelist_url() in content(viewer.get(index))
    nobody = client_for(make_user(django_user_model))
    assert changelist_url() not in content(nobody.get(index))
    assert nobody.get(reverse("admin:app_list", args=("django_dynlock",))).status_code == 404


def test_view_only_users_see_leases_but_cannot_break(table, viewer):
    lease = table.acquire("job:1", lease=30, holder={"view": "shop.views.pay", "user": "42"})
    page = viewer.get(changelist_url())
    assert page.status_code == 200
    assert keys_on(page) == ["job:1"]
    assert "_selected_action" not in content(page) and "break_leases" not in content(page)
    detail = viewer.get(detail_url("job:1"))
    assert detail.status_code == 200 and "dynlock-break" not in content(detail)
    assert viewer.get(break_url("job:1")).status_code == 403
    assert viewer.post(break_url("job:1"), {"token": str(lease.token), "reason": "stuck"}).status_code == 403
    response = viewer.post(changelist_url(), {"action": "break_leases", "_selected_action": ["job:1"]})
    assert response.status_code == 403
    response = viewer.post(
        changelist_url(),
        {"action": "break_leases", "post": "yes", "key": "job:1", "token": str(lease.token), "reason": "x"},
    )
    assert response.status_code == 403
    assert lease.is_held and table.get("job:1").token == lease.token
    assert not LogEntry.objects.exists()


def test_superusers_may_do_everything(table, django_user_model):
    admin_user = django_user_model.objects.create_superuser("root", "root@localhost", PASSWORD)
    lease = table.acquire("job:1", lease=30)
    browser = client_for(admin_user)
    assert browser.get(changelist_url()).status_code == 200
    response = browser.post(break_url("job:1"), {"token": str(lease.token), "reason": "stuck"})
    assert response.status_code == 302
    assert table.get("job:1") is None


# -- the list ----------------------------------------------------------------------------------
def test_the_list_shows_holder_token_times_and_state(table, viewer):
    lease = table.acquire("invoice:42", lease=30, holder={"view": "shop.views.pay", "user": "42", "path": "/pay/42/"})
    page = viewer.get(changelist_url())
    text = content(page)
    assert keys_on(page) == ["invoice:42"]
    assert "shop.views.pay" in text and "user 42" in text
    assert f">{lease.token}<" in text
    info = table.get("invoice:42")
    assert f"{info.host}:{info.pid}" in text
    assert "ago" in text  # relative acquired time
    assert f"at {table.options.endpoint_url}, region us-east-1." in text  # which table: issue 14
    # The absolute acquired time, its date and time of day each kept on a line.
    assert localtime(info.acquired_at).strftime("<span>%Y-%m-%d</span> <span>%H:%M") in text
    assert re.search(r'<progress class="dynlock-left" max="100" value="(\d+)"', text)
    assert "dynlock-state-held" in text
    assert f'href="{detail_url("invoice:42")}"' in text


def test_elections_are_shown_with_each_terms_age(table, viewer):
    """issue 37: a term of client.election(name) gets a badge naming the election, and its
    age (time since it was elected) while it is held; a plain lease whose holder merely
    says ``election`` does not; a resigned term keeps the badge, without an age."""
    put_leases(table, ["election:beat"], holder={"command": "celery beat", "election": "beat"})  # acquired 5 s ago
    put_leases(table, ["job:1"], holder={"function": "jobs.run", "election": "beat"})
    put_leases(table, ["election:old"], holder={"command": "celery beat", "election": "old"}, held=False)
    text = content(viewer.get(changelist_url(all="1")))
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r'<tr class="dynlock-row" data-key="([^"]*)".*?</tr>', text, re.DOTALL)
    }
    assert re.search(
        r'<span class="dynlock-badge">election beat</span></div><div class="dynlock-term quiet">term age [56]s</div>',
        rows["election:beat"],
    )
    assert "dynlock-badge" not in rows["job:1"]
    assert '<span class="dynlock-badge">election old</span></div>' in rows["election:old"]
    assert "term age" not in rows["election:old"]
    detail = content(viewer.get(detail_url("election:beat")))
    assert re.search(r'election beat</span></div><div class="dynlock-term quiet">term age [56]s</div>', detail)


def test_a_semaphore_is_one_row_with_its_holders_beneath(table, operator):
    """issue 38: "export:acme 3/5" (the stored limit, how many hold it), then its holders by
    slot; slot 0 (the key's own item) keeps its page and its checkbox, the others are
    broken with ``breaklock --token``."""
    held = [table.acquire("export:acme", limit=5, lease=30, holder={"task": "export"}) for _ in range(3)]
    table.acquire("job:1", lease=30)
    text = content(operator.get(changelist_url()))
    assert keys_on(operator.get(changelist_url())) == ["job:1"]
    title = text.index('<th colspan="7" class="dynlock-key" scope="rowgroup">export:acme 3/5</th>')
    slots = re.findall(r'<tr class="dynlock-row dynlock-slot" data-key="export:acme".*?#(\d)<', text[title:], re.DOTALL)
    assert slots == sorted(str(lease.slot) for lease in held)  # each acquire starts at a random slot
    zero = any(lease.slot == 0 for lease in held)
    assert text.count('name="_selected_action" value="export:acme"') == zero  # slot 0's only
    assert (f'href="{detail_url("export:acme")}">#0</a>' in text) == zero
    assert text.count('<span title="Break it with manage.py breaklock KEY --token TOKEN">#') == 3 - zero
    for lease in held:
        lease.release()


def test_released_and_expired_items_only_with_the_filter(table, viewer):
    table.acquire("live", lease=30)
    released = table.acquire("done", lease=30)
    released.release()
    put_leases(table, ["crashed"], expires_in=-120)
    assert keys_on(viewer.get(changelist_url())) == ["live"]
    assert "1 expired hidden" in content(viewer.get(changelist_url()))
    page = viewer.get(changelist_url(all="1"))
    assert keys_on(page) == ["crashed", "done", "live"]
    text = content(page)
    assert "dynlock-state-released" in text and "dynlock-state-expired" in text


def test_search_by_key_prefix(table, viewer):
    put_leases(table, ["order:1", "order:2", "invoice:1"])
    assert keys_on(viewer.get(changelist_url(q="order:"))) == ["order:1", "order:2"]
    assert keys_on(viewer.get(changelist_url(q="nothing"))) == []


def test_key_prefix_of_the_alias_is_hidden_and_respected(moto_server, settings, viewer):
    with fresh_table(settings, moto_server.endpoint_url, KEY_PREFIX="shop1/") as client:
        name = client.options.table_name
        put_leases(client, ["order:1"])
        client.boto.put_item(TableName=name, Item={"key": {"S": "shop2/order:9"}, it.OWNER: {"S": "x"}})
        page = viewer.get(changelist_url())
        assert keys_on(page) == ["order:1"]
        detail = viewer.get(detail_url("order:1"))
        assert "shop1/order:1" in content(detail)  # the stored key, on the detail page


def test_one_dynamodb_call_per_page_and_cursor_pagination(dynlock, viewer):
    keys = [f"job:{n:03d}" for n in range(250)]
    put_leases(dynlock, keys)
    seen: list[str] = []
    url: str | None = changelist_url()
    pages = 0
    for _ in range(10):  # 250 leases, 100 a page: 3 pages (4 if the last one ends exactly at the limit)
        with count_calls(get_lock_client()) as calls:
            response = viewer.get(url)
        assert response.status_code == 200
        assert dict(calls) == {"Scan": 1}, "one DynamoDB call per page, never one per row"
        on_page = keys_on(response)
        assert len(on_page) <= LeaseAdmin.list_per_page
        seen += on_page
        pages += 1
        url = next_link(response)
        if url is None:
            break
        assert "cursor=" in url and "First page" in content(viewer.get(url))
    assert url is None
    assert sorted(seen) == keys and len(seen) == len(set(seen))
    assert 3 <= pages <= 4


def test_auto_refresh_is_off_by_default(table, viewer):
    text = content(viewer.get(changelist_url()))
    assert 'id="changelist">' in text and "data-refresh" not in text  # the script refreshes nothing
    assert re.search(r'<option value="" selected>off</option>', text)
    assert "django_dynlock/lease_refresh.js" in text  # which also reloads the page when a period is chosen


def test_the_auto_refresh_period_is_kept_in_the_pages_links(table, viewer):
    # issue 31: the demo's lease never showed in the list, which did not refresh
    put_leases(table, ["a"])
    put_leases(table, ["old"], expires_in=-120)
    response = viewer.get(changelist_url(refresh="2", cursor=encode_cursor({"key": {"S": "a"}}, "key")))
    text = content(response)
    assert 'id="changelist" data-refresh="2">' in text
    assert re.search(r'<option value="2" selected>every 2 seconds</option>', text)
    assert "refresh=2" in html.unescape(re.search(r'href="([^"]*)" class="dynlock-first"', text).group(1))
    assert "refresh=2" in response.context["toggle_all_url"]
    first = content(viewer.get(changelist_url(refresh="2")))
    assert "refresh=2" in html.unescape(re.search(r'href="([^"]*)">show them', first).group(1))
    one = content(viewer.get(changelist_url(refresh="1")))
    assert re.search(r'<option value="1" selected>every second</option>', one)


@pytest.mark.parametrize("value", ["3", "0", "-1", "abc", "1.5"])
def test_an_auto_refresh_period_not_offered_is_off_and_says_so(table, viewer, value):
    text = content(viewer.get(changelist_url(refresh=value)))
    assert "data-refresh" not in text
    assert "Auto-refresh is off: " in text and "is not one of its periods (1, 2, 5, 10, 30, 60 seconds)." in text


def test_an_invalid_cursor_shows_the_first_page(table, viewer):
    put_leases(table, ["a"])
    response = viewer.get(changelist_url(cursor="%21%21%21"))
    assert response.status_code == 200
    assert keys_on(response) == ["a"]
    assert "not valid any more" in content(response)


def test_the_detail_page_shows_every_attribute(table, viewer):
    lease = table.acquire("report:7", lease=30, holder={"command": "nightly", "user": "7", "shard": "eu-1"})
    text = content(viewer.get(detail_url("report:7")))
    info = table.get("report:7")
    for value in [
        info.key,
        str(info.token),
        info.owner,
        info.rvn,
        info.host,
        str(info.pid),
        info.thread,
        "nightly",
        "eu-1",
        "shard",
        "gc_at",
    ]:
        assert html.escape(value) in text, value
    lease.release()
    text = content(viewer.get(detail_url("report:7")))
    assert "dynlock-state-released" in text and html.escape(lease.owner) in text  # released_by
    missing = viewer.get(detail_url("never-locked"))
    assert missing.status_code == 200 and "has no item" in content(missing)


def test_the_detail_page_shows_what_an_operator_acts_on_first_and_folds_the_rest(table, operator):
    # issue 31: the holder shown twice, half the page the raw item's internal fields, times
    # "(holder's clock)" with microseconds
    lease = table.acquire("report:8", lease=30, holder={"command": "nightly", "user": "7"})
    text = content(operator.get(detail_url("report:8")))
    first = text.index('<table class="dynlock-detail">')
    folded = text.index('<details class="dynlock-more">')
    raw = text.index('<details class="dynlock-raw-item">')
    top = text[first:folded]
    for shown in ("report:8", str(lease.token), "nightly", "user 7", "dynlock-state-held", "Expires", "Acquired"):
        assert shown in top, shown
    assert top.index("dynlock-state-held") < top.index("nightly") < top.index(str(lease.token))
    assert text.index(f'href="{break_url("report:8")}"') < folded  # before anything folded
    for internal in (html.escape(lease.owner), "Record version", "Process id", "&quot;seq&quot;", "&quot;rvn&quot;"):
        assert internal not in top, internal
    assert "&quot;seq&quot;" in text[raw:]
    assert "&quot;rvn&quot;" in text[raw:] and "<details" in text[raw : raw + 40]  # the raw item, folded
    assert "(holder&#x27;s clock)" not in text and "(holder's clock)" not in text
    assert "(DynamoDB's clock)" in top  # a translated literal: not escaped
    times = re.findall(r"<time datetime=\"[^\"]+\">([^<]+)</time>", top)
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]+", t) for t in times), times
    lease.release()


def test_a_broken_lease_says_why_in_the_list_and_on_its_page(table, operator):
    table.acquire("job:9", lease=30)
    token = table.get("job:9").token
    assert table.break_lease("job:9", token=token, reason="stuck since noon", by="ops")
    listed = content(operator.get(changelist_url(all="1")))
    why = "stuck since noon, by ops"
    assert why in listed and why in content(operator.get(detail_url("job:9")))


def test_the_footer_counts_leases_in_both_views(table, viewer):
    # issue 31: "Page 1: 4 items" with released and expired included, "3 leases" without
    put_leases(table, ["a", "b", "c"])
    put_leases(table, ["d"], held=False)
    assert "Page 1: 3 leases." in content(viewer.get(changelist_url()))
    with_all = content(viewer.get(changelist_url(all="1")))
    assert "Page 1: 4 leases." in with_all and "items" not in with_all.split('class="paginator"')[1]


def test_the_key_column_keeps_short_keys_whole(table, viewer):
    # issue 31: overflow-wrap anywhere let the table squeeze the key column, which broke
    # keys mid-word beside the released rows; the column now keeps 32 characters
    text = content(viewer.get(changelist_url(all="1")))
    assert "th.field-key { min-width: min(32ch, 40vw); }" in text


# -- breaking -------------------------------------------------------------------------------------
def test_get_on_the_confirmation_page_breaks_nothing(table, operator):
    lease = table.acquire("job:1", lease=30)
    response = operator.get(break_url("job:1"))
    assert response.status_code == 200
    text = content(response)
    assert f'<input type="hidden" name="token" value="{lease.token}">' in text
    assert 'name="reason"' in text and f"Yes, break token {lease.token}" in text
    # A GET with the form's fields in the query string is still a GET.
    operator.get(break_url("job:1"), {"token": str(lease.token), "reason": "x"})
    operator.get(
        changelist_url(
            action="break_leases", _selected_action="job:1", post="yes", key="job:1", token=str(lease.token), reason="x"
        )
    )
    assert lease.is_held and table.get("job:1").token == lease.token
    assert not LogEntry.objects.exists()


def test_the_detail_page_links_to_the_confirmation_page(table, operator):
    table.acquire("job:1", lease=30)
    text = content(operator.get(detail_url("job:1")))
    assert f'href="{break_url("job:1")}"' in text


def test_break_with_the_right_token(table, operator, operator_user, broken_signals):
    lease = table.acquire("job:1", lease=30, holder={"function": "tasks.export"})
    response = operator.post(break_url("job:1"), {"token": str(lease.token), "reason": "stuck since noon"})
    assert response.status_code == 302 and response["Location"] == changelist_url()
    assert table.get("job:1") is None
    assert not lease.is_held and lease.lost_reason == "broken"
    entry = LogEntry.objects.get()
    assert entry.user == operator_user
    assert entry.object_id == "job:1" and entry.object_repr == "job:1"
    assert entry.content_type.model_class() is Lease
    assert "job:1" in entry.change_message and str(lease.token) in entry.change_message
    assert "stuck since noon" in entry.change_message
    assert entry.get_admin_url() == detail_url("job:1")
    [signal] = broken_signals
    assert signal["key"] == "job:1" and signal["token"] == lease.token and signal["reason"] == "stuck since noon"
    assert signal["by"] == f"admin:{operator_user.get_username()}" and signal["alias"] == "default"
    page = operator.get(response["Location"])
    assert "Broke the lease on" in content(page) and keys_on(page) == []
    # The item records who broke it and why.
    text = content(operator.get(detail_url("job:1")))
    assert (
        "dynlock-state-broken" in text
        and "stuck since noon" in text
        and f"admin:{operator_user.get_username()}" in text
    )
    # Recent actions on the admin index.
    index = content(operator.get(reverse("admin:index")))
    assert "Recent actions" in index and f'href="{detail_url("job:1")}"' in index


# A view that runs until the test lets it go, under each on_lost policy (this module is
# the URLconf of test_breaking_a_running_views_lease_*).
RUNNING: dict[str, threading.Event] = {}


def running_view(request):
    RUNNING["started"].set()
    assert RUNNING["go"].wait(30)
    return HttpResponse("done")


urlpatterns = [
    *project_urlpatterns,
    path("running/raise/", dynamo_lock("view:running")(running_view)),
    path("running/log/", dynamo_lock("view:running", on_lost="log")(running_view)),
]


@pytest.mark.parametrize(("on_lost", "status"), [("raise", 500), ("log", 200)])
def test_breaking_a_running_views_lease_answers_its_request_500_unless_on_lost_is_log(
    table, operator, settings, on_lost, status
):
    """What the break page warns of (issue 35): the view finishes, then its decorator's
    release finds the lease broken and raises LockLost, which Django answers 500."""
    settings.ROOT_URLCONF = __name__
    RUNNING.update(started=threading.Event(), go=threading.Event())
    answers = []
    request = threading.Thread(
        target=lambda: answers.append(Client(raise_request_exception=False).get(f"/running/{on_lost}/"))
    )
    request.start()
    try:
        assert RUNNING["started"].wait(30), "the view did not start"
        info = table.get("view:running")
        assert info is not None
        page = operator.get(break_url("view:running"))
        assert "answers 500" in content(page) and "on_lost" in content(page)
        response = operator.post(break_url("view:running"), {"token": str(info.token), "reason": "view stuck"})
        assert response.status_code == 302 and table.get("view:running") is None
    finally:
        RUNNING["go"].set()
        request.join(30)
    [answer] = answers
    assert answer.status_code == status
    assert status == 500 or answer.content == b"done"


def test_break_with_a_stale_token_breaks_nothing(table, operator, broken_signals):
    first = table.acquire("job:1", lease=30)
    stale = first.token
    first.release()
    second = table.acquire("job:1", lease=30)
    response = operator.post(break_url("job:1"), {"token": str(stale), "reason": "stuck"})
    assert response.status_code == 409
    text = content(response)
    assert "Not broken" in text and f"now has token {second.token}" in text
    assert f'<input type="hidden" name="token" value="{second.token}">' in text  # to confirm again, knowingly
    assert second.is_held and table.get("job:1").token == second.token
    assert not LogEntry.objects.exists() and not broken_signals
    # Once nobody holds it, the page says so.
    second.release()
    response = operator.post(break_url("job:1"), {"token": str(second.token), "reason": "stuck"})
    assert response.status_code == 409 and "is not held any more" in content(response)
    assert "Nothing to break" in content(operator.get(break_url("job:1")))


@pytest.mark.parametrize(
    "data",
    [
        {"reason": "stuck"},
        {"token": "", "reason": "stuck"},
        {"token": "abc", "reason": "stuck"},
        {"token": "TOKEN", "reason": ""},
        {"token": "TOKEN", "reason": "   "},
        {"token": "TOKEN", "reason": "x" * 501},
    ],
)
def test_break_needs_a_token_and_a_reason(table, operator, data):
    lease = table.acquire("job:1", lease=30)
    data = {k: v.replace("TOKEN", str(lease.token)) for k, v in data.items()}
    response = operator.post(break_url("job:1"), data)
    assert response.status_code == 400
    assert "dynlock-form-errors" in content(response)
    assert lease.is_held and not LogEntry.objects.exists()


def test_csrf_is_enforced(table, operator_user):
    lease = table.acquire("job:1", lease=30)
    browser = client_for(operator_user, enforce_csrf_checks=True)
    response = browser.post(break_url("job:1"), {"token": str(lease.token), "reason": "stuck"})
    assert response.status_code == 403
    response = browser.post(
        changelist_url(),
        {"action": "break_leases", "post": "yes", "key": "job:1", "token": str(lease.token), "reason": "stuck"},
    )
    assert response.status_code == 403
    assert lease.is_held
    page = content(browser.get(break_url("job:1")))
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = browser.post(
        break_url("job:1"), {"token": str(lease.token), "reason": "stuck", "csrfmiddlewaretoken": csrf}
    )
    assert response.status_code == 302 and not lease.is_held


def test_break_selected_leases_from_the_list(table, operator, broken_signals):
    a = table.acquire("batch:a", lease=30)
    b = table.acquire("batch:b", lease=30)
    c = table.acquire("batch:c", lease=30)
    page = content(operator.get(changelist_url()))
    assert 'name="_selected_action" value="batch:a"' in page and 'value="break_leases"' in page
    confirm = operator.post(
        changelist_url(), {"action": "break_leases", "_selected_action": ["batch:a", "batch:b", "gone"]}
    )
    assert confirm.status_code == 200
    text = content(confirm)
    assert f'name="key" value="batch:a"><input type="hidden" name="token" value="{a.token}">' in text
    assert f'name="key" value="batch:b"><input type="hidden" name="token" value="{b.token}">' in text
    assert "Not held any more: skipped" in text
    assert a.is_held and b.is_held  # showing the confirmation breaks nothing
    # b changes hands between the confirmation page and the POST.
    b_token = b.token
    b.release()
    b2 = table.acquire("batch:b", lease=30)
    response = operator.post(
        changelist_url(),
        {
            "action": "break_leases",
            "post": "yes",
            "key": ["batch:a", "batch:b"],
            "token": [str(a.token), str(b_token)],
            "reason": "deploy stuck",
        },
    )
    assert response.status_code == 302
    assert not a.is_held and b2.is_held and c.is_held
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == ["batch:a"]
    assert [s["key"] for s in broken_signals] == ["batch:a"]
    text = content(operator.get(response["Location"]))
    assert "Broke 1 lease" in text and "Not broken: the lease on &#x27;batch:b&#x27;" in text


def test_the_action_needs_a_selection_and_a_reason(table, operator):
    lease = table.acquire("job:1", lease=30)
    response = operator.post(changelist_url(), {"action": "break_leases"})
    assert response.status_code == 302
    assert "Select the leases" in content(operator.get(response["Location"]))
    response = operator.post(changelist_url(), {"action": "", "_selected_action": ["job:1"]})
    assert response.status_code == 302
    response = operator.post(
        changelist_url(),
        {"action": "break_leases", "post": "yes", "key": "job:1", "token": str(lease.token), "reason": ""},
    )
    assert response.status_code == 400
    response = operator.post(
        changelist_url(),
        {"action": "break_leases", "post": "yes", "key": ["job:1", "job:2"], "token": str(lease.token), "reason": "x"},
    )
    assert response.status_code == 400
    assert lease.is_held and not LogEntry.objects.exists()


# -- escaping and secrets ------------------------------------------------------------------------------
SCRIPT = "<script>alert('x')</script>"


def test_keys_and_holder_data_are_escaped(table, operator):
    key = f"{SCRIPT}\"'&<b>"
    holder = {"view": SCRIPT, "user": "<img src=x onerror=alert(1)>", "note": SCRIPT}
    lease = table.acquire(key, lease=30, holder=holder)
    pages = [
        operator.get(changelist_url()),
        operator.get(changelist_url(all="1")),
        operator.get(detail_url(key)),
        operator.get(break_url(key)),
        operator.post(changelist_url(), {"action": "break_leases", "_selected_action": [key]}),
        operator.post(break_url(key), {"token": str(lease.token + 1), "reason": SCRIPT}),
    ]
    for response in pages:
        text = content(response)
        assert response.status_code in (200, 409)
        assert "<script>" not in text and "<img src=x" not in text
        assert "&lt;script&gt;" in text
    assert keys_on(pages[0]) == [key]
    # The break goes through with the escaped key round-tripping through the form.
    response = operator.post(
        changelist_url(),
        {"action": "break_leases", "post": "yes", "key": key, "token": str(lease.token), "reason": SCRIPT},
    )
    assert response.status_code == 302 and not lease.is_held
    assert LogEntry.objects.get().object_id == key
    index = content(operator.get(reverse("admin:index")))
    assert "<script>" not in index


def test_no_secret_on_any_page(moto_server, settings, operator):
    secret = "s3cr3t-" + uuid.uuid4().hex
    endpoint = moto_server.endpoint_url.replace("http://", f"http://admin-user:{secret}@")
    existing, missing = table_name(), "missing-" + table_name()
    for name in (existing, missing):
        settings.DYNLOCK = {
            "default": alias_settings(
                endpoint,
                name,
                SESSION_OPTIONS={"aws_access_key_id": "AKIDSECRET" + secret[-6:], "aws_secret_access_key": secret},
            )
        }
        client = get_lock_client()
        lease = None
        if name == existing:
            client.create_table(wait=True)
            lease = client.acquire("job:1", lease=30)
        try:
            for url in all_urls():
                text = content(operator.get(url))
                assert secret not in text and secret[-6:] not in text and "admin-user" not in text
                assert "127.0.0.1" in text  # the endpoint is shown, without its user:password
            text = content(operator.post(break_url("job:1"), {"token": "1", "reason": "x"}))
            assert secret not in text and "admin-user" not in text
        finally:
            if lease is not None:
                lease.release()
            client.close()
    delete_table(moto_server.endpoint_url, existing)


# -- DynamoDB not there ---------------------------------------------------------------------------------
def test_a_missing_table_is_an_error_message_not_a_500(moto_server, settings, operator):
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, "no-such-" + table_name())}
    for url in all_urls():
        response = operator.get(url)
        assert response.status_code == 200, url
        text = content(response)
        assert "does not exist" in text and "createlocktable" in text and "errornote" in text
    response = operator.post(break_url("job:1"), {"token": "1", "reason": "x"})
    assert response.status_code == 503 and "createlocktable" in content(response)
    response = operator.post(changelist_url(), {"action": "break_leases", "_selected_action": ["job:1"]})
    assert response.status_code == 200 and "createlocktable" in content(response)
    response = operator.post(
        changelist_url(), {"action": "break_leases", "post": "yes", "key": "job:1", "token": "1", "reason": "x"}
    )
    assert response.status_code == 302 and "createlocktable" in content(operator.get(response["Location"]))


def test_an_unreachable_endpoint_is_an_error_message_not_a_500(settings, operator):
    settings.DYNLOCK = {
        "default": alias_settings(
            "http://127.0.0.1:9",
            "t-" + table_name(),
            CLIENT_CONFIG={"connect_timeout": 0.5, "read_timeout": 0.5, "retries": {"total_max_attempts": 1}},
        )
    }
    for url in all_urls():
        response = operator.get(url)
        assert response.status_code == 200
        text = content(response)
        assert "Could not connect to DynamoDB at http://127.0.0.1:9" in text
        assert "check --deploy --tag dynlock_table" in text


def test_access_denied_is_an_error_message(table, operator, monkeypatch):
    from botocore.exceptions import ClientError

    def denied(**kwargs):
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "Scan")

    monkeypatch.setattr(table.boto, "scan", denied)
    response = operator.get(changelist_url())
    assert response.status_code == 200
    assert "Access denied to table" in content(response) and "Grant the IAM principal" in content(response)


def test_a_broken_setting_is_an_error_message_without_its_value(settings, operator):
    settings.DYNLOCK = {"default": {"SESSION_OPTIONS": "s3cr3t-string", "REGION_NAME": DUMMY_REGION}}
    response = operator.get(changelist_url())
    assert response.status_code == 200
    text = content(response)
    assert "has errors" in text and "manage.py check" in text and "s3cr3t" not in text


# -- aliases ------------------------------------------------------------------------------------------
@pytest.fixture
def two_aliases(moto_server, settings):
    with contextlib.ExitStack() as stack:
        for alias in ("default", "jobs"):
            stack.enter_context(fresh_table(settings, moto_server.endpoint_url, alias))
        clients = {alias: get_lock_client(alias) for alias in ("default", "jobs")}  # the admin's own
        yield clients
        for client in clients.values():
            client.close()


def test_alias_selector(two_aliases, operator, broken_signals):
    two_aliases["default"].acquire("web:1", lease=30)
    job = two_aliases["jobs"].acquire("job:1", lease=30)
    page = operator.get(changelist_url())
    text = content(page)
    assert '<select id="dynlock-alias" name="alias">' in text
    assert '<option value="jobs">jobs</option>' in text and '<option value="default" selected>' in text
    assert keys_on(page) == ["web:1"]
    page = operator.get(changelist_url(alias="jobs"))
    assert keys_on(page) == ["job:1"]
    assert f'href="{detail_url("job:1")}?alias=jobs"' in content(page)
    assert 'name="alias" value="jobs"' in content(page)
    assert "job:1" in content(operator.get(detail_url("job:1") + "?alias=jobs"))
    assert "has no item" in content(operator.get(detail_url("job:1")))  # not in the default alias' table
    confirm = content(operator.get(break_url("job:1") + "?alias=jobs"))
    assert 'name="alias" value="jobs"' in confirm
    response = operator.post(break_url("job:1"), {"alias": "jobs", "token": str(job.token), "reason": "x"})
    assert response.status_code == 302 and response["Location"] == changelist_url(alias="jobs")
    assert not job.is_held
    assert broken_signals[0]["alias"] == "jobs"
    assert "alias jobs" in LogEntry.objects.get().change_message


def test_an_unknown_alias_is_an_error_message(two_aliases, operator):
    response = operator.get(changelist_url(alias="nope"))
    assert response.status_code == 200 and "DYNLOCK has no alias &#x27;nope&#x27;" in content(response)
    response = operator.post(break_url("x"), {"alias": "nope", "token": "1", "reason": "x"})
    assert response.status_code == 400 and "no alias" in content(response)
    response = operator.post(changelist_url(), {"alias": "nope", "action": "break_leases", "_selected_action": ["x"]})
    assert response.status_code == 302 and "no alias" in content(operator.get(response["Location"]))


def test_one_alias_shows_no_selector(table, viewer):
    assert 'name="alias" id' not in content(viewer.get(changelist_url()))
    assert "dynlock-alias-form" not in content(viewer.get(changelist_url()))


# -- keys that URLs and the admin log must carry (issue 14) ---------------------------------
def _detail_link(page, key: str) -> str:
    """The href of ``key``'s row in a list page, as a browser would read it."""
    for href, shown in re.findall(r'<th class="field-key dynlock-key"><a href="([^"]*)">([^<]*)</a>', content(page)):
        if html.unescape(shown) == key:
            return html.unescape(href)
    raise AssertionError(f"no row for {key!r}")


def _break_link(page) -> str:
    return html.unescape(re.search(r'<a href="([^"]*)" class="deletelink dynlock-break"', content(page)).group(1))


@pytest.mark.parametrize(
    "key",
    [".", "..", "é" * 1024, "~b64", "job:\x00", "a/../b"],
    ids=["dot", "dotdot", "2-KB-accented", "tilde", "nul", "slashes"],
)
def test_every_key_gets_links_that_survive_browsers_and_request_line_limits(table, operator, key):
    # issue 14: "." and ".." became path segments that browsers resolve (the break link of
    # "." opened the detail page of a key named "break"), and a 2 KB key of accented
    # letters gave a 6 KB URL, over gunicorn's 4094-byte request line
    from urllib.parse import urljoin

    lease = table.acquire(key, lease=30)
    origin = "http://testserver"
    detail = _detail_link(operator.get(changelist_url()), key)
    page = operator.get(detail)
    confirm = _break_link(page)
    for link in (detail, confirm):
        assert urljoin(origin + "/", link) == origin + link  # what a browser does to dot segments
        assert len(f"GET {link} HTTP/1.1".encode()) <= 4094
    assert html.escape(key) in content(page) or key == "job:\x00"
    response = operator.post(confirm, {"token": str(lease.token), "reason": "stuck"})
    assert response.status_code == 302 and not lease.is_held
    entry = LogEntry.objects.get()
    assert entry.get_admin_url() == detail  # the admin log links to this key's page


def test_a_break_of_a_key_with_a_nul_writes_an_audit_entry_without_one(table, operator):
    # issue 14: PostgreSQL refuses NUL in text, so the LogEntry written after the break
    # failed (a 500 once the lease was already broken); tests/test_postgresql.py runs the
    # same break on PostgreSQL
    key = "job:\x00"
    lease = table.acquire(key, lease=30)
    response = operator.post(break_url(key), {"token": str(lease.token), "reason": "stuck\x00 since noon"})
    assert response.status_code == 302 and not lease.is_held
    entry = LogEntry.objects.get()
    for text in (entry.object_id, entry.object_repr, entry.change_message):
        assert "\x00" not in text
    assert entry.object_repr == "job:\\x00" and "stuck\\x00 since noon" in entry.change_message
    assert "job:" in content(operator.get(entry.get_admin_url()))


def test_the_admin_log_links_a_break_in_another_alias_to_that_alias(two_aliases, operator):
    # issue 14: LogEntry.get_admin_url() carries the object id only, so it opened the
    # default alias' page, which has no such key
    job = two_aliases["jobs"].acquire("job:1", lease=30)
    response = operator.post(break_url("job:1"), {"alias": "jobs", "token": str(job.token), "reason": "x"})
    assert response.status_code == 302 and not job.is_held
    page = content(operator.get(LogEntry.objects.get().get_admin_url()))
    assert "has no item" not in page
    assert "(alias <strong>jobs</strong>)" in page and "broken" in page


def test_items_the_library_did_not_write_show_as_malformed_rows(table, operator, moto_server):
    # issue 14: a foreign item, an expires_at of 1e20, a fractional fence or binary
    # attributes gave a 500 on every page that read them
    from tests.support.malformed import put_malformed_items

    keys = put_malformed_items(dummy_client(moto_server.endpoint_url), table.options.table_name)
    table.acquire("good:1", lease=30)
    for listing, shown in ((changelist_url(), [k for k in keys if k != "foreign:1"]), (changelist_url(all="1"), keys)):
        page = operator.get(listing)  # the default list has held keys only: the foreign item has no owner
        assert page.status_code == 200
        assert keys_on(page) == sorted(shown + ["good:1"])
        assert content(page).count('class="dynlock-state dynlock-state-malformed"') == len(shown)
    for key in keys:
        detail = operator.get(detail_url(key))
        text = content(detail)
        assert detail.status_code == 200 and "malformed" in text, key
        confirm = operator.get(break_url(key))
        assert confirm.status_code == 200 and 'name="token"' not in content(confirm), key
    assert "not written by django-dynlock" in content(operator.get(detail_url("foreign:1")))
    assert "expires_at 1E+20 is not a time" in content(operator.get(detail_url("bad:expires")))
    assert "fence 1.5 is not a whole number" in content(operator.get(detail_url("bad:fence")))
    assert "owner is binary (B), not a string" in content(operator.get(detail_url("bad:binary")))
    selected = operator.post(changelist_url(), {"action": "break_leases", "_selected_action": keys})
    assert selected.status_code == 200 and 'name="token"' not in content(selected)


def test_a_break_whose_replies_were_lost_is_audited_once_a_reload_confirms_it(table, operator, settings, moto_server):
    # issue 14: the write landed but every reply was lost: the page said nothing was
    # broken (503) and no admin log entry was written
    from localdynamo.faultproxy import FaultProxy

    lease = table.acquire("job:lost", lease=30)
    with FaultProxy(moto_server.endpoint_url, max_seconds=60) as proxy:
        settings.DYNLOCK = {"default": alias_settings(proxy.endpoint_url, table.options.table_name)}
        attempts = get_lock_client().options.call_attempts
        proxy.lose_a_break(attempts)
        response = operator.post(break_url("job:lost"), {"token": str(lease.token), "reason": "stuck"})
        assert response.status_code == 302 and response["Location"] == detail_url("job:lost")
        assert table.get("job:lost") is None  # it did land
        assert not LogEntry.objects.exists()
        proxy.add_fault("reset", operation="GetItem", times=attempts)  # the first reload cannot tell yet
        page = content(operator.get(response["Location"]))
        assert "may have been broken: DynamoDB&#x27;s replies were lost. Reload the page to see" in page
        assert not LogEntry.objects.exists()
        page = content(operator.get(response["Location"]))  # the next one can
        assert f"Confirmed: the lease on &#x27;job:lost&#x27; (token {lease.token}) was broken." in page
        entry = LogEntry.objects.get()
        assert entry.change_message == f"Broke the lease on 'job:lost', token {lease.token}. Reason: stuck"
        operator.get(response["Location"])
        assert LogEntry.objects.count() == 1  # audited once
