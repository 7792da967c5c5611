"""Celery integration (``pip install django-dynlock[celery]``): task locks that retry,
and once-only queuing. See docs/celery.md.

- ``@dynamo_lock("report:{user_id}", on_busy="retry")`` under ``@app.task(bind=True)``:
  a busy key retries the task (``self.retry(countdown=retry-after)``) instead of
  failing it. This module supplies the retry and the task holder metadata; the
  decorator itself lives in decorators.py and imports this module only in a process
  that has imported Celery.
- :class:`QueueOnce`: ``apply_async``/``delay`` takes a lease at enqueue and hands it
  to the worker in the message's headers (``Lease.hand_over``); the worker continues
  it while the task runs (``LockClient.adopt``: renewed, fencing token in
  ``self.once_lease``) and releases it when the task ends. Nothing else runs between
  enqueue and start, so the lease is stamped for ``timeout`` seconds at enqueue: a task
  that never runs frees its key by then.
- :class:`LeaderScheduler`: a ``celery beat`` scheduler that sends only while it leads
  an election (``client.election``), wrapping the scheduler the project uses.

Importing this module imports Celery; nothing else in django_dynlock does.
"""

from __future__ import annotations

import contextvars
import datetime
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from celery import Task, beat, signals
from celery._state import get_current_task
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.utils import uuid
from celery.utils.imports import load_extension_class_names, symbol_by_name

from .conf import DEFAULT_ALIAS, get_options
from .engine.election import Election
from .engine.handover import Handover
from .engine.lease import Lease
from .exceptions import DynLockError, InvalidArgument, LockNotAcquired
from .keytemplates import check_templates, resolve_keys
from .registry import get_lock_client

logger = logging.getLogger("django_dynlock.celery")

__all__ = [
    "HEADER",
    "AlreadyQueued",
    "LeaderScheduler",
    "QueueOnce",
    "retry_busy_task",
    "running_task",
    "task_holder",
]

#: The message header that carries a QueueOnce task's lease to the worker.
HEADER = "dynlock_once"

#: celery-once's default: a task that never runs frees its key after an hour.
DEFAULT_TIMEOUT = 3600.0

_ONCE_OPTIONS = {"key", "keys", "timeout", "graceful", "unlock_before_run", "using", "lease"}


class AlreadyQueued(LockNotAcquired):
    """A task with the same once key is queued or running (celery-once's name).

    A :class:`LockNotAcquired`: ``key``, ``holder`` (who took it: the task name and id)
    and ``retry_after``, the seconds until that lease's stored expiry passes (at most
    the ``timeout`` while the task is queued; the worker's lease while it runs).
    """

    @property
    def countdown(self) -> float | None:
        """``retry_after`` under celery-once's name."""
        return self.retry_after


def running_task(args: Sequence[Any] = ()) -> Task | None:
    """The task a call runs in: a bound task's ``self`` (``args[0]``), else the task
    this worker thread is executing (``celery.current_task``), else None."""
    if args and isinstance(args[0], Task):
        return args[0]
    task = get_current_task()
    return task if isinstance(task, Task) else None


def task_holder(task: Task) -> dict[str, str]:
    """The holder metadata of a lease taken for ``task``: what showlocks and the admin
    show as its holder (``task``) and beside it (``task_id``)."""
    holder = {"task": str(task.name)}
    task_id = getattr(task.request, "id", None)
    if task_id:
        holder["task_id"] = str(task_id)
    return holder


def retry_busy_task(args: Sequence[Any], error: LockNotAcquired) -> NoReturn:
    """``on_busy="retry"``: retry the running task once the holder's lease could have
    run out (``error.retry_after``, at least a second).

    Raises the ``Retry`` Celery expects from ``self.retry()``; past ``max_retries``,
    Celery raises ``error`` itself, so the task fails with the LockNotAcquired.
    """
    task = running_task(args)
    if task is None:
        raise InvalidArgument(
            "on_busy='retry' retries the Celery task that runs the locked code, and no task is running: "
            "use it on a task's body (@app.task(bind=True) above @dynamo_lock(...))"
        ) from error
    raise task.retry(countdown=max(1.0, error.retry_after or 0.0), exc=error)


@dataclass(frozen=True)
class _Once:
    """A QueueOnce task's ``once`` options, checked."""

    template: str
    timeout: float
    graceful: bool
    unlock_before_run: bool
    using: str
    lease: float | None


@dataclass
class _Running:
    """The once lease of the task this context runs (for retries and ``once_lease``)."""

    task_id: str
    lease: Lease
    alias: str
    handed_over: bool = False


_running: contextvars.ContextVar[_Running | None] = contextvars.ContextVar("dynlock_once_running", default=None)


class QueueOnce(Task):
    """A task that is queued at most once at a time per key: celery-once's ``QueueOnce``
    on DynamoDB leases.

    ::

        @app.task(base=QueueOnce, once={"key": "report:{user_id}", "timeout": 3600})
        def build_report(user_id): ...

    ``delay``/``apply_async`` raise :class:`AlreadyQueued` while a task with the same key
    is queued or running (``once={"graceful": True}``: return None instead). ``once``
    options: ``key`` (a template over the task's arguments, as ``dynamo_lock``'s),
    or ``keys`` (celery-once's list of argument names; default all of them, under
    the task's name); ``timeout`` (seconds a queued task keeps its key, default 3600);
    ``graceful``; ``unlock_before_run`` (free the key when the task starts rather than
    when it ends); ``using`` (the DYNLOCK alias); ``lease`` (the lease renewed while the
    task runs, default the alias' LEASE_DURATION: how soon a killed worker frees it).
    """

    abstract = True
    once: Mapping[str, Any] = {}

    # -- options ---------------------------------------------------------------------
    def _once(self) -> _Once:
        options = dict(self.once or {})
        unknown = set(options) - _ONCE_OPTIONS
        if unknown:
            raise InvalidArgument(
                f"{self.name}: unknown once options {sorted(unknown)}; known: {sorted(_ONCE_OPTIONS)}"
            )
        template = options.get("key")
        if template is None:
            names = options.get("keys")
            if names is None:
                names = [
                    p.name
                    for p in inspect.signature(self.run).parameters.values()
                    if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                ]
            template = str(self.name) + "".join(f":{name}={{{name}}}" for name in names)
        if not isinstance(template, str) or not template:
            raise InvalidArgument(f"{self.name}: once['key'] must be a key template, got {template!r}")
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT))
        lease = options.get("lease")
        return _Once(
            template=template,
            timeout=timeout,
            graceful=bool(options.get("graceful", False)),
            unlock_before_run=bool(options.get("unlock_before_run", False)),
            using=str(options.get("using", DEFAULT_ALIAS)),
            lease=float(lease) if lease is not None else None,
        )

    def once_key(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None) -> str:
        """The lock key of a call with these arguments (the template filled as ``dynamo_lock`` does).

        Values filled into a ``keys`` key are percent-encoded (``quote``), so that no
        argument can write the separators; a ``key`` template is filled as written.
        """
        once = self._once()
        signature = check_templates([once.template], self.run)
        quote = "key" not in (self.once or {})
        return resolve_keys([once.template], signature, tuple(args or ()), dict(kwargs or {}), quote)[0]

    @property
    def once_lease(self) -> Lease | None:
        """The once lease while this task runs in a worker (its ``token`` fences your writes), else None."""
        running = _running.get()
        if running is None or running.task_id != getattr(self.request, "id", None):
            return None
        return running.lease

    # -- enqueue ---------------------------------------------------------------------
    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> Any:
        """Take the once lease, then send the task with it; AlreadyQueued (or None, graceful) when busy."""
        once = self._once()
        headers = dict(options.pop("headers", None) or {})
        running = _running.get()
        handover: Handover | None = None
        if running is not None and task_id == running.task_id and HEADER in headers:
            # self.retry() re-sends the running task: the lease goes with the new message.
            handover = self._hand_on(running, once, options)
        if handover is None:
            headers.pop(HEADER, None)  # never trust a lease we did not take here
            task_id = task_id or uuid()
            client = get_lock_client(once.using)
            key = self.once_key(args, kwargs)
            try:
                lease = client.acquire(key, wait=0, lease=once.timeout, holder={"task": self.name, "task_id": task_id})
            except LockNotAcquired as busy:
                if once.graceful:
                    return None
                raise AlreadyQueued(key, holder=busy.holder, retry_after=busy.retry_after) from None
            handover = lease.hand_over()  # no write: the acquire stamped `timeout` already
        headers[HEADER] = {**handover.as_dict(), "alias": once.using}
        try:
            return super().apply_async(
                args,
                kwargs,
                task_id=task_id,
                producer=producer,
                link=link,
                link_error=link_error,
                shadow=shadow,
                headers=headers,
                **options,
            )
        except BaseException:
            # Not sent: nothing will run to free the key, so free it now.
            _release_quietly(handover, once.using, "the task could not be sent")
            raise

    def _hand_on(self, running: _Running, once: _Once, options: Mapping[str, Any]) -> Handover | None:
        """Hand the running task's lease to its retry: kept for the countdown plus ``timeout``."""
        countdown = options.get("countdown") or 0.0
        eta = options.get("eta")
        if isinstance(eta, datetime.datetime):
            countdown = max(countdown, (eta - datetime.datetime.now(tz=eta.tzinfo)).total_seconds())
        try:
            handover = running.lease.hand_over(keep=once.timeout + max(0.0, float(countdown)))
        except DynLockError as exc:
            # Lost while the task ran (an outage, a break): the retry queues like a new task.
            logger.warning(
                "%s[%s]: the once lease on %r ended early: %s", self.name, running.task_id, running.lease.key, exc
            )
            return None
        running.handed_over = True
        return handover

    # -- run -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task under the lease its enqueue took; release it however the task ends.

        A task sent without the header (``send_task`` by name, a message from before
        QueueOnce) or called directly runs unlocked. One whose lease ended before it
        started (queued past ``timeout``, delivered again) takes the key afresh if it is
        free, and otherwise runs all the same and says so (see ``_take_anew``).
        """
        ticket = _ticket(self.request)
        if ticket is None or getattr(self.request, "called_directly", True):
            return super().__call__(*args, **kwargs)
        handover, alias = ticket
        client = get_lock_client(alias)
        once = self._once()
        if once.unlock_before_run:
            _release_quietly(handover, alias, "unlock_before_run")
            return super().__call__(*args, **kwargs)
        try:
            lease = client.adopt(handover, lease=once.lease)
        except DynLockError as exc:
            taken = _take_anew(self, client, handover, once, exc)
            if taken is None:
                return super().__call__(*args, **kwargs)
            lease = taken
        running = _Running(task_id=str(self.request.id), lease=lease, alias=alias)
        token = _running.set(running)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _running.reset(token)
            if not running.handed_over:
                try:
                    lease.release()
                except DynLockError as exc:
                    # The task's own outcome (its value, its exception: SoftTimeLimitExceeded,
                    # Retry) is what Celery must see; a lease that ended early is logged.
                    logger.warning(
                        "%s[%s]: the once lease on %r ended early: %s", self.name, self.request.id, lease.key, exc
                    )


def _take_anew(task: QueueOnce, client: Any, handover: Handover, once: _Once, why: DynLockError) -> Lease | None:
    """The lease this message carried is gone: queued past ``timeout``, or delivered
    again after a worker crash (``acks_late``), its first run's lease since run out.
    Take the key afresh if it is free (a new token); if it is not (another enqueue or
    another copy of this message holds it), run unlocked and say so: the message is
    queued, and queuing once is about what is queued, not what runs."""
    lease: Lease | None
    try:
        lease = client.try_acquire(handover.key, lease=once.lease, holder=task_holder(task))
    except DynLockError:
        lease = None
    if lease is None:
        logger.warning("%s[%s] runs without its once lease on %r: %s", task.name, task.request.id, handover.key, why)
    return lease


def _ticket(source: Any) -> tuple[Handover, str] | None:
    """The lease a task's message carries, or None (none, or not one of ours).

    ``source``: a task's request (the header is an attribute, and in ``headers``), or
    a message's headers (a mapping)."""
    if isinstance(source, Mapping):
        data = source.get(HEADER)
    else:
        data = getattr(source, HEADER, None)
        if data is None:
            data = (getattr(source, "headers", None) or {}).get(HEADER)
    if not isinstance(data, Mapping):
        return None
    try:
        return Handover.from_dict(data), str(data.get("alias") or DEFAULT_ALIAS)
    except InvalidArgument:
        logger.warning("ignoring a malformed %s header: %r", HEADER, data)
        return None


def _release_quietly(handover: Handover, alias: str, why: str, *, adopter_dead: bool = False) -> None:
    try:
        get_lock_client(alias).release_handover(handover, even_if_adopted=adopter_dead)
    except DynLockError as exc:
        logger.warning("could not release the once lease on %r (%s); it ends at its expiry: %s", handover.key, why, exc)


# -- ends the worker's main process sees, not the task ----------------------------------
# A task revoked before it ran, a pool process killed (hard time limit, OOM): the task's
# own code never reaches its release, so the worker's main process releases the lease
# its message carried. Hard time limits report the task id only, so the main process
# remembers the leases of the messages it received (a bounded map: a missed one simply
# ends at its expiry).

_RECEIVED_CAP = 10_000
_received: OrderedDict[str, tuple[Handover, str]] = OrderedDict()
_received_lock = threading.Lock()  # the consumer and the pool's timeout handler both use it


def _forget(task_id: str | None) -> tuple[Handover, str] | None:
    if not task_id:
        return None
    with _received_lock:
        return _received.pop(task_id, None)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is None or not isinstance(getattr(request, "task", None), QueueOnce):
        return
    ticket = _ticket(getattr(request, "request_dict", None) or {})
    if ticket is not None:
        with _received_lock:
            _received[request.id] = ticket
            while len(_received) > _RECEIVED_CAP:
                _received.popitem(last=False)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if not isinstance(sender, QueueOnce):
        return
    remembered = _forget(getattr(request, "id", None))
    ticket = _ticket(request) or remembered
    if ticket is not None:
        _release_quietly(*ticket, why="revoked")


def _on_failure(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    if not isinstance(sender, QueueOnce) or not isinstance(exception, (TimeLimitExceeded, WorkerLostError)):
        return  # other failures happen in the task, whose own code released the lease
    remembered = _forget(task_id)
    request = sender.request
    ticket = (_ticket(request) if getattr(request, "id", None) == task_id else None) or remembered
    if ticket is not None:
        # The pool process that ran it was killed: its adopted lease is nobody's now.
        _release_quietly(*ticket, why=type(exception).__name__, adopter_dead=True)


def _on_postrun(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    _forget(task_id)  # in a solo or threads pool the main process ran it: done with it


# Connected by calls rather than as decorators: Celery's connect is untyped, and a
# decorator from it would leave these functions untyped too.
signals.task_received.connect(_on_received, weak=False)
signals.task_revoked.connect(_on_revoked, weak=False)
signals.task_failure.connect(_on_failure, weak=False)
signals.task_postrun.connect(_on_postrun, weak=False)


# -- celery beat: send only while leading ------------------------------------------------

#: What :class:`LeaderScheduler` wraps when neither ``dynlock_beat_scheduler`` nor
#: ``beat_scheduler`` names another scheduler: beat's default.
DEFAULT_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"


def _scheduler_class(named: type[Any] | str) -> Any:
    """The class a scheduler setting names: a class, ``"module:Class"``, or an alias that a
    package registers for ``celery beat -S`` (django-celery-beat's ``django``), as beat
    resolves it."""
    if not isinstance(named, str):
        return named
    return symbol_by_name(named, aliases=dict(load_extension_class_names("celery.beat_schedulers")))


def scheduler_to_wrap(conf: Mapping[str, Any]) -> type[Any] | str:
    """What a :class:`LeaderScheduler` named by ``-S`` or ``beat_scheduler`` wraps:
    ``dynlock_beat_scheduler``; else ``beat_scheduler`` when it names another scheduler (a
    project that set ``CELERY_BEAT_SCHEDULER`` to django-celery-beat's DatabaseScheduler
    and starts beat with ``-S django_dynlock.celery.LeaderScheduler``: its periodic tasks
    are in the database, and wrapping beat's default would silently send none of them);
    else beat's default."""
    named = conf.get("dynlock_beat_scheduler")
    if named:
        return cast("type[Any] | str", named)
    configured = conf.get("beat_scheduler")
    if configured:
        try:
            leader = issubclass(_scheduler_class(configured), LeaderScheduler)
        except Exception:  # noqa: BLE001 - not importable here: wrapping() says why, or beat does
            leader = False
        if not leader:
            return cast("type[Any] | str", configured)
    return DEFAULT_BEAT_SCHEDULER


# One class per scheduler wrapped, so that beat's lazy instances (its banner) and the
# real one share it.
_wrappers: dict[tuple[type[Any], type[Any]], type[LeaderScheduler]] = {}


class LeaderScheduler(beat.Scheduler):
    """A ``celery beat`` scheduler that sends the schedule only while it leads an election.

    Run ``celery beat -S django_dynlock.celery.LeaderScheduler`` (or set
    ``beat_scheduler``) on as many hosts as you like: one leads and sends, the others
    stand by and one takes over within the lease + 3 s of the leader's death.

    It wraps the scheduler the project already uses, named by the Celery setting
    ``dynlock_beat_scheduler``, or else by ``beat_scheduler`` when beat is started with
    ``-S django_dynlock.celery.LeaderScheduler`` (django-celery-beat's
    ``"django_celery_beat.schedulers:DatabaseScheduler"``, or its alias ``django``),
    beat's ``PersistentScheduler`` if neither names one, or given to :meth:`wrapping`.
    That scheduler keeps the schedule; this class decides whether a due entry is sent:

    - each :meth:`tick` campaigns first (``campaign(wait=0)``: at most one request,
      at a standby's cadence) unless a term is held;
    - an entry is sent only if the term is held when it is about to be sent, with
      ``send_margin`` seconds of its validity left (a local check, no request). A
      standby still moves its entries on as if it had sent them, so that on taking
      over it does not send again what the old leader sent;
    - a timeout or a DynamoDB error is logged and beat keeps ticking as a standby
      (RedBeat #92); after a lost term it campaigns again at the next tick;
    - only the leader saves the schedule's state (``sync``): a shared store such as
      django-celery-beat's tables is written by one beat;
    - on shutdown (``close``) it saves the schedule, then resigns.

    Other Celery settings: ``dynlock_beat_election`` (the election's name, default
    ``"beat:<app main name>"``), ``dynlock_beat_lease`` (seconds; default the alias'
    ``LEASE_DURATION``), ``dynlock_beat_using`` (the ``DYNLOCK`` alias).
    ``beat_max_loop_interval`` should be at most a third of the lease (check
    ``dynlock.W005``).
    """

    #: The scheduler this class wraps (set by :meth:`wrapping`).
    wrapped: type[beat.Scheduler] | None = None
    #: Given to :meth:`wrapping`; else the Celery settings ``dynlock_beat_*``.
    election_name: str | None = None
    lease: float | None = None
    using: str | None = None
    #: A send needs this many seconds of the term's validity left (at most a quarter of
    #: the lease): a send to the broker takes milliseconds, and a term that ends during
    #: one cannot stop it.
    send_margin: float = 1.0

    def __new__(cls, *args: Any, **kwargs: Any) -> LeaderScheduler:
        if cls.wrapped is None:
            app = kwargs.get("app", args[0] if args else None)
            cls = cls.wrapping(scheduler_to_wrap(app.conf) if app is not None else DEFAULT_BEAT_SCHEDULER)
        instance: LeaderScheduler = object.__new__(cls)
        return instance

    @classmethod
    def wrapping(
        cls,
        scheduler: type[beat.Scheduler] | str,
        *,
        election: str | None = None,
        lease: float | None = None,
        using: str | None = None,
    ) -> type[LeaderScheduler]:
        """A LeaderScheduler class around ``scheduler`` (a class, or its ``"module:Class"``
        name), for ``beat_scheduler`` or ``-S``: ``LeaderScheduler.wrapping(DatabaseScheduler)``.

        ``election``, ``lease``, ``using`` override the ``dynlock_beat_*`` settings."""
        inner = _scheduler_class(scheduler)
        if not isinstance(inner, type) or not issubclass(inner, beat.Scheduler):
            raise InvalidArgument(f"LeaderScheduler wraps a celery.beat.Scheduler subclass, got {scheduler!r}")
        if issubclass(inner, LeaderScheduler):
            raise InvalidArgument(f"{inner.__name__} is a LeaderScheduler already: name the scheduler it wraps")
        if cls.wrapped is not None:
            raise InvalidArgument(f"{cls.__name__} wraps {cls.wrapped.__name__} already")
        if lease is not None:
            lease = float(lease)
        options = {"election_name": election, "lease": lease, "using": using}
        if election is None and lease is None and using is None:
            cached = _wrappers.get((cls, inner))
            if cached is not None:
                return cached
        made = type(
            f"{cls.__name__}[{inner.__name__}]",
            (cls, inner),
            {"wrapped": inner, "__module__": cls.__module__, "__qualname__": cls.__qualname__, **options},
        )
        if election is None and lease is None and using is None:
            _wrappers[(cls, inner)] = made
        return made

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._election: Election | None = None
        self._leading = False  # whether the last check found a term held (for the log)
        self._standby_said = False
        super().__init__(*args, **kwargs)
        conf = self.app.conf
        self.election_name = (
            self.election_name or conf.get("dynlock_beat_election") or f"beat:{self.app.main or 'celery'}"
        )
        self.using = self.using or conf.get("dynlock_beat_using") or DEFAULT_ALIAS
        if self.lease is None and conf.get("dynlock_beat_lease") is not None:
            self.lease = float(conf.get("dynlock_beat_lease"))
        if not kwargs.get("lazy"):
            self._warn_of_a_long_loop()

    def _warn_of_a_long_loop(self) -> None:
        """dynlock.W005 at startup: this sees beat's ``--max-interval`` and any Celery
        configuration, which the Django system check (settings only) cannot."""
        from .checks import beat_loop_warning

        try:
            lease = self.lease if self.lease is not None else get_options(str(self.using)).lease_duration
        except DynLockError:
            return  # the client refuses such settings at the first tick, and says why
        warning = beat_loop_warning(float(self.max_interval), lease, "beat_max_loop_interval")
        if warning is not None:
            logger.warning("%s %s (%s)", warning.msg, warning.hint, warning.id)

    @property
    def info(self) -> str:
        wrapped = f"{self.wrapped.__module__}:{self.wrapped.__qualname__}" if self.wrapped else "?"
        lines = [
            super().info,
            f"    . election -> {self.election_name} (DYNLOCK alias {self.using!r})",
            f"    . wraps -> {wrapped}",
        ]
        return "\n".join(line for line in lines if line)

    # -- leadership -------------------------------------------------------------------
    @property
    def election(self) -> Election:
        """The election this beat campaigns in (made at the first tick)."""
        if self._election is None:
            client = get_lock_client(str(self.using))
            holder = {"command": "celery beat", "scheduler": self.wrapped.__name__ if self.wrapped else "?"}
            self._election = client.election(str(self.election_name), lease=self.lease, holder=holder)
        return self._election

    @property
    def term(self) -> Lease | None:
        """The current or last term, or None before the first election."""
        return self._election.term if self._election is not None else None

    def may_send(self) -> bool:
        """Whether a send may start now: a term held, with ``send_margin`` of its validity
        left (a quarter of the lease at most). Local: no request."""
        term = self.term
        if term is None or not term.is_held:
            return False
        return term.remaining() >= min(self.send_margin, term.lease_seconds / 4)

    def _campaign(self) -> None:
        term = self.term
        if term is not None and term.is_held:
            return
        if self._leading:
            self._leading = False
            logger.warning(
                "beat: term %s of election %r ended (%s); sending nothing, campaigning again",
                term.token if term else None,
                self.election_name,
                term.lost_reason if term else None,
            )
        try:
            term = self.election.campaign(wait=0)
        except LockNotAcquired as busy:
            if not self._standby_said:
                self._standby_said = True
                leader = f", led by {busy.holder.describe()}" if busy.holder is not None else ""
                logger.info("beat: standing by in election %r%s: sending nothing", self.election_name, leader)
            return
        except Exception as exc:
            # Never end beat over the election (RedBeat #92): a timeout, an outage, a
            # refusal. Stand by, sending nothing, and try again at the next tick.
            logger.warning("beat: could not campaign in election %r, standing by: %r", self.election_name, exc)
            return
        self._leading = True
        self._standby_said = False
        logger.info("beat: elected leader of %r (term %s): sending the schedule", self.election_name, term.token)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Campaign if no term is held, then the wrapped scheduler's tick (which sends
        through :meth:`apply_entry`, each send checked). A standby wakes at least every
        ``poll`` seconds, the election's cadence, whatever the schedule."""
        self._campaign()
        interval: float = super().tick(*args, **kwargs)
        if not self.may_send() and self._election is not None:
            interval = min(interval, self._election.poll)
        return interval

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if not self.may_send():
            logger.debug("beat: not leading: %s (%s) not sent", entry.name, entry.task)
            return
        super().apply_entry(entry, producer=producer)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        # Checked again here, just before the send: apply_entry's check came before its
        # log line, and a scheduler may call apply_async directly.
        if not self.may_send():
            if advance:
                self.reserve(entry)
            return None
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)

    def sync(self) -> None:
        if self.may_send():
            super().sync()

    def close(self) -> None:
        """Save the schedule (while still leader), then resign: a standby takes over at
        its next look (2 s or so) instead of after the lease."""
        try:
            super().close()
        finally:
            if self._election is not None:
                try:
                    self._election.resign()
                except Exception as exc:
                    logger.warning("beat: could not resign in election %r: %r", self.election_name, exc)
