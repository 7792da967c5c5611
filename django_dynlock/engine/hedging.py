"""Hedged requests: a second copy of a request whose reply is late, the first answer wins.

A reply that has not come after a few of this client's usual round trips is most
likely stuck behind something that has nothing to do with the request: a slow
connection, a packet lost, a front end that paused. A second copy, sent on another of
the pool's connections, usually gets through at the usual latency (Dean and Barroso,
"The Tail at Scale"). For a lock that matters more than for most requests: a holder
whose release is late keeps every waiter out for as long.

Only requests whose duplicate the protocol already survives are hedged (the Store
says which: consistent reads, and the writes of an acquire, a renewal, a release and
an undo, each of which recognises our own earlier success, docs/protocol.md). Both
copies may land, in either order; what the caller sees is decided by :class:`Race`:

- a reply wins at once: a read's, or a write's that was applied;
- a failure that says the copy may have been applied (a timeout, a 5xx) also ends the
  race at once: the caller then undoes or retries as after any such failure, and the
  other copy, if it lands, is one more late copy of the kind that failure allows for.
  Waiting for it could only turn the failure into a reply, and a copy sent after a
  stuck one and still unanswered when that one timed out is most likely stuck too: in
  an outage, waiting would add the hedge's delay to every request;
- a failure that says the copy was not applied (a failed condition, throttling, a
  refused connection) ends the race too, except for an acquire's write, whose
  condition can hold again later (the key frees): it waits for the other copy, for a
  condition that failed may have failed *because* the other copy landed first, and
  the other copy may still land. So an acquire hears "not applied" only when neither
  copy was or can be. A release's or a renewal's condition, once false, stays false for
  both copies (the owner and the sequence number only move on), and their callers
  recognise a copy of theirs that landed first by what the item shows: answering at
  once lets them read it before later holders overwrite it;
- the copy that loses is left to finish in its thread; its reply goes nowhere (its
  ``Date`` still informs the clock: it is as true as the winner's), except an acquire's
  copy that was applied after the other had won: it landed on a key we no longer held,
  and its caller frees it (``late``).

Where the wire path's lean exchange sends the request (engine/exchange.py), the first
copy runs on the caller's thread (``Hedger.send_in_place``, ``InPlace``): a reply in
time is read there, and only a late one gets its copy on a thread. Elsewhere (boto3, a
proxy, a new connection) each copy runs on a thread (``Hedger.send``).
"""

from __future__ import annotations

import contextvars
import logging
import queue
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .clock import monotonic
from .failures import error_code, may_have_applied

logger = logging.getLogger("django_dynlock")

# The failures that are answers: a condition that did not hold (store.CONDITION_FAILED).
_CONDITION_FAILED = ("ConditionalCheckFailedException", "TransactionCanceledException")

# When to send the copy: HEDGE_FACTOR x the 90th percentile of this client's last
# SAMPLES round trips, never before the HEDGE_AFTER setting (the floor) and never later
# than HEDGE_CAP (a reply that late is not latency any more). Until WARM round trips
# have been seen, the cap: a cold server's first replies (a JIT, a TLS handshake) are slow.
HEDGE_FACTOR = 3.0
HEDGE_CAP = 0.2
SAMPLES = 32
WARM = 8
# Copies in flight at once, per client. A request that finds every thread busy is sent
# on its caller's thread, unhedged: a hedge must never queue behind other requests.
THREADS = 16


class Race:
    """What the caller of a hedged request sees, from its copies' outcomes in the order
    they arrived. ``arrived`` returns True once that is decided; ``result`` then returns
    the winning reply or raises the failure that stands for all of them."""

    def __init__(self, copies: int = 2, *, patient: bool = False):
        self.patient = patient  # a not-applied failure waits for the other copies (an acquire's)
        self.left = copies
        self.reply: dict[str, Any] | None = None
        self.failures: list[BaseException] = []

    def arrived(self, reply: dict[str, Any] | None, failure: BaseException | None) -> bool:
        self.left -= 1
        if failure is None:
            self.reply = reply
            return True
        self.failures.append(failure)
        return self.left <= 0 or not self.patient or _ends_the_race(failure)

    def result(self) -> dict[str, Any]:
        if self.reply is not None or not self.failures:
            return self.reply or {}
        raise settle(self.failures)


def _ends_the_race(failure: BaseException) -> bool:
    """A failure that stands whatever the other copy does: the caller's own exception, or
    one that may have been applied (the outcome is ambiguous unless the other copy replies)."""
    return not isinstance(failure, (ClientError, BotoCoreError)) or may_have_applied(failure)


def settle(failures: list[BaseException]) -> BaseException:
    """The one failure that stands for every copy's, none of which was applied as far as
    its reply says: what the caller's own code raised into a request first (it is not the
    network's); then one that may have been applied (so the caller undoes or retries as
    after any ambiguous failure); then a failed condition (neither copy was applied, and
    the condition tells the caller why); else the first."""
    for failure in failures:
        if not isinstance(failure, (ClientError, BotoCoreError)):
            return failure
    for failure in failures:
        if may_have_applied(failure):
            return failure
    for failure in failures:
        if error_code(failure) in _CONDITION_FAILED:
            return failure
    return failures[0]


class _Threads:
    """Daemon threads that run copies, started as needed (at most ``limit`` at once) and
    kept. Daemons: a copy left waiting for a reply that never comes (up to a read timeout)
    must not hold up the interpreter's exit, which a ThreadPoolExecutor's threads do (they
    are joined at exit). Jobs are handed over on a SimpleQueue and answers come back on
    another: a Future and ``concurrent.futures.wait`` cost several times as much CPU."""

    def __init__(self, name: str, limit: int):
        self._name = name
        self.limit = limit
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = 0
        self._idle = 0
        self._started = 0
        self.ran = 0  # jobs taken: for tests and the curious

    def try_run(self, job: Callable[[], None]) -> bool:
        """Run ``job`` (which never raises) on a thread now, or say False: never queue behind others."""
        with self._lock:
            if self._busy >= self.limit:
                return False
            self._busy += 1
            self.ran += 1
            if self._idle:
                self._idle -= 1
            else:
                self._started += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._started}", daemon=True).start()
        self._jobs.put(job)
        return True

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()
            del job
            with self._lock:
                self._busy -= 1
                self._idle += 1

    def shutdown(self) -> None:
        """No more jobs; every thread ends once idle (those sending finish their copy first)."""
        with self._lock:
            self.limit = 0
            threads = self._started
        for _ in range(threads):
            self._jobs.put(None)


Answer = tuple[int, "dict[str, Any] | None", "BaseException | None"]


class Hedger:
    """One client's hedged sending: its copies' threads and its round trips' latencies."""

    def __init__(self, floor: float, *, threads: int = THREADS, name: str = "dynlock-hedge"):
        self.floor = floor
        self._threads = _Threads(name, threads)
        self._lock = threading.Lock()
        self._latencies: list[float] = []
        self._next = 0
        self._delay = max(floor, HEDGE_CAP)
        self.hedged = 0  # copies sent: for tests and the curious

    @property
    def delay(self) -> float:
        """How long a request waits for its reply before its copy goes out."""
        return self._delay

    def _learn(self, seconds: float) -> None:
        with self._lock:
            if len(self._latencies) < SAMPLES:
                self._latencies.append(seconds)
            else:
                self._latencies[self._next] = seconds
                self._next = (self._next + 1) % SAMPLES
            seen = len(self._latencies)
            if seen >= WARM and (seen < SAMPLES or self._next % 4 == 0):
                ordered = sorted(self._latencies)
                p90 = ordered[min(seen - 1, (seen * 9) // 10)]
                self._delay = max(self.floor, min(HEDGE_CAP, HEDGE_FACTOR * p90))

    def send(
        self,
        send: Callable[[str, dict[str, Any]], dict[str, Any]],
        operation: str,
        params: dict[str, Any],
        late: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """``send(operation, params)``, hedged: a copy after ``delay`` if no answer came.

        ``late``: given for an acquire's write, whose condition can hold again later: a
        failed condition waits for the other copy (``Race.patient``), and ``late`` is called
        (on the copy's thread) with the reply of a copy that was applied after the other
        had won, which can only have landed on a key we no longer held, and must be freed
        (see docs/protocol.md, "Hedged requests")."""
        answers: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        # Once the race is won by a reply: (the winner, ``late``), read by the other copy
        # when it answers; under ``watching``, so that ``late`` is called exactly once.
        watch: list[tuple[int, Callable[[dict[str, Any]], None]] | None] = [None]
        watching = threading.Lock()
        context = contextvars.copy_context()  # the caller's tracing span, for the request's observers

        def copy(index: int, params: dict[str, Any]) -> Callable[[], None]:
            def job() -> None:
                sent = monotonic()
                reply: dict[str, Any] | None = None
                failure: BaseException | None = None
                try:
                    reply = context.copy().run(send, operation, params)
                except BaseException as exc:  # handed to the waiting caller, as a pool's would be
                    failure = exc
                if failure is None or error_code(failure) in _CONDITION_FAILED:  # an answer: a round trip
                    self._learn(monotonic() - sent)
                with watching:
                    answers.put((index, reply, failure))
                    won = watch[0]
                if won is not None and reply is not None and won[0] != index:
                    _tell_late(won[1], reply)

            return job

        if not self._threads.try_run(copy(0, params)):
            return send(operation, params)  # every thread busy: unhedged, on this one
        try:
            answer = answers.get(timeout=self._delay)
        except queue.Empty:
            pass
        else:
            return _unwrap(answer)
        if not self._threads.try_run(copy(1, dict(params))):
            return _unwrap(answers.get())
        with self._lock:
            self.hedged += 1
        race = Race(2, patient=late is not None)
        while True:
            index, reply, failure = answers.get()
            if race.arrived(reply, failure):
                break
        if race.reply is not None and race.left > 0 and late is not None:
            with watching:
                watch[0] = (index, late)
                try:
                    other = answers.get_nowait()  # answered since, before it could see the watch
                except queue.Empty:
                    other = None
            if other is not None and other[1] is not None:
                _tell_late(late, other[1])
        return race.result()

    def send_in_place(
        self,
        send: Callable[[str, dict[str, Any]], dict[str, Any]],
        operation: str,
        params: dict[str, Any],
        late: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """``send``, hedged as by ``send``, with the first copy on the caller's thread.

        For a request the wire path's lean exchange will send (Store.send asks the Wire):
        the exchange, once the request is written, waits for the reply at most ``delay``
        (``InPlace.wait``), and only then does a copy go out on a thread. A prompt reply,
        the common case, costs no thread and no queue: handing the first copy to a thread
        and waiting for its answer cost 127 us of CPU per uncontended acquire + release.
        A first copy that does not reach the exchange after all (its connection closed,
        another thread took the idle one) hops to a thread at its transmission
        (``InPlace.run``), as every copy did before."""
        hedge = InPlace(self, send, operation, params, late)
        _first.hedge = hedge
        sent = monotonic()
        try:
            reply = send(operation, params)
        except Abandoned:
            return hedge.result()  # the copy decided the race; the first copy's connection is dealt with
        except BaseException as exc:
            if hedge.race is None:
                if error_code(exc) in _CONDITION_FAILED:
                    self._learn(monotonic() - sent)
                raise
            return hedge.first_answered(None, exc)
        finally:
            _first.hedge = None
        if hedge.race is None:
            self._learn(monotonic() - sent)
            return reply
        return hedge.first_answered(reply, None)

    def shutdown(self) -> None:
        """Stop taking copies; those in flight finish in their threads."""
        self._threads.shutdown()


# The hedged request whose first copy the caller's thread is sending (Hedger.send_in_place):
# taken by the wire path's transmission (take_first), which waits for it.
_first = threading.local()


def take_first() -> InPlace | None:
    """The hedged request whose first copy this thread is about to transmit, if any (once)."""
    hedge: InPlace | None = getattr(_first, "hedge", None)
    if hedge is not None:
        _first.hedge = None
    return hedge


class Abandoned(BaseException):  # noqa: N818 (not an error: the race was won by the copy)
    """Raised on the caller's thread, out of the first copy's transmission, once the copy
    has decided the race: the first copy's reply is not waited for. A BaseException, so
    that nothing on the way (botocore's mapping of transport errors, the Store's) takes
    it for the request's failure. ``reading``: the first copy's connection is read to
    its end on a thread (for ``late``), which then closes it; else it is closed now."""

    def __init__(self, reading: bool) -> None:
        super().__init__()
        self.reading = reading


class InPlace:
    """One hedged request whose first copy runs on the caller's thread (Hedger.send_in_place).

    Its copy goes out only if the first copy's reply is late (``wait``, ``run``); the race
    is then settled by :class:`Race`, as for ``Hedger.send``: the copy's answer is read in
    ``wait``/``run`` while the first copy's is not in; the first copy's outcome, once its
    stack on the caller's thread has one, in ``first_answered``."""

    def __init__(
        self,
        hedger: Hedger,
        send: Callable[[str, dict[str, Any]], dict[str, Any]],
        operation: str,
        params: dict[str, Any],
        late: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.hedger = hedger
        self.delay = hedger._delay  # noqa: SLF001
        self._send = send
        self._operation = operation
        self._params = params
        self._late = late
        self.race: Race | None = None  # once the copy is out
        self._bell: socket.socket | None = None  # rung by the copy once it answered (wait)
        self._won = False  # the first copy won with a reply, the copy still out: its late is told
        self._abandoned = False  # run's transmission, once the copy won

    # Made on the slow path only (_start): a prompt reply needs neither.
    # (0, the transmission's HTTP reply, failure): run's; (1, the copy's reply, failure).
    _answers: queue.SimpleQueue[tuple[int, Any, BaseException | None]]
    _watching: threading.Lock

    def _start(self) -> None:
        self._answers = queue.SimpleQueue()
        self._watching = threading.Lock()

    def _copy(self) -> bool:
        """Send the copy on a thread; False if every thread is busy (the request goes on unhedged)."""
        context = contextvars.copy_context()  # the caller's tracing span, for the request's observers
        params = dict(self._params)
        operation, send, hedger, late = self._operation, self._send, self.hedger, self._late

        def job() -> None:
            sent = monotonic()
            reply: dict[str, Any] | None = None
            failure: BaseException | None = None
            try:
                reply = context.run(send, operation, params)
            except BaseException as exc:  # handed to the caller, as a pool's would be
                failure = exc
            if failure is None or error_code(failure) in _CONDITION_FAILED:  # an answer: a round trip
                hedger._learn(monotonic() - sent)  # noqa: SLF001
            with self._watching:
                self._answers.put((1, reply, failure))
                won = self._won
                bell, self._bell = self._bell, None
            if bell is not None:
                try:
                    bell.send(b"\0")
                except OSError:
                    pass  # the caller stopped listening: its own reply came
                finally:
                    bell.close()
            if won and reply is not None and late is not None:
                _tell_late(late, reply)

        if not hedger._threads.try_run(job):  # noqa: SLF001
            return False
        with hedger._lock:  # noqa: SLF001
            hedger.hedged += 1
        self.race = Race(2, patient=late is not None)
        return True

    def wait(self, sock: socket.socket, left: float | None, finish: Callable[[], int]) -> float | None:
        """The first copy's reply did not come within ``delay`` (the lean exchange, on its
        pooled connection): send the copy, and wait until ``sock`` is readable (return the
        read timeout left for reading there) or the copy decides the race (raise
        :class:`Abandoned`). ``left``: the read timeout left (None: none). ``finish`` reads
        the first copy's reply off the connection and closes it, for an acquire's write
        (``late``: a first copy applied after the copy won must be freed)."""
        self._start()
        listen, bell = socket.socketpair()
        self._bell = bell
        if not self._copy():
            self._bell = None
            listen.close()
            bell.close()
            return left
        deadline = None if left is None else monotonic() + left
        selector = selectors.DefaultSelector()
        try:
            selector.register(sock, selectors.EVENT_READ)
            selector.register(listen, selectors.EVENT_READ)
            while True:
                timeout = None if deadline is None else max(0.0, deadline - monotonic())
                ready = selector.select(timeout)
                if not ready or any(key.fileobj is sock for key, _ in ready):
                    return None if deadline is None else max(0.0, deadline - monotonic())
                assert self.race is not None
                _, reply, failure = self._answers.get()
                if self.race.arrived(reply, failure):
                    raise self._abandon(finish)
                selector.unregister(listen)  # an acquire's copy failed its condition: the first copy decides
        finally:
            selector.close()
            with self._watching:
                bell_left, self._bell = self._bell, None
            listen.close()
            if bell_left is not None:
                bell_left.close()

    def _abandon(self, finish: Callable[[], int]) -> Abandoned:
        """The copy won while the first copy's reply is still out: its connection is closed,
        never pooled with a reply unread. An acquire's first copy is read to its end on a
        thread first: if it was applied, it landed after the copy won (``late``)."""
        late = self._late
        reading = False
        if late is not None:

            def job() -> None:
                try:
                    status = finish()
                except BaseException:  # noqa: BLE001 (no reply: a copy never answered is taken over at its expiry)
                    return
                if status < 300:
                    _tell_late(late, {})

            reading = self.hedger._threads.try_run(job)  # noqa: SLF001
        return Abandoned(reading)

    def run(self, transmit: Callable[[], Any]) -> Any:
        """``transmit()``, the first copy's transmission when it does not go through the lean
        exchange (a new connection, urlopen), on a thread, hedged as every copy was before:
        its result once it comes, or :class:`Abandoned` once the copy decides the race.
        ``transmit`` returns the HTTP reply (``.status``)."""
        late = self._late
        hedger = self.hedger
        self._start()

        def job() -> None:
            result: Any = None
            failure: BaseException | None = None
            try:
                result = transmit()
            except BaseException as exc:
                failure = exc
            with self._watching:
                self._answers.put((0, result, failure))
                abandoned = self._abandoned
            if abandoned and late is not None and result is not None and result.status < 300:
                _tell_late(late, {})

        if not hedger._threads.try_run(job):  # noqa: SLF001
            return transmit()  # every thread busy: unhedged, on this one
        try:
            answer = self._answers.get(timeout=self.delay)
        except queue.Empty:
            pass
        else:
            return _unwrap(answer)
        if not self._copy():
            return _unwrap(self._answers.get())
        assert self.race is not None
        while True:
            index, reply, failure = self._answers.get()
            if index == 0:
                return _unwrap((index, reply, failure))  # the first copy's stack goes on with it
            if self.race.arrived(reply, failure):
                break
        with self._watching:
            self._abandoned = True
            try:
                first = self._answers.get_nowait()  # transmitted since, before it could see the flag
            except queue.Empty:
                first = None
        if first is not None and late is not None and first[1] is not None and first[1].status < 300:
            _tell_late(late, {})
        raise Abandoned(True)  # the transmission finishes on its thread (urllib3 pools or closes the connection)

    def result(self) -> dict[str, Any]:
        """The race's outcome, once the copy decided it (Abandoned)."""
        assert self.race is not None
        return self.race.result()

    def first_answered(self, reply: dict[str, Any] | None, failure: BaseException | None) -> dict[str, Any]:
        """The first copy's outcome, the copy out: settled with the copy's, as ``Hedger.send`` settles."""
        race = self.race
        assert race is not None
        decided = race.arrived(reply, failure)
        while not decided:
            _, other_reply, other_failure = self._answers.get()
            decided = race.arrived(other_reply, other_failure)
        late = self._late
        if race.reply is not None and race.left > 0 and late is not None and reply is not None:
            # The first copy won, the copy still out: if it is applied, it landed after.
            with self._watching:
                self._won = True
                try:
                    other = self._answers.get_nowait()  # answered since, before it could see the watch
                except queue.Empty:
                    other = None
            if other is not None and other[1] is not None:
                _tell_late(late, other[1])
        return race.result()


def _unwrap(answer: Answer) -> dict[str, Any]:
    _, reply, failure = answer
    if failure is not None:
        raise failure  # the request's failure, as it was
    assert reply is not None
    return reply


def _tell_late(late: Callable[[dict[str, Any]], None], reply: dict[str, Any]) -> None:
    try:
        late(reply)
    except Exception:  # noqa: BLE001 (best effort: a late copy's key is taken over at its expiry)
        logger.warning("could not free a key a late copy held", exc_info=True)
