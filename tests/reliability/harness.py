"""Test-process side of the reliability scenarios: proxies, worker fleets, results.

A :class:`Fleet` spawns worker processes (``workers.run_sections``), each talking to
DynamoDB through its own :class:`~localdynamo.faultproxy.FaultProxy` (so one worker can be
cut off alone), starts them together, stops them, and reads back their histories.
Every wait is bounded; processes that do not stop in time are killed.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import table_name
from tests.reliability.history import Section, Violation, check, load_sections
from tests.reliability.workers import Plan, counter_path, read_counter, run_sections
from tests.support.tables import delete_table

SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 120.0  # spawned children import boto3: slow on a busy 2-core machine
MIXED_FAULTS = {"http500": 0.025, "throttle": 0.025, "reset": 0.025, "drop_reply": 0.025, "delay": 0.025}
FAULT_DELAY = 0.3  # seconds; longer than the workers' read timeout


def create_table(endpoint_url: str, table: str | None = None) -> str:
    """A fresh lock table (the engine's own create_table, so its schema is the real one)."""
    from tests.support.clients import client_for

    table = table or table_name()
    client = client_for(endpoint_url, table)
    try:
        client.create_table(wait=True)
    finally:
        client.close()
    return table


class ProxyGroup:
    """One FaultProxy per worker in front of the same server."""

    def __init__(self, upstream_url: str, n: int, *, seed: int = 0, max_seconds: float = 600.0, record: bool = False):
        self.proxies = [
            FaultProxy(
                upstream_url,
                seed=seed + i,
                max_seconds=max_seconds,
                max_requests=2_000_000,
                lifetime_seconds=max_seconds + 60,
                record=record,
            ).start()
            for i in range(n)
        ]

    def __getitem__(self, i: int) -> FaultProxy:
        return self.proxies[i]

    def __len__(self) -> int:
        return len(self.proxies)

    def set_rates(self, rates: dict[str, float], *, delay_seconds: float = FAULT_DELAY) -> None:
        for proxy in self.proxies:
            proxy.set_rates(rates, delay_seconds=delay_seconds)

    def clear(self) -> None:
        for proxy in self.proxies:
            proxy.clear_faults()

    def pause(self) -> None:
        for proxy in self.proxies:
            proxy.pause()

    def resume(self) -> None:
        for proxy in self.proxies:
            proxy.resume()

    def counts(self) -> Counter[str]:
        """Requests, forwarded requests and faults of every kind, over all proxies; faults
        by operation too, as ``"UpdateItem:throttle"``."""
        total: Counter[str] = Counter()
        for proxy in self.proxies:
            stats = proxy.stats
            total["requests"] += stats.requests
            total["forwarded"] += stats.forwarded
            total.update(stats.faults)
            for operation, faults in stats.faults_by_operation.items():
                total.update({f"{operation}:{kind}": count for kind, count in faults.items()})
        return total

    def errors(self) -> list[BaseException]:
        return [e for proxy in self.proxies for e in proxy.errors]

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()


@dataclass
class Results:
    sections: list[Section]
    records: list[dict]
    counters: dict[str, int]
    violations: list[Violation]
    stats: Counter[str] = field(default_factory=Counter)

    def events(self, name: str | None = None) -> list[dict]:
        return [r for r in self.records if r.get("event") and (name is None or r["event"] == name)]

    def wrote(self) -> int:
        return sum(s.wrote for s in self.sections)


class Fleet:
    """``n`` worker processes running critical sections on ``keys``."""

    def __init__(
        self,
        tmp_path: Path,
        endpoints: list[str],
        table: str,
        keys: Iterable[str],
        *,
        assign: str = "random",
        **plan: Any,
    ):
        """``assign="random"``: each section picks one of ``keys`` at random;
        ``"fixed"``: worker ``i`` always uses ``keys[i % len(keys)]`` (so a stall on
        one key cannot draw every worker onto it)."""
        self.dir = tmp_path / f"fleet-{uuid.uuid4().hex[:6]}"
        self.counter_dir = self.dir / "counters"
        self.counter_dir.mkdir(parents=True)
        self.keys = tuple(keys)
        self.plans = [
            Plan(
                name=f"w{i}",
                endpoint_url=url,
                table=table,
                counter_dir=str(self.counter_dir),
                keys=self.keys if assign == "random" else (self.keys[i % len(self.keys)],),
                out=str(self.dir / f"w{i}.jsonl"),
                seed=1000 + i,
                **plan,
            )
            for i, url in enumerate(endpoints)
        ]
        self.go = SPAWN.Event()
        self.stop_event = SPAWN.Event()
        self.processes: list[Any] = []

    def start(self) -> Fleet:
        """Spawn every worker and wait until each has built its client."""
        self.processes = [
            SPAWN.Process(target=run_sections, args=(plan, self.go, self.stop_event), name=plan.name, daemon=True)
            for plan in self.plans
        ]
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not all(Path(plan.out + ".ready").exists() for plan in self.plans):
            dead = [p.name for p in self.processes if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"workers did not start (dead: {dead})")
            time.sleep(0.05)
        return self

    def release(self) -> float:
        """Let them go; returns the wall time of the start line."""
        started = time.time()
        self.go.set()
        return started

    def stop(self, timeout: float = 60.0) -> None:
        """Ask every worker to stop after its current section; raise if one crashed or hung."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
        stuck = [p.name for p in self.processes if p.is_alive()]
        self.kill()
        if stuck:
            raise RuntimeError(f"workers did not stop within {timeout}s: {stuck}")
        crashed = {p.name: p.exitcode for p in self.processes if p.exitcode != 0}
        if crashed:
            raise RuntimeError(f"workers exited with an error (see their stderr above): {crashed}")

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(5)

    def results(self, extra: Iterable[Section] = (), files: Iterable[str] = ()) -> Results:
        """Everything the workers (and the processes writing ``files``) recorded, checked."""
        sections, records = load_sections([*(plan.out for plan in self.plans), *files])
        sections += list(extra)
        counters = {key: read_counter(counter_path(str(self.counter_dir), key)) for key in self.keys}
        stats: Counter[str] = Counter()
        for record in records:
            if record.get("type") == "stats":
                stats.update({k: v for k, v in record.items() if isinstance(v, int) and k != "type"})
        return Results(sections, records, counters, check(sections, counters), stats)

    def began_since(self, since: float) -> bool:
        """True if a worker (with ``announce=True``) began a section after ``since``."""
        _, records = load_sections(plan.out for plan in self.plans)
        return any(r.get("type") == "begin" and r["start"] > since for r in records)


class Scenario:
    """A fresh table, one proxy per worker (plus spares), a fleet; all cleaned up on exit."""

    def __init__(
        self,
        endpoint_url: str,
        tmp_path: Path,
        workers: int,
        keys: Iterable[str],
        *,
        spare_proxies: int = 0,
        record: bool = False,
        assign: str = "random",
        **plan: Any,
    ):
        self.endpoint_url = endpoint_url
        self.table = create_table(endpoint_url)
        self.proxies = ProxyGroup(endpoint_url, workers + spare_proxies, record=record)
        self.fleet = Fleet(
            tmp_path, [p.endpoint_url for p in self.proxies.proxies[:workers]], self.table, keys, assign=assign, **plan
        )
        self.spares = self.proxies.proxies[workers:]

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.fleet.kill()
        self.proxies.stop()
        delete_table(self.endpoint_url, self.table)

    def spawn(self, target: Any, *args: Any) -> Any:
        process = SPAWN.Process(target=target, args=args, daemon=True)
        process.start()
        return process

    def side_plan(self, name: str, proxy: FaultProxy | None = None, **changes: Any) -> Plan:
        """A plan like the fleet's, for an extra process (a victim), with its own output."""
        base = self.fleet.plans[0]
        return replace(
            base,
            name=name,
            endpoint_url=(proxy.endpoint_url if proxy else self.endpoint_url),
            out=str(self.fleet.dir / f"{name}.jsonl"),
            **changes,
        )


def records_of(path: str | Path) -> list[dict]:
    _, records = load_sections([path])
    return records


def stalls(sections: list[Section], start: float, end: float, longer_than: float) -> list[tuple[str, float, float]]:
    """(key, gap start, gap length) for gaps between consecutive sections on a key that
    begin within [start, end) and last longer than ``longer_than`` seconds."""
    found = []
    for key in sorted({s.key for s in sections}):
        ordered = sorted((s for s in sections if s.key == key), key=lambda s: s.start)
        for before, after in zip(ordered, ordered[1:]):
            gap = after.start - before.end
            if gap > longer_than and start <= before.end < end:
                found.append((key, before.end, gap))
    return found
