"""The lock libraries under comparison, behind one small interface.

Each contender is built from a picklable :class:`Spec` (so that child processes
can build their own), counts its own API calls (botocore ``before-call`` hooks on
every client it creates) and hands out *lanes*: one per thread, each with
``acquire(key, wait) -> handle | None``, ``release(handle)`` and ``prepare(key)``.

- ``dynlock``: this library's :class:`~django_dynlock.engine.LockClient`, one per
  process, shared by all threads (its design).
- ``floor``: the raw boto3 floor, the bare two conditional UpdateItems
  (``bench.floor.Floor``); it cannot wait, so it only takes part in the uncontended
  figures.
- ``pdl``: python-dynamodb-lock's ``DynamoDBLockClient``, one per thread (boto3
  resources are not thread-safe), each on its own boto3 Session and resource.
- ``mutex``: dyndbmutex's ``DynamoDbMutex``. It has no wait: the lane polls
  ``lock()`` with the same backoff as django-dynlock's defaults (``MIN_RETRY_DELAY``
  doubling to ``MAX_RETRY_DELAY``, equal jitter). It builds its clients from boto3's *default* session with no
  endpoint argument and reads its table name from ``DD_MUTEX_TABLE_NAME``: the
  adapter sets ``AWS_ENDPOINT_URL_DYNAMODB`` (botocore >= 1.31 honours it) and that
  variable, and installs its own boto3 Session as ``boto3.DEFAULT_SESSION`` while a
  ``DynamoDbMutex()`` is built, so that the clients built inside it are counted too.

Nothing here patches the installed peers; the adaptations are all from outside.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from botocore.config import Config

from bench.clients import REGION, TABLE, boto_session, make_client
from bench.floor import Floor
from django_dynlock.engine.options import ClientOptions, merge_client_config
from django_dynlock.exceptions import LockNotAcquired

PDL_TABLE = "pdl_bench"
MUTEX_TABLE = "dyndbmutex_bench"

# The same lease for every library wherever it lets us choose one (not in the crash test).
LEASE = 10.0
HEARTBEAT = 2.0
# The crash-takeover lease.
CRASH_LEASE = 3.0

# python-dynamodb-lock at its "fastest reasonable" settings.
PDL_FAST = {"heartbeat_period": 1.0, "safe_period": 2.0, "lease_duration": 3.0, "retry_period": 0.02}
# Its defaults, spelled out (the library's class constants; retry_period defaults to heartbeat_period).
PDL_DEFAULTS = {"heartbeat_period": 5.0, "safe_period": 20.0, "lease_duration": 30.0, "retry_period": 5.0}

_build_lock = threading.Lock()


@dataclass(frozen=True)
class Spec:
    name: str  # id used in results: dynlock, floor, pdl-default, pdl-fast, dyndbmutex
    label: str  # shown in tables and plots
    kind: str  # dynlock | floor | pdl | mutex
    settings: dict = field(default_factory=dict, hash=False, compare=False)

    def with_settings(self, **changes: Any) -> Spec:
        return Spec(self.name, self.label, self.kind, {**self.settings, **changes})

    @property
    def lease(self) -> float | None:
        """The lease (seconds) this configuration runs with."""
        if self.kind == "dynlock":
            return self.settings.get("lease_duration", LEASE)
        if self.kind == "pdl":
            return self.settings.get("lease_duration", PDL_DEFAULTS["lease_duration"])
        if self.kind == "mutex":
            return self.settings.get("timeoutms", LEASE * 1000) / 1000.0
        return None

    @property
    def heartbeat(self) -> float | None:
        if self.kind == "dynlock":
            lease = self.lease or LEASE
            return min(self.settings.get("heartbeat_period", HEARTBEAT), lease / 3.0)
        if self.kind == "pdl":
            return self.settings.get("heartbeat_period", PDL_DEFAULTS["heartbeat_period"])
        return None

    def describe(self) -> str:
        s = self.settings
        if self.kind == "dynlock":
            low = s.get("min_retry_delay", ClientOptions.min_retry_delay)
            high = s.get("max_retry_delay", ClientOptions.max_retry_delay)
            which = "defaults" if "min_retry_delay" not in s and "max_retry_delay" not in s else "overridden"
            return (
                f"lease {self.lease:g} s, heartbeat {self.heartbeat:g} s, retry {low * 1000:g}→{high * 1000:g} ms "
                f"(MIN/MAX_RETRY_DELAY {which}, equal jitter)"
            )
        if self.kind == "floor":
            return "two hand-written conditional UpdateItems; cannot wait"
        if self.kind == "pdl":
            merged = {**PDL_DEFAULTS, **s}
            if "heartbeat_period" in s and "retry_period" not in s:
                merged["retry_period"] = s["heartbeat_period"]
            return (
                f"lease_duration {merged['lease_duration']:g} s, heartbeat_period {merged['heartbeat_period']:g} s, "
                f"safe_period {merged['safe_period']:g} s, retry_period {merged['retry_period'] * 1000:g} ms"
            )
        if self.kind == "mutex":
            low, high = ClientOptions.min_retry_delay * 1000, ClientOptions.max_retry_delay * 1000
            return f"timeoutms {s.get('timeoutms', int(LEASE * 1000))}, polled by the adapter with {low:g}→{high:g} ms backoff"
        return ""


DYNLOCK = Spec("dynlock", "django-dynlock", "dynlock", {"lease_duration": LEASE, "heartbeat_period": HEARTBEAT})
FLOOR = Spec("floor", "raw boto3 floor", "floor")
PDL_DEFAULT = Spec("pdl-default", "python-dynamodb-lock (defaults)", "pdl", {})
PDL_FASTEST = Spec("pdl-fast", "python-dynamodb-lock (fast)", "pdl", dict(PDL_FAST))
MUTEX = Spec("dyndbmutex", "dyndbmutex", "mutex", {"timeoutms": int(LEASE * 1000)})

ALL = (DYNLOCK, FLOOR, PDL_DEFAULT, PDL_FASTEST, MUTEX)
PEERS = (PDL_DEFAULT, PDL_FASTEST, MUTEX)
WAITERS = (DYNLOCK, PDL_DEFAULT, PDL_FASTEST, MUTEX)  # those that can block until a key is free


def configure(
    *,
    dynlock_min_retry_delay: float | None = None,
    dynlock_max_retry_delay: float | None = None,
    pdl_fast_retry: float | None = None,
) -> None:
    """Sensitivity knobs (seconds): change the settings of the module's specs in place."""
    if dynlock_max_retry_delay is not None:
        DYNLOCK.settings["max_retry_delay"] = dynlock_max_retry_delay
        DYNLOCK.settings["min_retry_delay"] = min(ClientOptions.min_retry_delay, dynlock_max_retry_delay)
    if dynlock_min_retry_delay is not None:
        DYNLOCK.settings["min_retry_delay"] = dynlock_min_retry_delay
    if pdl_fast_retry is not None:
        PDL_FASTEST.settings["retry_period"] = pdl_fast_retry


def crash_spec(spec: Spec, lease: float = CRASH_LEASE) -> Spec:
    """The configuration used for the crash test: lease ``lease`` where the library allows it."""
    if spec.kind == "dynlock":
        return spec.with_settings(lease_duration=lease, heartbeat_period=lease / 3.0)
    if spec.kind == "mutex":
        return spec.with_settings(timeoutms=int(lease * 1000))
    if spec.name == "pdl-fast":
        return spec.with_settings(lease_duration=lease, heartbeat_period=lease / 3.0, safe_period=2 * lease / 3.0)
    return spec  # pdl at its defaults: a 3 s lease with its 5 s heartbeat would be unsafe


def quiet_peer_logs() -> None:
    # dyndbmutex logs a WARNING on every busy attempt and an ERROR when dynalite has no
    # TTL API; python-dynamodb-lock logs INFO for everything. Python's last-resort
    # handler would print those warnings to stderr.
    for name in ("dyndbmutex", "python_dynamodb_lock", "botocore.credentials", "botocore.configprovider"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class EventCounter:
    """API calls by operation (botocore ``before-call``) over several clients or sessions."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.stamps: list[float] = []  # monotonic time of each call (bounded)
        self._lock = threading.Lock()
        self._id = f"benchcount-{uuid.uuid4().hex[:8]}"
        self._emitters: list[Any] = []

    def attach(self, emitter: Any) -> None:
        """Count the calls of a client (``client.meta.events``) or of every client a
        session creates from now on (``session.events``)."""
        emitter.register("before-call.dynamodb", self._on_call, unique_id=self._id)
        self._emitters.append(emitter)

    def _on_call(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1
            if len(self.stamps) < 100_000:
                self.stamps.append(time.monotonic())

    def take(self) -> dict[str, int]:
        with self._lock:
            calls = dict(self.calls)
            self.calls.clear()
            self.stamps.clear()
        return calls

    def take_stamps(self) -> tuple[dict[str, int], list[float]]:
        with self._lock:
            calls, stamps = dict(self.calls), list(self.stamps)
            self.calls.clear()
            self.stamps.clear()
        return calls, stamps


def backoff(attempt: int) -> float:
    """django-dynlock's default retry delay: equal jitter, MIN_RETRY_DELAY doubling up to MAX_RETRY_DELAY."""
    low, high = ClientOptions.min_retry_delay, ClientOptions.max_retry_delay
    cap = min(high, low * 2**attempt)
    return cap / 2 + random.uniform(0, cap / 2)


# -- adapters ---------------------------------------------------------------------------


class Contender:
    spec: Spec

    def __init__(self, spec: Spec, endpoint_url: str):
        self.spec = spec
        self.endpoint_url = endpoint_url
        self.counter = EventCounter()
        self._lanes: dict[int, Any] = {}
        self._lanes_lock = threading.Lock()

    def lane(self, index: int = 0) -> Any:
        with self._lanes_lock:
            if index not in self._lanes:
                self._lanes[index] = self._new_lane(index)
            return self._lanes[index]

    def _new_lane(self, index: int) -> Any:
        raise NotImplementedError

    @staticmethod
    def setup_table(spec: Spec, endpoint_url: str) -> str:
        """Create the library's table on a fresh server; returns what happened."""
        return make_contender(spec, endpoint_url).create_table()

    def create_table(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass


class DynlockLane:
    def __init__(self, client: Any, lease: float | None = None):
        self.client = client

    def prepare(self, key: str) -> None:
        pass

    def acquire(self, key: str, wait: float) -> Any:
        if not wait:  # the library's one-attempt call (acquire(wait=0) also reads the holder)
            return self.client.try_acquire(key)
        try:
            return self.client.acquire(key, wait=wait)
        except LockNotAcquired:
            return None

    def release(self, handle: Any) -> None:
        handle.release()

    @staticmethod
    def token(handle: Any) -> Any:
        return handle.token


class DynlockContender(Contender):
    def __init__(self, spec: Spec, endpoint_url: str):
        super().__init__(spec, endpoint_url)
        extra: dict[str, Any] = {
            k: spec.settings[k] for k in ("min_retry_delay", "max_retry_delay", "hedge_after") if k in spec.settings
        }
        if "client_config" in spec.settings:  # botocore settings over the library's own defaults
            extra["client_config"] = merge_client_config(spec.settings["client_config"])
        self.client = make_client(endpoint_url, lease_duration=spec.lease, heartbeat_period=spec.heartbeat, **extra)
        self.counter.attach(self.client.boto.meta.events)

    def _new_lane(self, index: int) -> DynlockLane:
        return DynlockLane(self.client)

    def create_table(self) -> str:
        return str(self.client.create_table(wait=True))

    def close(self) -> None:
        self.client.close(release=True)


class FloorLane:
    def __init__(self, floor: Floor):
        self.floor = floor

    def prepare(self, key: str) -> None:
        pass

    def acquire(self, key: str, wait: float) -> Any:
        from botocore.exceptions import ClientError

        if wait:
            raise NotImplementedError("the floor cannot wait")
        try:
            owner, token = self.floor.acquire(key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return None
            raise
        return key, owner, token

    def release(self, handle: Any) -> None:
        self.floor.release(*handle)

    @staticmethod
    def token(handle: Any) -> Any:
        return handle[2]


class FloorContender(Contender):
    def __init__(self, spec: Spec, endpoint_url: str):
        super().__init__(spec, endpoint_url)
        self.floor = Floor(endpoint_url, merge_client_config(None))
        self.counter.attach(self.floor.boto.meta.events)

    def _new_lane(self, index: int) -> FloorLane:
        return FloorLane(self.floor)

    def create_table(self) -> str:
        return "same table as django-dynlock"

    def close(self) -> None:
        self.floor.close()


class PdlLane:
    def __init__(self, contender: PdlContender):
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

        s = contender.settings
        with _build_lock:
            session = boto_session()
            contender.counter.attach(session.events)
            config = s.get("client_config")  # botocore settings; its own defaults otherwise
            resource = session.resource(
                "dynamodb", endpoint_url=contender.endpoint_url, config=Config(**config) if config else None
            )
        self.client = DynamoDBLockClient(
            resource,
            table_name=PDL_TABLE,
            heartbeat_period=datetime.timedelta(seconds=s["heartbeat_period"]),
            safe_period=datetime.timedelta(seconds=s["safe_period"]),
            lease_duration=datetime.timedelta(seconds=s["lease_duration"]),
        )
        self.retry_period = datetime.timedelta(seconds=s["retry_period"])

    def prepare(self, key: str) -> None:
        pass

    def acquire(self, key: str, wait: float) -> Any:
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockError

        # retry_timeout=timedelta(0) is falsy and would mean "the default" (35 s).
        timeout = datetime.timedelta(seconds=max(wait, 1e-6))
        try:
            return self.client.acquire_lock(key, retry_period=self.retry_period, retry_timeout=timeout)
        except DynamoDBLockError as exc:
            if exc.code == DynamoDBLockError.ACQUIRE_TIMEOUT:
                return None
            raise

    def release(self, handle: Any) -> None:
        # best_effort=False: a failed release raises instead of being logged and ignored.
        handle.release(best_effort=False)

    @staticmethod
    def token(handle: Any) -> Any:
        return None  # no fencing token

    def close(self) -> None:
        # close() joins its two background threads, which sleep up to heartbeat_period:
        # stop them without waiting (they are daemon threads).
        self.client._shutting_down = True


class PdlContender(Contender):
    def __init__(self, spec: Spec, endpoint_url: str):
        super().__init__(spec, endpoint_url)
        merged = {**PDL_DEFAULTS, **spec.settings}
        if "heartbeat_period" in spec.settings and "retry_period" not in spec.settings:
            merged["retry_period"] = spec.settings["heartbeat_period"]
        self.settings = merged

    def _new_lane(self, index: int) -> PdlLane:
        return PdlLane(self)

    def create_table(self) -> str:
        from botocore.exceptions import ClientError
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

        boto = boto_session().client("dynamodb", endpoint_url=self.endpoint_url)
        try:
            DynamoDBLockClient.create_dynamodb_table(boto, table_name=PDL_TABLE)
            return "created by DynamoDBLockClient.create_dynamodb_table"
        except ClientError as exc:
            # dynalite has no TTL API: the table exists by then, only TTL is missing.
            if (
                exc.response.get("Error", {}).get("Code") == "UnknownOperationException"
                and boto.describe_table(TableName=PDL_TABLE)["Table"]["TableStatus"] == "ACTIVE"
            ):
                return f"created by create_dynamodb_table; its UpdateTimeToLive failed ({exc}), ignored"
            raise
        finally:
            boto.close()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()


class MutexLane:
    def __init__(self, contender: MutexContender):
        self.contender = contender
        self.holder = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.mutexes: dict[str, Any] = {}

    def mutex(self, key: str) -> Any:
        m = self.mutexes.get(key)
        if m is None:
            m = self.contender.new_mutex(key, self.holder)
            self.mutexes[key] = m
        return m

    def prepare(self, key: str) -> None:
        self.mutex(key)  # builds its two boto3 clients and makes its DescribeTable now

    def acquire(self, key: str, wait: float) -> Any:
        m = self.mutex(key)
        give_up = time.monotonic() + wait
        for attempt in range(1_000_000):
            if m.lock():
                return m
            now = time.monotonic()
            if now >= give_up:
                return None
            time.sleep(max(0.0, min(backoff(attempt), give_up - now)))
        return None

    def release(self, handle: Any) -> None:
        handle.release()
        if handle.locked:
            raise RuntimeError("dyndbmutex release failed")

    @staticmethod
    def token(handle: Any) -> Any:
        return None


class MutexContender(Contender):
    def __init__(self, spec: Spec, endpoint_url: str):
        super().__init__(spec, endpoint_url)
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint_url
        os.environ["DD_MUTEX_TABLE_NAME"] = MUTEX_TABLE
        # dyndbmutex calls boto3.resource()/boto3.client(), i.e. boto3's default session.
        # Each contender gets its own session, installed as the default while it builds a
        # DynamoDbMutex, so that the calls of its clients are counted by this contender only.
        self.session = boto_session()
        self.counter.attach(self.session.events)
        self.timeoutms = int(spec.settings.get("timeoutms", LEASE * 1000))

    def new_mutex(self, key: str, holder: str) -> Any:
        import boto3
        from dyndbmutex.dyndbmutex import DynamoDbMutex

        with _build_lock:  # boto3's default session is not thread-safe
            previous, boto3.DEFAULT_SESSION = boto3.DEFAULT_SESSION, self.session
            try:
                return DynamoDbMutex(key, holder=holder, timeoutms=self.timeoutms, region_name=REGION)
            finally:
                boto3.DEFAULT_SESSION = previous

    def _new_lane(self, index: int) -> MutexLane:
        return MutexLane(self)

    def create_table(self) -> str:
        import boto3
        from dyndbmutex.dyndbmutex import MutexTable

        with _build_lock:
            previous, boto3.DEFAULT_SESSION = boto3.DEFAULT_SESSION, self.session
            try:
                MutexTable(region_name=REGION)
            finally:
                boto3.DEFAULT_SESSION = previous
        return (
            "created by dyndbmutex itself (MutexTable); on dynalite its UpdateTimeToLive fails and it logs and goes on"
        )


def make_contender(spec: Spec, endpoint_url: str) -> Contender:
    quiet_peer_logs()
    kinds = {"dynlock": DynlockContender, "floor": FloorContender, "pdl": PdlContender, "mutex": MutexContender}
    return kinds[spec.kind](spec, endpoint_url)


def new_fresh_mutex_calls(contender: MutexContender, key: str) -> dict[str, int]:
    """Calls of one acquire+release the way dyndbmutex's README uses it: a new object each time."""
    contender.counter.take()
    m = contender.new_mutex(key, uuid.uuid4().hex)
    if not m.lock():
        raise RuntimeError("dyndbmutex: a free key was busy")
    m.release()
    return contender.counter.take()


__all__ = [
    "ALL",
    "DYNLOCK",
    "FLOOR",
    "MUTEX",
    "PDL_DEFAULT",
    "PDL_FASTEST",
    "PEERS",
    "WAITERS",
    "Spec",
    "crash_spec",
    "make_contender",
    "EventCounter",
    "TABLE",
]
