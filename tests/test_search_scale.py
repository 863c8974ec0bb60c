"""The predicted scale's placement: how many compilations it spends to find the largest size
predicted under a limit (each one costs seconds on a GPU)."""

from __future__ import annotations

import bisect

from hypothesis import given
from hypothesis import strategies as st

from unimem.search_scale import OVER, Scale

GiB = 1 << 30

# XLA's predicted peaks of an MLP's training step on an H200 (1024 -> 4 x 4096 -> 1024, optax
# AdamW), by batch size: a line that bends a little, so a secant from a small size overshoots.
H200_MLP = [(64, 1.32), (2048, 1.40), (13457, 2.65), (17937, 3.16), (25576, 3.95), (54609, 6.94)]
H200_MLP += [(57484, 7.23), (58212, 7.31), (58453, 7.33), (72466, 8.78), (142884, 16.0)]


def h200_mlp(n: int) -> int:
    if n > H200_MLP[-1][0]:
        return OVER  # past the device: the lowering itself runs out of memory
    i = min(max(1, bisect.bisect_left([m for m, _ in H200_MLP], n)), len(H200_MLP) - 1)
    (n0, p0), (n1, p1) = H200_MLP[i - 1], H200_MLP[i]
    return int((p0 + (p1 - p0) * (n - n0) / (n1 - n0)) * GiB)


def test_a_bent_line_is_placed_in_four_compilations_not_five() -> None:
    scale = Scale(h200_mlp, budget=40)
    scale.peak(64), scale.peak(2048)
    found = scale.locate(int(7.30 * GiB), 64, None, 0.025, 6)
    assert found is not None and h200_mlp(found) <= 7.30 * GiB
    crossing = max(n for n in range(57000, 59000) if h200_mlp(n) <= 7.30 * GiB)
    assert found >= 0.975 * crossing
    assert scale.compiles - 2 <= 4, sorted(scale.memo)


@given(
    fixed=st.floats(0.1, 4.0),
    largest_near=st.integers(1_000, 2_000_000),
    bend=st.floats(-0.3, 0.3),
)
def test_placement_stays_within_the_tolerance_in_few_compilations(fixed: float, largest_near: int, bend: float) -> None:
    # Peaks in GiB: a line with a mild bend either way (increasing throughout), as XLA's
    # buffer assignment gives; 60 GiB allowed beside the fixed part.
    per_sample = 60 / largest_near

    def predicted(n: int) -> int:
        return int((fixed + per_sample * n * (1 + bend * n / (2 * largest_near))) * GiB)

    allowed = int((fixed + 60) * GiB)
    low, high = 1, 8 * largest_near  # the largest size predicted under ``allowed``, bisected
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if predicted(middle) <= allowed else (low, middle)
    scale = Scale(predicted, budget=40)
    scale.peak(64), scale.peak(128)
    found = scale.locate(allowed, 64, None, 0.025, 8)
    assert found is not None and predicted(found) <= allowed and found >= 0.975 * low
    assert scale.compiles - 2 <= 6, sorted(scale.memo)
