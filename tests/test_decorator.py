"""dynamo_lock on views, methods, services, coroutines and as a context manager, on real servers."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest
from django.test import AsyncClient

from django_dynlock import InvalidArgument, InvalidKey, LockLost, LockNotAcquired, dynamo_lock
from django_dynlock.signals import lock_acquired, lock_busy, lock_lost, lock_released
from testproject.booking.models import Booking, Event, SoldOut
from testproject.booking.services import book

pytestmark = pytest.mark.urls("tests.support.decorated_views")


def other(dynlock):
    from dataclasses import replace

    from django_dynlock import LockClient

    return LockClient(replace(dynlock.options))


@pytest.mark.django_db
def test_function_view_binds_url_kwargs_and_records_the_holder(dynlock, client, django_user_model):
    user = django_user_model.objects.create_user("ann")
    client.force_login(user)
    reply = client.get("/pay/42/")
    assert reply.status_code == 200
    data = reply.json()
    assert data["key"] == "order:42"
    assert data["holder"] == {"view": "tests.support.decorated_views.pay", "path": "/pay/42/", "user": str(user.pk)}
    assert dynlock.get("order:42") is None  # released after the view returned


@pytest.mark.django_db
def test_busy_view_answers_423_with_retry_after(dynlock, client):
    rival = other(dynlock)
    held = rival.acquire("order:7", lease=8)
    try:
        reply = client.get("/pay/7/")
        assert reply.status_code == 423 and 1 <= int(reply["Retry-After"]) <= 8
        assert client.get("/pay409/7/").status_code == 409
        custom = client.get("/paycustom/7/")
        assert custom.status_code == 503 and custom.content == b"busy order:7"
    finally:
        held.release()
        rival.close()


@pytest.mark.django_db
def test_a_423_carries_retry_after_when_another_thread_of_this_process_holds_the_key(dynlock, client):
    # issue 14: the in-process gate refused without a retry hint, and the 423 had no Retry-After
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with dynamo_lock("order:8", lease=8):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        reply = client.get("/pay/8/")
        assert reply.status_code == 423 and 1 <= int(reply["Retry-After"]) <= 8
    finally:
        release.set()
        holder.join(10)


def test_a_busy_response_always_carries_retry_after():
    from django_dynlock.decorators import busy_response

    assert busy_response(LockNotAcquired("k", holder=None, retry_after=None))["Retry-After"] == "1"
    assert busy_response(LockNotAcquired("k", holder=None, retry_after=2.2))["Retry-After"] == "3"


@pytest.mark.django_db
def test_class_based_views_on_a_method_and_on_dispatch(dynlock, client):
    assert client.post("/ship/5/").json()["key"] == "order:5"
    data = client.post("/cancel/6/").json()
    assert data["key"] == "order:6" and data["holder"]["view"].endswith("View.dispatch")


@pytest.mark.django_db(transaction=True)
def test_async_view_under_asgi_with_a_callable_key(dynlock):
    async def run():
        return await AsyncClient().get("/checkout/", {"user": "9"})

    reply = asyncio.run(run())
    assert reply.status_code == 200 and reply.json()["key"] == "cart:9"
    assert dynlock.get("cart:9") is None


@pytest.mark.django_db
def test_model_method_and_service_share_a_key_reentrantly(dynlock):
    event = Event.objects.create(name="Gig", seats_left=2)
    with count_writes(dynlock) as writes:
        booking = book(event.pk, "ann")  # service -> model method: same key, one acquire
    assert writes == 2  # one acquire, one release: the re-entry wrote nothing
    assert booking.token > 0 and Event.objects.get(pk=event.pk).seats_left == 1
    event.book_seat("bob")
    with pytest.raises(SoldOut):
        event.book_seat("cat")
    assert Booking.objects.count() == 2


def count_writes(dynlock):
    from tests.support.calls import count_calls

    class Counter:
        def __enter__(self):
            self.ctx = count_calls(dynlock)
            self.calls = self.ctx.__enter__()
            return self

        def __exit__(self, *exc):
            self.ctx.__exit__(*exc)

        def __eq__(self, number):
            return sum(self.calls.values()) == number

    return Counter()


def test_template_errors_are_caught_when_decorating():
    with pytest.raises(InvalidArgument, match=r"refers to \{ordr_id\}.*parameters: request, order_id"):

        @dynamo_lock("order:{ordr_id}")
        def view(request, order_id): ...

    with pytest.raises(InvalidArgument, match="named placeholders"):
        dynamo_lock("order:{0}")
    with pytest.raises(InvalidArgument, match="on_busy"):
        dynamo_lock("k", on_busy="ignore")
    with pytest.raises(InvalidArgument, match="must be called"):
        dynamo_lock(lambda: "k")(object())  # what a missing () leads to at call time


def test_service_function_skip_and_raise(dynlock):
    calls = []

    @dynamo_lock("report:{user.pk}:{kind}", on_busy="skip")
    def build_report(user, kind):
        calls.append(kind)
        return "built"

    @dynamo_lock("report:{user.pk}:{kind}")
    def build_strict(user, kind):
        return "built"

    class User:
        pk = 3

    assert build_report(User(), "sales") == "built"
    rival = other(dynlock)
    held = rival.acquire("report:3:sales")
    try:
        assert build_report(User(), "sales") is None and calls == ["sales"]
        with pytest.raises(LockNotAcquired) as caught:
            build_strict(User(), kind="sales")
        assert caught.value.key == "report:3:sales"
    finally:
        held.release()
        rival.close()


def test_exceptions_propagate_unchanged_and_the_lease_is_released(dynlock):
    @dynamo_lock("boom")
    def explode():
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        explode()
    assert dynlock.get("boom") is None


@pytest.mark.parametrize("key", ["export:{", "a{{b", "}x{"], ids=["lone-brace", "doubled-braces", "reversed"])
def test_a_key_without_placeholders_is_the_same_literal_key_in_a_with_block_and_a_decorator(mock_dynlock, key):
    # issue 14: with dynamo_lock("export:{") raised ValueError from str.format, and "a{{b"
    # locked "a{{b" in a with block but "a{b" as a decorator: no exclusion between them
    @dynamo_lock(key, wait=0)
    def job():
        return dynamo_lock.current().key

    with dynamo_lock(key, wait=0) as lease:
        assert lease.key == key
        with pytest.raises(LockNotAcquired):
            job()
    assert job() == key


def test_a_template_with_an_unclosed_placeholder_is_refused_at_decoration():
    with pytest.raises(InvalidArgument, match="without its closing brace"):

        @dynamo_lock("order:{order_id")
        def pay(order_id):
            pass


def test_quote_keeps_a_value_from_writing_the_templates_separator(mock_dynlock):
    # issue 14: "order:{order_id}" filled from /pay/42:refund/ locked "order:42:refund",
    # the key of another flow; quote=True percent-encodes each value
    @dynamo_lock("order:{order_id}:refund", wait=0)
    def refund(order_id):
        return dynamo_lock.current().key

    @dynamo_lock("order:{order_id}", wait=0)
    def pay(order_id):
        return refund(42)  # the refund flow of order 42, while this call holds its lock

    @dynamo_lock("order:{order_id}", wait=0, quote=True)
    def pay_quoted(order_id):
        assert dynamo_lock.current().key == "order:42%3Arefund"
        return refund(42)

    with pytest.raises(LockNotAcquired):  # without quote: the injected value holds refund's key
        pay("42:refund")
    assert pay_quoted("42:refund") == "order:42:refund"

    @dynamo_lock("report:{name}:{day:%Y-%m}", quote=True)
    def report(name, day):
        return dynamo_lock.current().key

    assert report("a b/%", dt.date(2026, 11, 23)) == "report:a%20b%2F%25:2026-11"
    with pytest.raises(InvalidArgument, match="quote=True applies to the key templates"):
        with dynamo_lock("export", quote=True):
            pass


def test_context_manager_and_several_keys(dynlock):
    with dynamo_lock("nightly-export", wait=0) as lease:
        assert dynamo_lock.current() is lease and lease.is_held
        assert dynlock.get("nightly-export").token == lease.token
    assert dynamo_lock.current() is None and dynlock.get("nightly-export") is None

    @dynamo_lock("acct:{src}", "acct:{dst}")
    def transfer(src, dst, amount):
        group = dynamo_lock.current()
        return sorted(group.tokens)

    assert transfer(2, 1, 10) == ["acct:1", "acct:2"]
    with pytest.raises(InvalidArgument, match="plain keys"):
        with dynamo_lock("order:{order_id}"):
            pass


def test_reentrancy_is_per_thread(dynlock):
    outcome = {}

    @dynamo_lock("re", reentrant=True)
    def inner():
        return dynamo_lock.current().token

    @dynamo_lock("re", reentrant=True)
    def outer():
        token = dynamo_lock.current().token
        outcome["same_thread"] = inner() == token

        def elsewhere():
            try:
                inner()
            except LockNotAcquired:
                outcome["other_thread"] = "busy"

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(10)

    outer()
    assert outcome == {"same_thread": True, "other_thread": "busy"}

    @dynamo_lock("nre")
    def not_reentrant():
        with dynamo_lock("nre"):
            pass

    with pytest.raises(LockNotAcquired):
        not_reentrant()


def test_reentrancy_is_per_asyncio_task(dynlock):
    @dynamo_lock("task", reentrant=True)
    async def inner():
        return dynamo_lock.current().token

    @dynamo_lock("task", reentrant=True)
    async def outer():
        token = dynamo_lock.current().token
        same = await inner()
        child = asyncio.create_task(inner())  # a new task inherits the context, not the lock
        with pytest.raises(LockNotAcquired):
            await child
        return same == token

    assert asyncio.run(outer())


def test_cancelled_coroutine_releases(dynlock):
    @dynamo_lock("cancel-me")
    async def slow(ready):
        ready.set()
        await asyncio.sleep(30)

    async def run():
        ready = asyncio.Event()
        task = asyncio.create_task(slow(ready))
        await asyncio.wait_for(ready.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert dynlock.get("cancel-me") is None


def test_lease_lost_during_the_call_raises_after_it_returns(dynlock):
    sent = []
    lock_lost.connect(receiver := (lambda **kw: sent.append(kw["reason"])), weak=False)
    try:

        @dynamo_lock("fragile")
        def work():
            lease = dynamo_lock.current()
            dynlock.break_lease("fragile", token=lease.token, reason="test")
            return "done"

        with pytest.raises(LockLost, match="broken"):
            work()
        assert "broken" in sent

        @dynamo_lock("fragile", on_lost="log")
        def tolerant():
            dynlock.break_lease("fragile")
            return "done"

        assert tolerant() == "done"
    finally:
        lock_lost.disconnect(receiver)


def test_a_lease_that_ran_out_during_the_call_is_reported_once(dynlock):
    sent = []
    lock_lost.connect(receiver := (lambda **kw: sent.append(kw["reason"])), weak=False)
    try:

        @dynamo_lock("slow", lease=1.5)
        def work():
            dynlock._heartbeater.stop()  # no renewals: a process paused past its lease
            time.sleep(1.6)
            return "done"

        with pytest.raises(LockLost, match="expired"):
            work()
        assert sent == ["expired"]
        assert dynlock.get("slow") is None  # nobody had taken it: freed all the same
    finally:
        lock_lost.disconnect(receiver)


def test_signals_carry_the_documented_arguments(dynlock):
    seen = {}

    def remember(signal_name):
        def receiver(sender, **kwargs):
            seen[signal_name] = kwargs

        return receiver

    receivers = {lock_acquired: remember("acquired"), lock_released: remember("released"), lock_busy: remember("busy")}
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        with dynamo_lock("sig", holder={"job": "x"}):
            with pytest.raises(LockNotAcquired):
                with dynamo_lock("sig"):
                    pass
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert seen["acquired"]["key"] == "sig" and seen["acquired"]["alias"] == "default"
    assert seen["acquired"]["holder"] == {"job": "x"} and seen["acquired"]["waited"] >= 0
    assert seen["released"]["held"] >= 0 and seen["released"]["token"] == seen["acquired"]["token"]
    assert seen["busy"]["key"] == "sig"


def test_current_is_only_what_this_thread_or_task_holds(dynlock):
    from asgiref.sync import sync_to_async

    def in_another_thread():
        return dynamo_lock.current()

    async def in_a_child_task():
        return dynamo_lock.current()

    @dynamo_lock("mine")
    async def holder():
        lease = dynamo_lock.current()
        # Both inherit a copy of the context, and with it the entry: not the lease.
        seen = await sync_to_async(in_another_thread, thread_sensitive=False)()
        child = await asyncio.create_task(in_a_child_task())
        return lease, seen, child

    lease, seen, child = asyncio.run(holder())
    assert lease is not None and seen is None and child is None


def test_a_generator_function_is_refused_at_decoration(dynlock):
    with pytest.raises(InvalidArgument, match="generator function .*gen.*unlocked"):

        @dynamo_lock("stream")
        def gen():
            yield 1

    with pytest.raises(InvalidArgument, match="generator function"):

        @dynamo_lock("stream")
        async def agen():
            yield 1


@pytest.mark.parametrize("returned", [None, 42, {"a": 1}], ids=["None", "42", "dict"])
def test_a_key_function_that_returns_no_key_is_refused_with_invalid_key(mock_dynlock, returned):
    # issue 14: None or 42 from a callable key gave a TypeError from list()
    @dynamo_lock(lambda job: returned)
    def run(job):
        raise AssertionError("the body must not run without its lock")

    with pytest.raises(InvalidKey, match=f"returned {type(returned).__name__}; it must return a key"):
        run(1)


@pytest.mark.parametrize("key", ["report:\udc80", "\ud800"], ids=["lone-low-surrogate", "lone-high-surrogate"])
def test_a_key_with_a_lone_surrogate_is_an_invalid_key(mock_dynlock, key):
    # issue 14: e.g. a URL segment decoded with surrogateescape; it raised UnicodeEncodeError
    with pytest.raises(InvalidKey, match="not valid Unicode"):
        mock_dynlock.acquire(key)

    @dynamo_lock("report:{name}")
    def report(name):
        raise AssertionError("the body must not run without its lock")

    with pytest.raises(InvalidKey, match="not valid Unicode"):
        report(key)


@pytest.mark.django_db
def test_a_view_with_a_long_url_records_its_path_cut_to_a_kilobyte(dynlock, client):
    # issue 14: the holder is capped (4 KB, each value 1 KB): the path a view records is
    # cut, so a long URL is locked like any other instead of being refused
    order = "9" * 1500
    reply = client.get(f"/pay/{order}/")
    assert reply.status_code == 200
    assert reply.json()["key"] == f"order:{order}"
    [stored] = [info for info in dynlock.leases(include_released=True) if info.key == f"order:{order}"]
    assert stored.holder["path"] == f"/pay/{order}/"[:1024]  # the released item keeps its holder


class Job:
    """No __str__ of its own: formats as <...Job object at 0x...>."""


def test_a_template_field_that_formats_as_an_address_is_refused(mock_dynlock):
    # issue 14: "job:{job}" locked "job:<Job object at 0x...>", a new key per call: no exclusion
    ran = []

    @dynamo_lock("job:{job}")
    def run(job):
        ran.append(job)

    for value in (Job(), run, object()):  # (a builtin such as print has no address in its text)
        with pytest.raises(InvalidArgument, match=r"\{job\} is a .* which names the object's address"):
            run(value)
    assert ran == []
    run("<Job object at 0x1>")  # a str is the caller's text, never refused
    run(42)
    assert ran == ["<Job object at 0x1>", 42]


@pytest.mark.parametrize(
    "template, says",
    [
        ("job:{job[0]}", "indexes into a value"),
        ("job:{job[id]}", "indexes into a value"),
        ("job:{job.__class__}", "private attribute"),
        ("job:{job.__dict__}", "private attribute"),
        ("job:{job._state.db}", "private attribute"),
    ],
)
def test_template_fields_that_index_or_reach_private_attributes_are_refused_at_decoration(template, says):
    with pytest.raises(InvalidArgument, match=says):
        dynamo_lock(template)
