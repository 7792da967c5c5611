"""The history checker itself, on hand-made good and bad histories (no servers)."""

from __future__ import annotations

import pytest

from tests.reliability.history import Section, check, load_sections


def s(key, token, start, end, read=None, wrote=True, worker="w"):
    return Section(key=key, token=token, start=start, end=end, wrote=wrote, read=read, worker=worker)


GOOD = [
    s("a", 10, 0.0, 1.0, read=0),
    s("a", 11, 1.0, 2.0, read=1),  # touching the previous one is fine
    s("a", 13, 2.5, 2.6, read=None, wrote=False),  # lost its lease: did not write
    s("a", 20, 3.0, 4.0, read=2),
    s("b", 5, 0.5, 1.5, read=0),  # other keys may overlap "a"
]


def kinds(violations):
    return sorted(v.kind for v in violations)


def test_a_good_history_has_no_violation():
    assert check(GOOD, {"a": 3, "b": 1}) == []


def test_an_empty_history_has_no_violation():
    assert check([], {}) == []
    assert check([]) == []


def test_order_of_records_does_not_matter():
    assert check(list(reversed(GOOD)), {"a": 3, "b": 1}) == []


def test_overlap_on_one_key():
    history = [s("a", 1, 0.0, 1.0, read=0), s("a", 2, 0.9, 2.0, read=1)]
    violations = check(history, {"a": 2})
    assert kinds(violations) == ["overlap"]
    assert "0.100000s before" in violations[0].detail


def test_overlap_with_a_section_that_lost_its_lease():
    # It did not write, but it believed it held the lock until 1.5.
    history = [s("a", 1, 0.0, 1.5, wrote=False), s("a", 2, 1.0, 2.0, read=0)]
    assert kinds(check(history, {"a": 1})) == ["overlap"]


def test_overlap_hidden_behind_a_short_section():
    # The long first section overlaps the third although the second does not.
    history = [s("a", 1, 0.0, 5.0, read=0), s("a", 2, 5.0, 5.0, wrote=False), s("a", 3, 4.0, 4.5, read=1)]
    violations = check(history, {"a": 2})
    assert "overlap" in kinds(violations)


def test_tokens_must_increase_in_order_of_acquisition():
    history = [s("a", 5, 0.0, 1.0, read=0), s("a", 4, 1.0, 2.0, read=1)]
    assert kinds(check(history, {"a": 2})) == ["token-order"]


def test_equal_tokens_are_a_violation():
    history = [s("a", 5, 0.0, 1.0, read=0), s("a", 5, 1.0, 2.0, read=1)]
    assert kinds(check(history, {"a": 2})) == ["token-order"]


def test_a_stale_read_is_a_lost_update():
    # The second writer read 0: it overwrote the first one's increment.
    history = [s("a", 1, 0.0, 1.0, read=0), s("a", 2, 1.0, 2.0, read=0)]
    violations = check(history, {"a": 1})
    assert kinds(violations) == ["lost-update", "lost-update"]


def test_final_counter_must_equal_the_writers():
    history = [s("a", 1, 0.0, 1.0, read=0), s("a", 2, 1.0, 2.0, read=1)]
    assert kinds(check(history, {"a": 1})) == ["lost-update"]
    assert kinds(check(history, {"a": 3})) == ["lost-update"]


def test_a_counter_without_sections_must_be_untouched():
    assert kinds(check([], {"z": 1})) == ["lost-update"]
    assert check([], {"z": 0}) == []


def test_initial_counter_value():
    history = [s("a", 1, 0.0, 1.0, read=7)]
    assert check(history, {"a": 8}, initial=7) == []


def test_bad_records():
    assert kinds(check([s("a", 1, 2.0, 1.0, read=0)], {"a": 1})) == ["bad-record"]
    assert kinds(check([s("a", 1, 0.0, 1.0, read=None)])) == ["bad-record"]


def test_overlap_and_lost_update_together_are_both_reported():
    # The classic broken lock: two holders read the same value at the same time.
    history = [s("a", 1, 0.0, 1.0, read=0, worker="p1"), s("a", 2, 0.5, 1.5, read=0, worker="p2")]
    violations = check(history, {"a": 1})
    # p2 read a stale 0, the final counter misses one increment, and the intervals overlap.
    assert kinds(violations) == ["lost-update", "lost-update", "overlap"]
    overlap = next(v for v in violations if v.kind == "overlap")
    assert "p1" in overlap.detail and "p2" in overlap.detail


@pytest.mark.parametrize("n", [1000])
def test_many_sections_are_checked_quickly(n):
    history = [s("k", i + 1, float(i), float(i) + 0.5, read=i) for i in range(n)]
    assert check(history, {"k": n}) == []
    broken = history[:500] + [s("k", 10_000, 499.2, 499.4, read=499)] + history[500:]
    assert "overlap" in kinds(check(broken, {"k": n}))


def test_load_sections_reads_worker_files_and_skips_torn_lines(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(GOOD[0].to_json() + "\n" + '{"type": "event", "event": "lost"}\n' + '{"type": "sect')
    sections, others = load_sections([path, tmp_path / "missing.jsonl"])
    assert sections == [GOOD[0]]
    assert others == [{"type": "event", "event": "lost"}]
