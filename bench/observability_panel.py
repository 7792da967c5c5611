"""``python -m bench.observability_panel``: the Grafana panel of docs/observability.md,
drawn from the metrics of a real run.

A DynamoDB Local this script starts (loopback), behind the fault proxy, and
``django_dynlock.contrib.prometheus``'s metrics on a registry of their own. For
``--seconds`` seconds, threads of this process lock through two templates:

- ``report:{tenant}``: 6 workers on 3 tenants, each holding 0.15 s and waiting up to
  1 s (a hot template: waits, and some busy);
- ``export:{tenant_id}``: 2 workers on 50 tenants, holding 0.05 s (no contention),
  with a lease of 3 s, held 2.5 s one time in ten (renewals: the headroom).

From a quarter to 40 % of the run the proxy throttles 30 % of requests; from 60 % to
75 % it delays 40 % of requests by 0.6 s before forwarding them. The
registry is scraped every ``--step`` seconds; each panel is the query docs/observability.md
gives, worked out from the scrapes as Prometheus would (``rate`` over ``--window``
seconds, ``histogram_quantile``'s linear interpolation). Writes docs/img/observability-panel.png, and the scrapes to
bench/results/panel-<timestamp>.json (``--replot`` draws them again).

    python -m bench.observability_panel                   # 120 s
    python -m bench.observability_panel --seconds 30 --out /tmp/panel.png
"""

from __future__ import annotations

import argparse
import json
import math
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.clients import make_client, start_local_server
from django_dynlock.exceptions import DynLockError
from localdynamo.faultproxy import FaultProxy

REPO_ROOT = Path(__file__).resolve().parent.parent
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


DELAY = 0.6  # seconds a delayed request waits in the proxy before it is forwarded


def phases(seconds: float) -> dict[str, tuple[float, float]]:
    """When the proxy throttles 30 % of requests, and when it delays 40 % by DELAY."""
    return {"throttled": (seconds * 0.25, seconds * 0.4), "delayed": (seconds * 0.6, seconds * 0.75)}


def scrape(registry: Any) -> Scrape:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
    }


def rate(now: Scrape, then: Scrape, seconds: float, metric: str, **match: str) -> dict[tuple, float]:
    """Per-second increase of each series of ``metric`` whose labels include ``match``."""
    out = {}
    for (name, labels), value in now.items():
        if name != metric or any(dict(labels).get(k) != v for k, v in match.items()):
            continue
        out[labels] = (value - then.get((name, labels), 0.0)) / seconds
    return out


def by(rates: dict[tuple, float], *keep: str) -> dict[tuple, float]:
    """``sum by (keep)``."""
    out: dict[tuple, float] = defaultdict(float)
    for labels, value in rates.items():
        out[tuple(dict(labels).get(k, "") for k in keep)] += value
    return dict(out)


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation within the bucket."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def quantiles_by_name(
    q: float, now: Scrape, then: Scrape, seconds: float, metric: str, **match: str
) -> dict[str, float]:
    buckets: dict[str, dict[float, float]] = defaultdict(dict)
    for labels, value in rate(now, then, seconds, metric + "_bucket", **match).items():
        labelled = dict(labels)
        le = float(labelled["le"])
        buckets[labelled["name"]][le] = buckets[labelled["name"]].get(le, 0.0) + value
    return {name: quantile(q, b) for name, b in buckets.items()}


def worker(
    client: Any, template: str, tenants: int, hold: float, wait: float, stop: threading.Event, seed: int
) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        tenant = rng.randrange(tenants)
        key = template.split("{")[0] + str(tenant)
        long_hold = template.startswith("export") and rng.random() < 0.1
        try:
            with client.acquire(key, wait=wait, metrics_name=template, lease=3.0 if long_hold else None):
                time.sleep(2.5 if long_hold else hold)
        except DynLockError:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--step", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "img" / "observability-panel.png"))
    parser.add_argument("--replot", metavar="JSON", help="draw the scrapes a run saved, without running")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        args.seconds, args.step = saved["seconds"], saved["step"]
        draw([(t, {(m, tuple(map(tuple, labels))): v for m, labels, v in rows}) for t, rows in saved["scrapes"]], args)
        return

    from prometheus_client import CollectorRegistry

    from django_dynlock.contrib.prometheus import PrometheusObserver
    from django_dynlock.engine.observe import add_observer, remove_observer

    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    server = start_local_server("dynamodb-local")
    stop = threading.Event()
    scrapes: list[tuple[float, Scrape]] = []
    try:
        make_client(server.endpoint_url).create_table(wait=True)
        with FaultProxy(server.endpoint_url, max_seconds=args.seconds + 60) as proxy:
            client = make_client(proxy.endpoint_url)
            add_observer(observer)
            plan = [("report:{tenant}", 3, 0.15, 1.0)] * 6 + [("export:{tenant_id}", 50, 0.05, 0.0)] * 2
            threads = [
                threading.Thread(target=worker, args=(client, *spec, stop, seed), daemon=True)
                for seed, spec in enumerate(plan)
            ]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            phase = None
            while (elapsed := time.monotonic() - started) < args.seconds:
                now = next((name for name, (a, b) in phases(args.seconds).items() if a <= elapsed < b), None)
                if now != phase:
                    phase = now
                    if phase == "throttled":
                        proxy.set_rates({"throttle": 0.3})
                    elif phase == "delayed":
                        proxy.set_rates({"delay": 0.4}, delay_seconds=DELAY)
                    else:
                        proxy.set_rates({})
                scrapes.append((elapsed, scrape(registry)))
                time.sleep(args.step)
            stop.set()
            for thread in threads:
                thread.join(10)
            client.close()
    finally:
        remove_observer(observer)
        server.stop()
    results = REPO_ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    saved = results / f"panel-{time.strftime('%Y%m%d-%H%M%S')}.json"
    rows = [[t, [[m, labels, v] for (m, labels), v in scraped.items()]] for t, scraped in scrapes]
    saved.write_text(json.dumps({"seconds": args.seconds, "step": args.step, "scrapes": rows}))
    print(f"wrote {saved}")
    draw(scrapes, args)


def draw(scrapes: list[tuple[float, Scrape]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    back = max(1, round(args.window / args.step))
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for index in range(back, len(scrapes)):
        t, now = scrapes[index]
        t0, then = scrapes[index - back]
        span = t - t0
        for name, value in quantiles_by_name(
            0.95, now, then, span, "dynlock_acquire_seconds", outcome="acquired"
        ).items():
            series["p95 wait (s)"][name].append((t, value))
        busy = by(rate(now, then, span, "dynlock_busy_total"), "name")
        calls = by(rate(now, then, span, "dynlock_acquire_seconds_count"), "name")
        for (name,), total in calls.items():
            if total > 0:
                series["busy ratio"][name].append((t, busy.get((name,), 0.0) / total))
        for q in (0.5, 0.05):
            for name, value in quantiles_by_name(q, now, then, span, "dynlock_renewal_headroom_seconds").items():
                series["renewal headroom (s): median, 5th percentile"][f"{name} p{q * 100:.0f}"].append((t, value))
        for (op, outcome), value in by(rate(now, then, span, "dynlock_requests_total"), "op", "outcome").items():
            series["requests/s by op, outcome"][f"{op} {outcome}"].append((t, value))

    titles = list(series)
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    for ax, title in zip(axes.flat, titles):
        for label, points in sorted(series[title].items()):
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
        for (start, end), shade in zip(phases(args.seconds).values(), ("0.88", "#f6dfc8")):
            ax.axvspan(start, end, color=shade, zorder=0)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel(f"seconds into the run (grey: 30 % throttled; orange: 40 % delayed {DELAY} s)")
    figure.suptitle(
        f"django-dynlock metrics from a real run on DynamoDB Local (rate over {args.window:.0f} s, "
        f"scraped every {args.step:.0f} s)",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
