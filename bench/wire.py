"""``python -m bench.wire``: client CPU per uncontended acquire+release, wire path against boto3 (issue 40).

On each server, one after the other in one run, four contenders do acquire+release of
a key of their own in one thread, their rounds interleaved (order rotated and reversed
every other round, ``bench.rounds.rotated``), so that the machine's load, which others
share, hits them alike:

- ``dynlock``: django-dynlock, its requests on the wire path (``WIRE = "dynlock"``);
- ``dynlock-unhedged``: the same with ``HEDGE_AFTER = None``: what hedging costs on the
  fast path, ``dynlock`` minus this, paired per round (``hedge_cost_us``);
- ``dynlock-boto3``: django-dynlock through the boto3 client (``WIRE = "boto3"``);
- ``raw-put-delete``: raw boto3's cheapest lock cycle, a conditional PutItem of the
  whole item and a conditional DeleteItem (python-dynamodb-lock's and dyndbmutex's
  shape: ``bench.suite``'s "PutItem, attribute_not_exists" and "DeleteItem, owner = :me");
- ``raw-updates``: the raw boto3 floor of ``python -m bench``, the engine's own two
  conditional UpdateItems sent by hand (``bench.floor.Floor``);
- ``pdl``: python-dynamodb-lock at its fast settings (``bench.contenders.PDL_FASTEST``).

Then, without a server, django-dynlock's client CPU per cycle on each path with every
reply given at ``before-send`` (``no_network``): the engine and the request's making
alone, without the HTTP exchange and the kernel, which all contenders share.

CPU is the measuring process' (``time.process_time``: every thread, the heartbeat's
too). Medians over the rounds, and each contender's ratio to ``raw-put-delete``.
``--profile`` adds cProfile's top entries (CPU time) of one cycle of ``dynlock-boto3``
and ``dynlock``; ``--exchange`` the CPU of one request's HTTP exchange alone, the wire
path's against urllib3's ``urlopen`` and a bare socket's. Writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.children import BenchError
from bench.clients import TABLE, make_client, raw_client, start_local_server
from bench.contenders import PDL_FASTEST, make_contender
from bench.floor import Floor
from bench.rounds import rotated, run_round
from django_dynlock.engine.options import merge_client_config

NAMES = ("dynlock", "dynlock-unhedged", "dynlock-boto3", "raw-put-delete", "raw-updates", "pdl")


class RawPutDelete:
    """Raw boto3's cheapest lock cycle: a conditional PutItem and a conditional DeleteItem."""

    def __init__(self, endpoint_url: str) -> None:
        self.boto = raw_client(endpoint_url)

    def cycle(self, key: str) -> None:
        owner = uuid.uuid4().hex
        item = {"key": {"S": key}, "owner": {"S": owner}, "expires_at": {"N": repr(round(time.time() + 10, 6))}}
        self.boto.put_item(
            TableName=TABLE,
            Item=item,
            ConditionExpression="attribute_not_exists(#k)",
            ExpressionAttributeNames={"#k": "key"},
        )
        self.boto.delete_item(
            TableName=TABLE,
            Key={"key": item["key"]},
            ConditionExpression="#o = :me",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":me": {"S": owner}},
        )

    def close(self) -> None:
        self.boto.close()


def cycles(endpoint_url: str, run: str) -> tuple[dict[str, Callable[[], None]], list[Callable[[], None]]]:
    """Each contender's cycle on a key of its own, and what closes them."""
    wire = make_client(endpoint_url, hedge_after=0.025)  # hedged (off by default): its fast path's cost
    unhedged = make_client(endpoint_url, hedge_after=None)
    boto = make_client(endpoint_url, wire="boto3")
    raw = RawPutDelete(endpoint_url)
    floor = Floor(endpoint_url, merge_client_config(None))
    pdl = make_contender(PDL_FASTEST, endpoint_url)
    pdl_lane = pdl.lane(0)

    def pdl_cycle() -> None:
        handle = pdl_lane.acquire(f"wire-pdl-{run}", 0)
        if handle is None:
            raise RuntimeError("python-dynamodb-lock: its own key was busy")
        pdl_lane.release(handle)

    out = {
        "dynlock": lambda: wire.acquire(f"wire-dynlock-{run}").release(),
        "dynlock-unhedged": lambda: unhedged.acquire(f"wire-unhedged-{run}").release(),
        "dynlock-boto3": lambda: boto.acquire(f"wire-boto3-{run}").release(),
        "raw-put-delete": lambda: raw.cycle(f"wire-raw-{run}"),
        "raw-updates": lambda: floor.cycle(f"wire-floor-{run}"),
        "pdl": pdl_cycle,
    }
    return out, [
        lambda: wire.close(release=True),
        lambda: unhedged.close(release=True),
        lambda: boto.close(release=True),
        raw.close,
        floor.close,
        pdl.close,
    ]


def profile(cycle: Callable[[], None], n: int = 200, top: int = 15) -> str:
    """cProfile's top entries by own CPU time over ``n`` cycles, per cycle."""
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(n):
        cycle()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    return f"{n} cycles\n" + text.getvalue()


def measure(kind: str, rounds: int, per_round: int, with_profile: bool) -> dict[str, Any]:
    server = start_local_server(kind)
    closers: list[Callable[[], None]] = []
    try:
        make_client(server.endpoint_url).create_table(wait=True)
        make_contender(PDL_FASTEST, server.endpoint_url).create_table()
        run = uuid.uuid4().hex[:6]
        cycle_of, closers = cycles(server.endpoint_url, run)
        for name in NAMES:  # warm-up: connections, items, what the wire path learns
            run_round(lambda _i, name=name: cycle_of[name], 1, 30, 10.0)
        seen: dict[str, list[dict[str, Any]]] = {name: [] for name in NAMES}
        failed: dict[str, list[str]] = {name: [] for name in NAMES}
        for index in range(rounds):
            for name in rotated(NAMES, index):
                try:
                    seen[name].append(run_round(lambda _i, name=name: cycle_of[name], 1, per_round, 30.0))
                except BenchError as exc:  # a request timed out on a loaded machine: the round is left out
                    failed[name].append(str(exc))
        out: dict[str, Any] = {
            "server": kind,
            "rounds": rounds,
            "cycles_per_round": per_round,
            "failed_rounds": failed,
            "contenders": {},
        }
        for name in NAMES:
            cpu = [r["cpu_us_per_cycle"] for r in seen[name]]
            rate = [r["rate"] for r in seen[name]]
            out["contenders"][name] = {
                "cpu_us_per_cycle": statistics.median(cpu),
                "cpu_us_all": cpu,
                "cycles_per_second": statistics.median(rate),
                "cycles_per_second_all": rate,
            }
        floor = out["contenders"]["raw-put-delete"]
        for name in NAMES:
            mine = out["contenders"][name]
            mine["cpu_vs_raw"] = mine["cpu_us_per_cycle"] / floor["cpu_us_per_cycle"]
            mine["rate_vs_raw"] = mine["cycles_per_second"] / floor["cycles_per_second"]
            # Paired per round: the same stretch of the machine's load.
            mine["cpu_vs_raw_paired_median"] = statistics.median(
                a["cpu_us_per_cycle"] / b["cpu_us_per_cycle"] for a, b in zip(seen[name], seen["raw-put-delete"])
            )  # pairs by position: a left-out round shifts them (failed_rounds says when)
        # Hedging's cost on the fast path: the hedged default minus HEDGE_AFTER None, per round.
        pairs = [
            a["cpu_us_per_cycle"] - b["cpu_us_per_cycle"] for a, b in zip(seen["dynlock"], seen["dynlock-unhedged"])
        ]
        if pairs:
            ordered = sorted(pairs)
            out["hedge_cost_us"] = {
                "median": statistics.median(pairs),
                "quartiles": [ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]],
                "all": pairs,
            }
        if with_profile:
            out["profile"] = {name: profile(cycle_of[name]) for name in ("dynlock-boto3", "dynlock")}
        return out
    finally:
        for close in closers:
            try:
                close()
            except Exception:  # noqa: BLE001 (the server goes next anyway)
                pass
        server.stop()


def no_network(cycles: int = 1000, rounds: int = 5) -> dict[str, Any]:
    """django-dynlock's client CPU per acquire+release on each path, every reply given at
    ``before-send`` (a reply as DynamoDB's, with a Date): no HTTP exchange, no kernel."""
    from email.utils import formatdate

    from botocore.awsrequest import AWSResponse

    def answer(request: Any, **_: Any) -> Any:
        body = json.loads(request.body)
        attributes = {"Attributes": {"fence": {"N": "17"}}} if body.get("ReturnValues") == "ALL_NEW" else {}
        response = AWSResponse(request.url, 200, {"Date": formatdate(usegmt=True), "x-amzn-RequestId": "r"}, None)
        response._content = json.dumps(attributes).encode()
        return response

    clients = {
        name: make_client("http://127.0.0.1:9", wire=wire)
        for name, wire in (("dynlock", "dynlock"), ("dynlock-boto3", "boto3"))
    }
    seen: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for client in clients.values():
            client.boto.meta.events.register("before-send.dynamodb", answer)
            client.acquire("k").release()
        for index in range(rounds):
            for name in rotated(list(clients), index):
                started = time.process_time()
                for _ in range(cycles):
                    clients[name].acquire("k").release()
                seen[name].append((time.process_time() - started) / cycles * 1e6)
    finally:
        for client in clients.values():
            client.close()
    return {name: {"cpu_us_per_cycle": statistics.median(v), "cpu_us_all": v} for name, v in seen.items()}


def exchange_cost(kind: str, requests: int = 300, rounds: int = 5) -> dict[str, Any]:
    """Client CPU of one request's HTTP exchange alone, on one pooled connection: the same
    signed GetItem written and its reply read by the wire path (``engine/exchange.py``), by
    urllib3's ``urlopen`` (as botocore sends), and by a bare ``sendall`` + ``recv`` of the
    same bytes (the floor: the kernel and the wait for the server). Medians of rounds, µs."""
    from django_dynlock.engine.wire import _NO_RETRIES

    server = start_local_server(kind)
    client = make_client(server.endpoint_url)
    try:
        client.create_table(wait=True)
        wire = client._store.wire
        assert wire is not None
        key = {"TableName": TABLE, "Key": {"key": {"S": "exchange"}}}
        wire.call("get_item", dict(key))  # learnt
        sent: list[Any] = []
        client.boto.meta.events.register("before-send.dynamodb", lambda request, **_: sent.append(request))
        wire.call("get_item", dict(key))  # on the wire path: its own headers, all str
        request = sent[-1]
        pool, lean, _proxy, target = wire._route(request.url)
        assert lean is not None, "a proxy: no lean exchange to measure"
        headers, body = dict(request.headers), request.body
        conn = pool._get_conn()
        raw = lean._prefix(conn, target) + (lean._head(headers) or b"") + b"\r\n" + body
        pool._put_conn(conn)

        def on_the_wire_path() -> None:
            reply = lean.exchange(target, headers, body, None)
            if reply is None or reply.status != 200:
                raise BenchError("the wire path's exchange was not taken")

        def through_urlopen() -> None:
            reply = pool.urlopen(
                "POST",
                target,
                body=body,
                headers=headers,
                retries=_NO_RETRIES,
                assert_same_host=False,
                preload_content=True,
                decode_content=False,
                enforce_content_length=False,
            )
            if reply.status != 200:
                raise BenchError(f"urlopen: {reply.status}")

        def floor() -> None:
            conn = pool._get_conn()
            conn.sock.sendall(raw)
            data = conn.sock.recv(65536)
            while b"\r\n\r\n" not in data:
                data += conn.sock.recv(65536)
            pool._put_conn(conn)

        ways = {"wire path": on_the_wire_path, "urllib3 urlopen": through_urlopen, "sendall + recv": floor}
        through_urlopen()
        if lean.exchange(target, headers, body, None) is None:
            # moto's server closes the connection after each reply: every request makes a
            # new one, which urllib3 does on either path.
            ways = {"urllib3 urlopen": through_urlopen}
        seen: dict[str, list[float]] = {name: [] for name in ways}
        for send in ways.values():
            for _ in range(30):
                send()
        for index in range(rounds):
            for name in rotated(list(ways), index):
                started = time.process_time()
                for _ in range(requests):
                    ways[name]()
                seen[name].append((time.process_time() - started) / requests * 1e6)
        return {"server": kind, **{name: statistics.median(v) for name, v in seen.items()}}
    finally:
        client.close(release=True)
        server.stop()


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| server | contender | CPU per cycle (µs) | × raw PutItem+DeleteItem (paired) | cycles/s | × raw |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for name, c in result["contenders"].items():
            lines.append(
                f"| {result['server']} | {name} | {c['cpu_us_per_cycle']:,.0f} | {c['cpu_vs_raw']:.2f} "
                f"({c['cpu_vs_raw_paired_median']:.2f}) | {c['cycles_per_second']:.0f} | {c['rate_vs_raw']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wire", description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="dynamodb-local,dynalite,moto")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cycles", type=int, default=200, help="cycles per round")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--exchange", action="store_true", help="also the CPU of one request's HTTP exchange alone, each way"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    results = [measure(kind, args.rounds, args.cycles, args.profile) for kind in args.servers.split(",")]
    print(table(results))
    for result in results:
        cost = result.get("hedge_cost_us")
        if cost:
            print(
                f"{result['server']}: hedged minus HEDGE_AFTER None, paired per round: "
                f"{cost['median']:+.0f} µs per cycle (quartiles {cost['quartiles'][0]:+.0f}, {cost['quartiles'][1]:+.0f})"
            )
    offline = no_network()
    print(
        "\nno network (replies at before-send): "
        + ", ".join(f"{k} {v['cpu_us_per_cycle']:,.0f} µs" for k, v in offline.items())
    )
    results.append({"no_network": offline})
    if args.exchange:
        exchanges = [exchange_cost(kind) for kind in args.servers.split(",")]
        print("\none request's HTTP exchange, client CPU (µs, medians of 5 rounds of 300):")
        for row in exchanges:
            print("  " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else str(v) for k, v in row.items()))
        results.append({"exchange": exchanges})
    for result in results[:-1]:
        for name, text in result.get("profile", {}).items():
            print(f"\n## {result['server']}: {name}\n{text}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
