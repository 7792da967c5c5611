"""Tables and plots of a ``python -m bench`` run (also redrawn by ``--replot``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import contenders as cs
from bench import targets as T
from bench import waiting
from bench.stats import median, percentile

ORDER = tuple(spec.name for spec in cs.ALL)
PEER_NAMES = tuple(spec.name for spec in cs.PEERS)
WAITER_NAMES = tuple(spec.name for spec in cs.WAITERS)
SHORT = {
    "dynlock": "django-dynlock",
    "floor": "raw boto3 floor",
    "pdl-default": "python-dynamodb-lock, defaults",
    "pdl-fast": "python-dynamodb-lock, fast",
    "dyndbmutex": "dyndbmutex",
}
COLOURS = {
    "dynlock": "#2ca02c",
    "floor": "#7f7f7f",
    "pdl-default": "#d62728",
    "pdl-fast": "#ff7f0e",
    "dyndbmutex": "#1f77b4",
}
# The uncontended path of python-dynamodb-lock does not depend on its settings: measured once.
UNCONTENDED_AS = {"pdl-default": "pdl-fast"}


def _get(data: Any, *path: Any) -> Any:
    for part in path:
        if data is None:
            return None
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def _calls(per: dict[str, float] | None, total: float | None) -> str:
    if not per:
        return "–"
    parts = " + ".join(f"{n:g} {op}" for op, n in per.items())
    return f"{total:g} ({parts})"


def uncontended_of(server: dict[str, Any], threads: str, name: str) -> dict[str, Any] | None:
    return _get(server, "uncontended", threads, "contenders", UNCONTENDED_AS.get(name, name))


def best_peer(
    server: dict[str, Any], value: Callable[[str], float | None], *, lowest: bool
) -> tuple[str | None, float | None]:
    found = [(name, value(name)) for name in PEER_NAMES]
    found = [(n, v) for n, v in found if v is not None]
    if not found:
        return None, None
    return (min if lowest else max)(found, key=lambda nv: nv[1])


# -- derived figures --------------------------------------------------------------------------


def derived(server: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for threads in ("1", "8"):
        ours = _get(uncontended_of(server, threads, "dynlock"), "median")
        floor = _get(uncontended_of(server, threads, "floor"), "median")
        d[f"u{threads}_vs_floor"] = ours / floor if ours and floor else None
        peer, value = best_peer(server, lambda n, t=threads: _get(uncontended_of(server, t, n), "median"), lowest=False)
        d[f"u{threads}_best_peer"] = peer
        d[f"u{threads}_vs_peer"] = ours / value if ours and value else None
    ours = _get(server, "handoff", "dynlock", "p50_ms")
    peer, value = best_peer(server, lambda n: _get(server, "handoff", n, "p50_ms"), lowest=True)
    d["handoff_best_peer"] = peer
    d["handoff_vs_peer"] = ours / value if ours and value else None
    ours = _get(server, "contended", "dynlock", "sections_per_s")
    peer, value = best_peer(server, lambda n: _get(server, "contended", n, "sections_per_s"), lowest=False)
    d["contended_best_peer"] = peer
    d["contended_vs_peer"] = ours / value if ours and value else None
    d["contended_vs_limit"] = _get(server, "contended", "dynlock", "ratio")
    # A peer that leaves some processes with no section at all in the window: not a fair comparison point.
    peer, value = best_peer(
        server,
        lambda n: (
            _get(server, "contended", n, "sections_per_s")
            if (_get(server, "contended", n, "per_process") or [0])[0] > 0
            else None
        ),
        lowest=False,
    )
    d["contended_best_fair_peer"] = peer
    d["contended_vs_fair_peer"] = ours / value if ours and value else None
    ours = _get(server, "crash", "dynlock", "median_s")
    peer, value = best_peer(
        server, lambda n: _get(server, "crash", n, "median_s") if n != "pdl-default" else None, lowest=True
    )
    d["crash_best_peer"] = peer
    d["crash_vs_peer"] = ours / value if ours and value else None
    lib = _get(server, "listing", "library", "median_s")
    floor = _get(server, "listing", "floor_same_pages", "median_s")
    d["list_vs_floor"] = lib / floor if lib and floor else None
    return d


def targets(server: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue's targets (``bench.targets``) on one server: (label, figure, met)."""
    d = derived(server)
    calls = {name: _get(server, "calls", name, "acquire_release_total") for name in ORDER}
    fresh = _get(server, "calls", "dyndbmutex", "fresh_object_total")
    text = f"{_f(calls['dynlock'], '{:g}')} (peers: {_f(calls['pdl-default'], '{:g}')} and {_f(fresh, '{:g}')})"
    rows: list[tuple[str, str, bool | None]] = [(T.CALLS.label(), text, T.CALLS.met(calls["dynlock"]))]
    for threads in ("1", "8"):
        r = d[f"u{threads}_vs_floor"]
        label = T.UNCONTENDED_VS_FLOOR.label(threads=f"{threads} thread{'s' if threads != '1' else ''}")
        rows.append((label, _f(r, "{:.2f} ×"), T.UNCONTENDED_VS_FLOOR.met(r)))
    p50 = _get(server, "handoff", "dynlock", "p50_ms")
    rows.append((T.HANDOFF_P50_MS.label(), _f(p50, "{:.1f} ms"), T.HANDOFF_P50_MS.met(p50)))
    for target, figure in ((T.HANDOFF_VS_PEER, "handoff"), (T.CONTENDED_VS_PEER, "contended")):
        r = d[f"{figure}_vs_peer"]
        text = f"{_f(r, '{:.2f} ×')} ({SHORT.get(d[f'{figure}_best_peer'], '–')})"
        rows.append((target.label(), text, target.met(r)))
    r = d["contended_vs_limit"]
    rows.append((T.CONTENDED_VS_LIMIT.label(), _f(r, "{:.2f} ×"), T.CONTENDED_VS_LIMIT.met(r)))
    for target, figure in ((T.CRASH_TAKEOVER, "crash"), (T.CRASH_ONE_SHOT, "crash_one_shot")):
        c = _get(server, figure, "dynlock")
        if not c or c.get("max_s") is None:
            rows.append((target.label(), "–", None))
            continue
        text = f"{c['median_s']:.2f} s (max {c['max_s']:.2f} s; L + {target.bound:g} = {c['target_s']:g} s)"
        met = target.met(c["max_s"] - c["lease_s"])
        if figure == "crash_one_shot":  # a trial where no fresh process got the key misses it
            met = met and not c["errors"]
        rows.append((target.label(), text, met))
    return rows


# -- markdown ---------------------------------------------------------------------------------


def _server_table(server: dict[str, Any], plan: dict[str, Any]) -> str:
    d = derived(server)
    names = list(ORDER)
    head = (
        "| figure | "
        + " | ".join(SHORT[n] for n in names)
        + " | django-dynlock vs reference |\n|---|"
        + "---:|" * len(names)
        + "---|"
    )
    rows: list[tuple[str, Callable[[str], str], str]] = []

    def calls_cell(n: str) -> str:
        text = _calls(_get(server, "calls", n, "acquire_release"), _get(server, "calls", n, "acquire_release_total"))
        fresh = _get(server, "calls", n, "fresh_object_total")
        if fresh is not None:
            text += f"; new object each time: {fresh:g}"
        return text

    ours_calls = _get(server, "calls", "dynlock", "acquire_release_total")
    floor_calls = _get(server, "calls", "floor", "acquire_release_total")
    rows.append(
        ("API calls per acquire+release", calls_cell, f"{_f(ours_calls, '{:g}')} vs floor {_f(floor_calls, '{:g}')}")
    )
    rows.append(
        (
            "API calls per failed attempt (key held by another client)",
            lambda n: _calls(
                _get(server, "calls", n, "failed_attempt"), _get(server, "calls", n, "failed_attempt_total")
            ),
            "",
        )
    )

    def hb_cell(n: str) -> str:
        h = _get(server, "heartbeats", n)
        if not h:
            return "–"
        if h.get("none"):
            return "none (no renewal)" if n == "dyndbmutex" else "–"
        per = h.get("calls_per_heartbeat")
        ops = " + ".join(f"{op}" for op in sorted(h.get("calls", {})))
        return f"{_f(per, '{:g}')} {ops} every {h['period_s']:g} s"

    rows.append(("API calls per heartbeat", hb_cell, ""))
    rows.append(
        (
            "heartbeat calls per held lock per hour",
            lambda n: _f(_get(server, "heartbeats", n, "calls_per_hour_per_lease"), "{:.0f}"),
            "",
        )
    )
    for threads in ("1", "8"):

        def u_cell(n: str, t: str = threads) -> str:
            u = uncontended_of(server, t, n)
            if not u:
                return "–"
            same = " (same path)" if n in UNCONTENDED_AS else ""
            return f"{u['median']:.0f}{same}"

        rows.append(
            (
                f"uncontended cycles/s, {threads} thread{'s' if threads != '1' else ''} (median of {plan['rounds']})",
                u_cell,
                f"{_f(d[f'u{threads}_vs_floor'], '{:.2f}')} × floor, {_f(d[f'u{threads}_vs_peer'], '{:.2f}')} × best peer",
            )
        )
        rows.append(
            (
                f"client CPU per cycle, {threads} thread{'s' if threads != '1' else ''} (µs)",
                lambda n, t=threads: _f(_get(uncontended_of(server, t, n), "cpu_us_per_cycle"), "{:.0f}"),
                "",
            )
        )

    def ho_cell(n: str) -> str:
        h = _get(server, "handoff", n)
        if not h:
            return "–" if n != "floor" else "cannot wait"
        capped = f", stopped at {h['n']} by its time cap" if h.get("capped") else ""
        return f"{h['p50_ms']:.1f} / {h['p95_ms']:.1f} (n={h['n']}{capped})" if h.get("n") else "–"

    rows.append(
        (
            "handoff latency p50 / p95 (ms)",
            ho_cell,
            f"{_f(d['handoff_vs_peer'], '{:.2f}')} × best peer ({SHORT.get(d['handoff_best_peer'], '–')})",
        )
    )
    rows.append(
        (
            "waiter's API calls per handoff (median)",
            lambda n: _f(_get(server, "handoff", n, "waiter_calls_median"), "{:g}"),
            "",
        )
    )

    def c_cell(n: str) -> str:
        if n == "floor":
            limit = _get(server, "contended", "dynlock", "limit_per_s")
            return f"limit {limit:.1f}" if limit else "–"
        return _f(_get(server, "contended", n, "sections_per_s"))

    rows.append(
        (
            f"contended sections/s ({plan['procs']} processes, hold {plan['hold'] * 1000:g} ms, {_windows(plan)}; median)",
            c_cell,
            f"{_f(d['contended_vs_peer'], '{:.2f}')} × best peer ({SHORT.get(d['contended_best_peer'], '–')}); "
            f"{_f(d['contended_vs_fair_peer'], '{:.2f}')} × best peer serving every process "
            f"({SHORT.get(d['contended_best_fair_peer'], '–')}); {_f(d['contended_vs_limit'], '{:.2f}')} × limit",
        )
    )

    def fair_cell(n: str) -> str:
        c = _get(server, "contended", n)
        if not c or not c.get("per_process"):
            return "–"
        return (
            f"{c['per_process'][0]}–{c['per_process'][-1]} (Jain {c['fairness_jain']:.2f})"
            if c.get("fairness_jain")
            else "–"
        )

    rows.append(("contended: sections per process min–max (fairness)", fair_cell, ""))
    rows.append(
        (
            "contended: handoffs where the releaser re-acquired",
            lambda n: _f(_get(server, "contended", n, "reacquired_by_releaser"), "{:.0%}"),
            "",
        )
    )
    rows.append(
        (
            "contended: API calls per section",
            lambda n: _f(_get(server, "contended", n, "calls_per_section"), "{:.2f}"),
            "",
        )
    )
    rows.append(
        (
            "contended: acquire wait p50 / p95 (ms)",
            lambda n: (
                "–"
                if not _get(server, "contended", n)
                else f"{_f(_get(server, 'contended', n, 'acquire_wait_p50_ms'))} / {_f(_get(server, 'contended', n, 'acquire_wait_p95_ms'))}"
            ),
            "",
        )
    )
    rows.append(
        (
            "contended: overlapping sections / duplicate tokens",
            lambda n: (
                "–"
                if not _get(server, "contended", n)
                else f"{_get(server, 'contended', n, 'overlaps')} / {_f(_get(server, 'contended', n, 'duplicate_tokens'), '{}') if n == 'dynlock' else 'no tokens'}"
            ),
            "",
        )
    )

    def takeover_cell(n: str, figure: str) -> str:
        c = _get(server, figure, n)
        if not c:
            return "cannot wait" if n == "floor" and figure == "crash" else "–"
        if not c.get("n"):
            if figure == "crash":
                return "failed: " + "; ".join(c.get("errors") or ["no trial"])
            return f"never within {c['cap_s']:g} s" if c.get("errors") else "–"
        spread = f", {c['min_s']:.2f}–{c['max_s']:.2f}" if c["n"] > 1 else ""
        if figure == "crash":
            how = f"lease {c['lease_s']:g} s"
        else:
            how = f"{_f(median([t['attempts'] for t in c['trials']]), '{:g}')} processes"
        return f"{c['median_s']:.2f} s{spread} ({how}, n={c['n']})"

    for figure, label in (
        ("crash", "crash takeover, SIGKILL → waiter's acquire (median, min–max)"),
        ("crash_one_shot", "crash takeover, SIGKILL → fresh one-shot processes (median, min–max)"),
    ):
        ours = _get(server, figure, "dynlock")
        target = f"target ≤ {ours['target_s']:g} s" if ours else ""
        rows.append((label, lambda n, f=figure: takeover_cell(n, f), target))

    def list_cell(n: str) -> str:
        lst = _get(server, "listing")
        if not lst:
            return "–"
        if n == "dynlock":
            lib = lst["library"]
            return f"{lib['median_s']:.2f} s ({lib['calls']} Scan)"
        if n == "floor":
            same, small = lst["floor_same_pages"], lst.get("floor_100_pages")
            cell = f"{same['median_s']:.2f} s ({same['calls']} Scan, same pages)"
            if small:
                cell += f"; {small['median_s']:.2f} s ({small['calls']} Scan, 100-lease pages)"
            return cell
        return "no listing API"

    leases = _get(server, "listing", "leases")
    rows.append(
        (
            f"list {leases or 10000:,} live leases (median of {len(_get(server, 'listing', 'library', 'seconds') or [])})".replace(
                ",", " "
            ),
            list_cell,
            f"{_f(d['list_vs_floor'], '{:.2f}')} × floor (same pages)",
        )
    )

    def admin_cell(n: str) -> str:
        a = _get(server, "listing", "admin")
        if n != "dynlock":
            return "–" if n == "floor" else "no admin"
        if not a:
            return "not measured"
        if a.get("error"):
            return f"not measured: {a['error']}"
        return f"{a['median_s'] * 1000:.0f} ms ({a['calls_per_get']:g} {'/'.join(a['call_names'])}, {a['rows_shown']} rows)"

    rows.append(("admin changelist, first page (median GET)", admin_cell, ""))
    lines = [head]
    for label, fn, ref in rows:
        lines.append(f"| {label} | " + " | ".join(fn(n) for n in names) + f" | {ref} |")
    return "\n".join(lines)


def _dynlock_details(servers: list[dict[str, Any]]) -> str:
    names = [s["server"] for s in servers]
    head = "| django-dynlock detail | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names)
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "API calls per failed try_acquire (held by another client)",
            lambda s: _calls(
                _get(s, "dynlock_calls", "failed_try_acquire"), _get(s, "dynlock_calls", "failed_try_acquire_total")
            ),
        ),
        (
            "… held by this same client (in-process gate)",
            lambda s: _f(_get(s, "dynlock_calls", "failed_try_acquire_same_process_total"), "{:g}"),
        ),
        (
            "API calls per acquire+release of a new key",
            lambda s: _calls(
                _get(s, "dynlock_calls", "acquire_release_new_key"),
                _get(s, "dynlock_calls", "acquire_release_new_key_total"),
            ),
        ),
        (
            "UpdateItem round trip, idle, median / p95 (ms)",
            lambda s: f"{_f(_get(s, 'rtt', 'median_ms'), '{:.2f}')} / {_f(_get(s, 'rtt', 'p95_ms'), '{:.2f}')}",
        ),
        (
            "uncontended library / floor, per-round ratios, 1 thread: median (min–max)",
            lambda s: _spread(_get(s, "uncontended", "1", "paired_ratio_vs_floor")),
        ),
        (
            "uncontended library / floor, per-round ratios, 8 threads: median (min–max)",
            lambda s: _spread(_get(s, "uncontended", "8", "paired_ratio_vs_floor")),
        ),
        ("uncontended client CPU per cycle, library / floor, 1 thread", lambda s: _cpu_ratio(s, "1")),
        ("uncontended client CPU per cycle, library / floor, 8 threads", lambda s: _cpu_ratio(s, "8")),
        (
            "handoff min / max (ms)",
            lambda s: f"{_f(_get(s, 'handoff', 'dynlock', 'min_ms'))} / {_f(_get(s, 'handoff', 'dynlock', 'max_ms'))}",
        ),
        (
            "contended: physical limit 1 / (hold + 2 × idle RTT), sections/s",
            lambda s: _f(_get(s, "contended", "dynlock", "limit_per_s")),
        ),
        (
            "contended: release round trip under load, p50 (ms)",
            lambda s: _f(_get(s, "contended", "dynlock", "release_rtt_under_load_p50_ms"), "{:.2f}"),
        ),
        (
            "contended: limit with the loaded round trip",
            lambda s: _f(_get(s, "contended", "dynlock", "limit_under_load_per_s")),
        ),
        (
            "contended: release sent → next acquire returned, p50 (ms)",
            lambda s: _f(_get(s, "contended", "dynlock", "gap_p50_ms")),
        ),
        (
            "contended: … releaser re-acquired / a waiter got it, p50 (ms)",
            lambda s: (
                f"{_f(_get(s, 'contended', 'dynlock', 'gap_same_process_p50_ms'))} / {_f(_get(s, 'contended', 'dynlock', 'gap_other_process_p50_ms'))}"
            ),
        ),
        (
            "contended: calls by operation",
            lambda s: (
                ", ".join(f"{op} {n}" for op, n in sorted((_get(s, "contended", "dynlock", "calls") or {}).items()))
                or "–"
            ),
        ),
        (
            "crash: waiter's API calls until takeover (median)",
            lambda s: _f(
                median([t["waiter_calls_total"] for t in (_get(s, "crash", "dynlock", "trials") or [])]), "{:g}"
            ),
        ),
        (
            "crash: killed after holding (s)",
            lambda s: (
                ", ".join(f"{t['held_before_kill_s']:.2f}" for t in (_get(s, "crash", "dynlock", "trials") or []))
                or "–"
            ),
        ),
    ]
    lines = [head]
    for label, fn in rows:
        lines.append(f"| {label} | " + " | ".join(fn(s) for s in servers) + " |")
    return "\n".join(lines)


def _windows(plan: dict[str, Any]) -> str:
    rounds = plan.get("contended_rounds") or 1
    return f"{rounds} × {plan['window']:g} s windows" if rounds > 1 else f"{plan['window']:g} s"


def _spread(values: list[float] | None) -> str:
    if not values:
        return "–"
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def _cpu_ratio(server: dict[str, Any], threads: str) -> str:
    ours = _get(uncontended_of(server, threads, "dynlock"), "cpu_us_per_cycle")
    floor = _get(uncontended_of(server, threads, "floor"), "cpu_us_per_cycle")
    return f"{ours / floor:.2f} ({ours:.0f} / {floor:.0f} µs)" if ours and floor else "–"


# The rows of the request-cost table: (label, where in the results, name there).
REQUEST_ROWS = [
    ("acquire (free key)", "library", "acquire"),
    ("acquire, busy key (condition fails, item returned)", "library", "acquire, busy key (condition fails)"),
    ("renew (heartbeat, extend)", "library", "renew (heartbeat, extend)"),
    ("release", "library", "release"),
    ("break", "library", "break"),
    ("GetItem, consistent (get, and waiters' polls)", "library", "GetItem"),
    ("acquire, minimal condition (`attribute_not_exists(owner) OR owner = :me`)", "raw", "acquire, minimal condition"),
    ("acquire, minimal update (`SET owner, fence`)", "raw", "acquire, minimal update"),
    ("acquire, minimal update and condition", "raw", "acquire, minimal update and condition"),
    ("simplest lock: PutItem, `attribute_not_exists`", "raw", "PutItem, attribute_not_exists"),
    ("simplest lock: DeleteItem, `owner = :me`", "raw", "DeleteItem, owner = :me"),
    ("UpdateItem of one attribute, conditioned on it", "raw", "UpdateItem, one attribute, owner = :me"),
    ("… the same, on a lock's item (slots, ring, holder)", "raw", "UpdateItem, one attribute, on the lock's item"),
]


def _request_costs(servers: list[dict[str, Any]]) -> str:
    """What each request costs on each server: medians in ms, and as a multiple of the
    simplest lock's PutItem on the same server."""
    names = [s["server"] for s in servers]
    head = (
        "| request (median ms; × the simplest lock's PutItem) | "
        + " | ".join(names)
        + " |\n|---|"
        + "---:|" * len(names)
    )
    lines = [head]
    for label, where, name in REQUEST_ROWS:
        cells = []
        for s in servers:
            ms = _get(s, "requests", where, name, "median_ms")
            put = _get(s, "requests", "raw", "PutItem, attribute_not_exists", "median_ms")
            cells.append("–" if ms is None else f"{ms:.2f} ({ms / put:.1f}×)" if put else f"{ms:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    plan = results["plan"]
    servers = results["servers"]
    meta = results["meta"]
    commit = (
        f", django-dynlock at commit {meta['git_head']}{' (engine modified)' if meta.get('engine_dirty') else ''}"
        if meta.get("git_head")
        else ""
    )
    out = [f"Run of {meta['started']} ({plan['mode']} mode, {meta.get('seconds', 0):.0f} s{commit}).", ""]
    out.append("Settings:")
    for name in ORDER:
        spec = results["specs"].get(name)
        if spec:
            out.append(f"- {SHORT[name]}: {spec['settings']}")
    crash = results.get("crash_specs") or {}
    if crash:
        out.append(
            "- crash test: "
            + "; ".join(
                f"{SHORT[n]} lease {c['lease_s']:g} s"
                + (f", heartbeat {c['heartbeat_s']:g} s" if c.get("heartbeat_s") else "")
                for n, c in crash.items()
            )
        )
    if not servers:  # --only waiting
        return "\n".join(out + _waiting_section(results.get("waiting")))
    for server in servers:
        out += ["", f"### {server['server']}", "", _server_table(server, plan)]
    names = [s["server"] for s in servers]
    out += ["", "| target (from the issue) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by_server = [targets(s) for s in servers]
    for i, (label, _, _) in enumerate(by_server[0] if by_server else []):
        out.append(f"| {label} | " + " | ".join(f"{t[i][1]} {_met(t[i][2])}" for t in by_server) + " |")
    out += ["", _dynlock_details(servers), "", _request_costs(servers)]
    for s in servers:
        if s.get("floor_check"):
            out += [
                "",
                f"WARNING ({s['server']}): the floor's requests differ from the engine's: "
                + "; ".join(s["floor_check"]),
            ]
    out += _waiting_section(results.get("waiting"))
    return "\n".join(out)


def _waiting_section(section: dict[str, Any] | None) -> list[str]:
    """Issue 28's section (bench/waiting.py), as ``python -m bench.waiting`` prints it."""
    if section is None:
        return []
    out = ["", "## Waiting (django-dynlock alone, DynamoDB Local, default settings)"]
    if "skipped" in section or "error" in section:
        return out + ["", f"not measured: {section.get('skipped') or section.get('error')}"]
    return out + [waiting.markdown(section)]


# -- plots ------------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path, dpi: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_handoff(results: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    servers = results["servers"]
    fig, axes = plt.subplots(1, len(servers), figsize=(7.2 * len(servers), 5.2), squeeze=False)
    for ax, s in zip(axes[0], servers):
        for name in WAITER_NAMES:
            h = _get(s, "handoff", name)
            if not h or not h.get("samples"):
                continue
            xs = sorted(x["latency_ms"] for x in h["samples"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(
                xs,
                ys,
                where="post",
                color=COLOURS[name],
                lw=2,
                label=f"{SHORT[name]}: p50 {h['p50_ms']:.0f}, p95 {h['p95_ms']:.0f} ms (n={h['n']})",
            )
        ax.axvline(T.HANDOFF_P50_MS.bound, color="grey", ls="--", lw=1)
        ax.text(
            T.HANDOFF_P50_MS.bound * 1.05, 0.03, f"{T.HANDOFF_P50_MS.bound:g} ms target", color="dimgrey", fontsize=8.5
        )
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(1, 10_000)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("handoff latency (ms, log scale): holder's release sent → waiter's acquire returns")
        ax.set_ylabel("fraction of handoffs ≤ x")
        ax.set_title(f"{s['server']}: handoff latency, cumulative distribution")
        ax.legend(loc="upper left", fontsize=8.5)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        f"Handoff latency per library (waiter in another process; hold 100–200 ms; {results['meta']['started']})",
        fontsize=11,
    )
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_throughput(results: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    servers = results["servers"]
    plan = results["plan"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
    width = 0.8 / len(ORDER)
    for ax, threads in zip(axes[:2], ("1", "8")):
        top = 1.0
        for j, name in enumerate(ORDER):
            xs, ys, lo, hi = [], [], [], []
            for i, s in enumerate(servers):
                u = uncontended_of(s, threads, name)
                if not u:
                    continue
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(u["median"])
                lo.append(u["median"] - u["min"])
                hi.append(u["max"] - u["median"])
                top = max(top, u["max"])
            label = SHORT[name] + (" (same path as fast)" if name in UNCONTENDED_AS else "")
            ax.bar(
                xs,
                ys,
                width,
                yerr=[lo, hi],
                capsize=2,
                color=COLOURS[name],
                label=label,
                hatch="//" if name in UNCONTENDED_AS else None,
                edgecolor="white" if name in UNCONTENDED_AS else None,
            )
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7.5)
        ratios = [derived(s)[f"u{threads}_vs_floor"] for s in servers]
        ax.set_xticks(
            range(len(servers)),
            [f"{s['server']}\nours / floor\n{r:.2f}×" if r else s["server"] for s, r in zip(servers, ratios)],
        )
        ax.set_ylim(0, top * 1.1)
        ax.set_ylabel("acquire+release cycles/s (median; whiskers min–max of rounds)")
        ax.set_title(f"Uncontended, {threads} thread{'s' if threads != '1' else ''} (each on its own key)")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    ax = axes[2]
    width = 0.8 / len(WAITER_NAMES)
    top = 1.0
    for j, name in enumerate(WAITER_NAMES):
        xs, ys, fair = [], [], []
        for i, s in enumerate(servers):
            c = _get(s, "contended", name)
            if not c:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(c["sections_per_s"])
            fair.append(c.get("fairness_jain"))
            top = max(top, c["sections_per_s"], c.get("limit_per_s") or 0)
        ax.bar(xs, ys, width, color=COLOURS[name], label=SHORT[name])
        for x, y, jain in zip(xs, ys, fair):
            ax.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=8)
            if jain is not None:
                ax.annotate(
                    f"fairness {jain:.2f}",
                    (x, 0),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=7.5,
                    rotation=90,
                    va="bottom",
                    color="white",
                )
    ax.set_xlim(-0.5, len(servers) - 0.5 + 0.35)
    for i, s in enumerate(servers):
        limit = _get(s, "contended", "dynlock", "limit_per_s")
        if limit:
            ax.hlines(limit, i - 0.45, i + 0.45, colors="black", linestyles="--", lw=1.2)
            ax.annotate(
                f"limit 1/(hold + 2·RTT)\n= {limit:.1f}",
                (i + 0.45, limit),
                textcoords="offset points",
                xytext=(2, -8),
                ha="left",
                fontsize=8,
            )
    ax.set_xticks(range(len(servers)), [s["server"] for s in servers])
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("critical sections/s")
    ax.set_title(
        f"Contended: {plan['procs']} processes, one key, hold {plan['hold'] * 1000:g} ms, {_windows(plan)}\n"
        "(fairness: Jain's index of sections per process, 1 = even)",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(
        f"Throughput per library ({results['meta']['started']}, {results['meta']['cpus']} shared cores, {plan['mode']} mode)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(plt, fig, path)


def plot_crash(results: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    servers = results["servers"]
    fig, axes = plt.subplots(1, len(servers), figsize=(7.5 * len(servers), 4.4), squeeze=False)
    for ax, s in zip(axes[0], servers):
        labels = []
        for i, name in enumerate(WAITER_NAMES):
            c = _get(s, "crash", name)
            labels.append(f"{SHORT[name]}\n(lease {c['lease_s']:g} s)" if c else SHORT[name])
            if not c or not c.get("trials"):
                continue
            ys = [t["takeover_s"] for t in c["trials"]]
            ax.barh(i, c["median_s"], color=COLOURS[name], alpha=0.8)
            ax.plot(ys, [i] * len(ys), "k|", ms=14)
            ax.plot([c["target_s"]] * 2, [i - 0.4, i + 0.4], color="black", ls="--", lw=1.2)
            ax.annotate(
                f"{c['median_s']:.2f} s (L + 1 = {c['target_s']:g} s)",
                (max(c["target_s"], c["max_s"]), i),
                textcoords="offset points",
                xytext=(6, -3),
                fontsize=8.5,
            )
        ax.set_yticks(range(len(WAITER_NAMES)), labels, fontsize=8.5)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(0.1, 300)
        ax.set_xlabel("seconds, log scale (bar: median; ticks: trials; dashed: lease + 1 s)")
        ax.set_title(f"{s['server']}: crash takeover, SIGKILL of the holder → waiter's acquire", fontsize=10)
        ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    return _save(plt, fig, path)


SERVER_COLOURS = {"dynamodb-local": "#9467bd", "moto": "#1f77b4", "dynalite": "#ff7f0e"}


def plot_vs_floor(results: dict[str, Any], path: Path) -> Path:
    """django-dynlock against the floor and the physical limit, server by server: its
    handoff latency, its uncontended rate beside the floor's, its contended rate beside
    1 / (hold + 2 × RTT) with the idle and the loaded round trip."""
    plt = _plt()
    servers = results["servers"]
    plan = results["plan"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.1, 1.4, 0.9]})

    ax = axes[0]
    handoffs = {
        s["server"]: sorted(x["latency_ms"] for x in _get(s, "handoff", "dynlock", "samples") or []) for s in servers
    }
    target_ms = T.HANDOFF_P50_MS.bound
    # Clip the axis at the largest p99 so that one outlier does not squash the curves.
    right = max([percentile(xs, 99) or 0 for xs in handoffs.values()] + [target_ms]) * 1.1
    for s in servers:
        samples = handoffs[s["server"]]
        if not samples:
            continue
        h = s["handoff"]["dynlock"]
        beyond = sum(1 for x in samples if x > right)
        note = f"\n{beyond} beyond axis (max {samples[-1]:.0f} ms)" if beyond else ""
        ax.step(
            samples,
            [(i + 1) / len(samples) for i in range(len(samples))],
            where="post",
            color=SERVER_COLOURS.get(s["server"]),
            lw=2,
            label=f"{s['server']}: p50 {h['p50_ms']:.1f} ms\np95 {h['p95_ms']:.1f} ms, n={len(samples)}{note}",
        )
    ax.axvline(target_ms, color="grey", ls="--", lw=1)
    ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.text(target_ms, 0.96, f"target: p50 ≤ {target_ms:g} ms ", color="dimgrey", fontsize=9, ha="right")
    ax.set_xlabel("handoff latency (ms): holder's release sent → waiter's acquire returns")
    ax.set_ylabel("fraction of handoffs ≤ x")
    ax.set_title("django-dynlock: handoff latency (cumulative distribution)")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, right)
    ax.legend(loc="lower right", fontsize=8.5)
    ax.grid(alpha=0.3)

    ax = axes[1]
    labels: list[str] = []
    bars: dict[str, tuple[list[float], list[list[float]]]] = {"dynlock": ([], [[], []]), "floor": ([], [[], []])}
    for s in servers:
        for threads in ("1", "8"):
            if not (uncontended_of(s, threads, "dynlock") and uncontended_of(s, threads, "floor")):
                continue
            labels.append(f"{s['server']}\n{threads} thread{'s' if threads != '1' else ''}")
            for name, (heights, err) in bars.items():
                u = uncontended_of(s, threads, name) or {}
                heights.append(u["median"])
                err[0].append(u["median"] - u["min"])
                err[1].append(u["max"] - u["median"])
    xs = list(range(len(labels)))
    width = 0.38
    for offset, name in ((-width / 2, "dynlock"), (width / 2, "floor")):
        heights, err = bars[name]
        ax.bar([x + offset for x in xs], heights, width, yerr=err, capsize=3, label=SHORT[name], color=COLOURS[name])
    tops = [max(h + e for h, e in zip(bars[name][0], bars[name][1][1])) for name in bars if bars[name][0]]
    for x in xs:
        ours, floor = bars["dynlock"][0][x], bars["floor"][0][x]
        top = max(ours + bars["dynlock"][1][1][x], floor + bars["floor"][1][1][x])
        ax.annotate(
            f"library/floor {ours / floor:.2f}×",
            (x, top),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xticks(xs, labels)
    ax.set_ylabel("acquire+release cycles/s (median; whiskers: min–max of rounds)")
    ax.set_title(f"Uncontended throughput, library vs floor (target ≥ {T.UNCONTENDED_VS_FLOOR.bound:g}×)")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, max(tops + [1]) * 1.18)

    ax = axes[2]
    contended = [(s["server"], _get(s, "contended", "dynlock")) for s in servers]
    contended = [(name, c) for name, c in contended if c and c.get("limit_per_s")]
    xs = list(range(len(contended)))
    third = 0.27
    measured = [c["sections_per_s"] for _, c in contended]
    limits = [c["limit_per_s"] for _, c in contended]
    ax.bar([x - third for x in xs], measured, third, label="measured", color=COLOURS["dynlock"])
    ax.bar(xs, limits, third, label="limit 1/(hold + 2·RTT), idle RTT", color="#c7c7c7", edgecolor="#7f7f7f")
    ax.bar(
        [x + third for x in xs],
        [c.get("limit_under_load_per_s") or 0.0 for _, c in contended],
        third,
        label="same with the RTT under load",
        color="white",
        edgecolor="#7f7f7f",
        hatch="//",
    )
    for x, value, (_, c) in zip(xs, measured, contended):
        ax.annotate(
            f"{c['ratio']:.2f}× limit",
            (x - third, value),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xticks(xs, [name for name, _ in contended])
    ax.set_ylabel("critical sections/s")
    ax.set_title(f"Contended: {plan['procs']} processes, one key, hold {plan['hold'] * 1000:g} ms")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, max(limits + measured + [1]) * 1.3)

    fig.suptitle(
        f"django-dynlock against the raw boto3 floor and the physical limit ({results['meta']['started']}, "
        f"{results['meta']['cpus']} cores, {plan['mode']} mode)",
        fontsize=11,
    )
    fig.tight_layout()
    return _save(plt, fig, path, dpi=110)


def plot_all(results: dict[str, Any], img_dir: Path) -> list[Path]:
    paths = []
    section = results.get("waiting") or {}
    if any(section.get(phase) for phase in waiting.PHASES):
        path = img_dir / "bench-waiting.png"
        waiting.plot(section, path)
        paths.append(path)
    if not results["servers"]:  # --only waiting
        return paths
    paths += [
        plot_handoff(results, img_dir / "bench-handoff.png"),
        plot_throughput(results, img_dir / "bench-throughput.png"),
        plot_crash(results, img_dir / "bench-crash.png"),
    ]
    if all(
        uncontended_of(s, "1", "floor") and _get(s, "handoff", "dynlock") and _get(s, "contended", "dynlock")
        for s in results["servers"]
    ):
        paths.append(plot_vs_floor(results, img_dir / "bench-vs-floor.png"))
    return paths


__all__ = ["derived", "markdown", "plot_all", "plot_vs_floor", "targets"]
