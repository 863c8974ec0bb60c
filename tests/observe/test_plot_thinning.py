"""Thinning a timeline to a view's width: every bucket's extremes survive, gaps still break the line."""

from __future__ import annotations

import math
import random

import pytest

from unimem.errors import ConfigError
from unimem.observe.thinning import spaced, thin_line


def _buckets(times: list[float], buckets: int) -> list[int]:
    low = min(times)
    width = (max(times) - low) / buckets
    return [min(int((t - low) / width), buckets - 1) for t in times]


@pytest.mark.parametrize("seed", range(8))
def test_every_bucket_keeps_its_first_lowest_highest_and_last_point(seed: int) -> None:
    rnd = random.Random(seed)
    times = sorted(rnd.uniform(0, 100) for _ in range(5_000))
    values: list[float | None] = [rnd.randrange(1 << 30) for _ in times]
    kept_times, kept_values = thin_line(times, values, 50)
    assert len(kept_times) <= 4 * 50 and kept_times == sorted(kept_times)
    kept = set(zip(kept_times, kept_values, strict=True))
    assert kept <= set(zip(times, values, strict=True))  # no point is made up
    by_bucket: dict[int, list[tuple[float, float | None]]] = {}
    for t, v, b in zip(times, values, _buckets(times, 50), strict=True):
        by_bucket.setdefault(b, []).append((t, v))
    for points in by_bucket.values():
        first, last = points[0], points[-1]
        assert first in kept and last in kept
        here = {v for t, v in kept if first[0] <= t <= last[0]}
        assert max(v for _, v in points if v is not None) in here
        assert min(v for _, v in points if v is not None) in here


def test_a_single_spike_among_a_million_flat_points_survives() -> None:
    times = [i * 0.001 for i in range(1_000_000)]
    values: list[float | None] = [1 << 20] * len(times)
    values[777_777] = 1 << 34
    kept_times, kept_values = thin_line(times, values, 1000)
    assert len(kept_values) <= 4000
    assert max(v for v in kept_values if v is not None) == 1 << 34
    assert kept_times[kept_values.index(1 << 34)] == times[777_777]


def test_a_gap_still_breaks_the_line_and_a_run_of_gaps_is_one_break() -> None:
    times = [float(i) for i in range(10_000)]
    values: list[float | None] = [float(i % 7) for i in range(10_000)]
    values[5_000:5_003] = [None, None, None]  # three failed readings in a row
    values[8_000] = None
    kept_times, kept_values = thin_line(times, values, 20)
    breaks = [t for t, v in zip(kept_times, kept_values, strict=True) if v is None]
    assert breaks == [5_000.0, 8_000.0]
    before = kept_values[kept_values.index(None) - 1]
    assert before is not None and kept_times[kept_values.index(None) - 1] == 4_999.0  # the line stops at the gap


def test_a_short_line_comes_back_whole_and_bad_times_are_left_out_or_put_in_order() -> None:
    assert thin_line([1.0, 2.0, 3.0], [5, None, 7], 10) == ([1.0, 2.0, 3.0], [5, None, 7])
    times = [3.0, math.nan, 1.0, math.inf, 2.0]
    assert thin_line(times, [30, 99, 10, 99, 20], 10) == ([1.0, 2.0, 3.0], [10, 20, 30])
    assert thin_line([], [], 10) == ([], [])


@pytest.mark.parametrize("buckets", [0, -3, 1.5, True, "100"])
def test_a_bucket_count_that_is_not_a_whole_number_of_one_or_more_is_refused(buckets: object) -> None:
    with pytest.raises(ConfigError, match="buckets"):
        thin_line([1.0], [1], buckets)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="values"):
        thin_line([1.0, 2.0], [1], 10)


def test_spaced_keeps_items_at_least_the_gap_apart_from_the_leftmost() -> None:
    rnd = random.Random(3)
    positions = [rnd.uniform(0, 1000) for _ in range(2_000)] + [math.nan]
    kept = spaced(positions, 25.0)
    xs = [positions[i] for i in kept]
    assert xs == sorted(xs) and xs[0] == min(p for p in positions if not math.isnan(p))
    assert all(b - a >= 25.0 for a, b in zip(xs, xs[1:], strict=False))
    assert len(kept) <= 1000 / 25 + 1
    # nothing left out could be drawn without coming closer than the gap to one kept
    assert all(min(abs(p - x) for x in xs) < 25.0 for p in positions if not math.isnan(p))
    assert spaced([2.0, 1.0, 1.0], 0) == [1, 2, 0]
