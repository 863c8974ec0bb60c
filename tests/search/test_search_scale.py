"""The predicted scale's placement: how many compilations it spends to find the largest size
predicted under a limit (each one costs seconds on a GPU)."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from unimem.search.scale import OVER, Scale

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
    scale = Scale(h200_mlp, budget=40, rising=True)
    scale.peak(64), scale.peak(2048)
    found = scale.locate(int(7.30 * GiB), 64, None, 0.025, 6)
    assert found is not None and h200_mlp(found) <= 7.30 * GiB
    crossing = max(n for n in range(57000, 59000) if h200_mlp(n) <= 7.30 * GiB)
    assert found >= 0.975 * crossing
    assert scale.compiles - 2 <= 4, sorted(scale.memo)


@given(
    fixed=st.floats(0.1, 4.0),
    largest_near=st.integers(1_000, 2_000_000),
    bend=st.floats(-0.03, 0.3),
)
def test_placement_stays_within_the_tolerance_in_few_compilations(fixed: float, largest_near: int, bend: float) -> None:
    # Peaks in GiB: a line that bends up, or down a little, as XLA's buffer assignment gives (its
    # bytes per sample rise with the size and level off: on an H200 they fell by at most 0.7% past
    # 65536, and a line from a smaller size bounds the answer only where they do not fall much more);
    # 60 GiB allowed beside the fixed part.
    per_sample = 60 / largest_near

    def predicted(n: int) -> int:
        return int((fixed + per_sample * n * (1 + bend * n / (2 * largest_near))) * GiB)

    allowed = int((fixed + 60) * GiB)
    low, high = 1, 8 * largest_near  # the largest size predicted under ``allowed``, bisected
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if predicted(middle) <= allowed else (low, middle)
    scale = Scale(predicted, budget=40, rising=True)
    scale.peak(64), scale.peak(128)
    found = scale.locate(allowed, 64, None, 0.025, 8)
    assert found is not None and predicted(found) <= allowed and found >= 0.975 * low
    assert scale.compiles - 2 <= 6, sorted(scale.memo)


# The same MLP on the H200 under an 8 GiB cap with growth on (2026-12-01): XLA's peak and its
# temporaries (one buffer) at 2048, 32768 and 49152, and at 64 the largest buffer is a parameter
# (4096 x 4096 float32); the pool left 6.37 GB under the cap as one piece before the search.
LIMIT_8G, ROOM_8G = 8_554_283_008, 6_371_147_776


def h200_mlp_pieces(n: int) -> tuple[int, int]:
    if n <= 64:
        return 1_410_228_500, 4096 * 4096 * 4
    if n <= 2048:
        return 1_501_978_896, 75_600_000
    temp = int(3.355e9 + (n - 32768) * (5.033e9 - 3.355e9) / 16384)
    return temp + int(1.679e9 + (n - 32768) * (1.813e9 - 1.679e9) / 16384), temp


def test_a_largest_buffer_flat_at_small_sizes_does_not_send_the_first_guess_far_past() -> None:
    # At 64 and 2048 the largest buffer is a parameter and barely grows, so a line through the
    # raised peaks is nearly flat: followed alone it compiled 1489717 first on the H200, 24 times
    # the answer (every compilation costs seconds, and its autotuning takes regions from the pool).
    scale = Scale(h200_mlp_pieces, budget=40, room=ROOM_8G, rising=True)
    scale.peak(64), scale.peak(2048)
    found = scale.locate(LIMIT_8G, 2048, None, 0.025, 6)
    fits = [n for n in range(40000, 70000, 16) if h200_mlp_pieces(n)[1] <= ROOM_8G]
    assert found is not None and h200_mlp_pieces(found)[1] <= ROOM_8G
    assert found >= 0.975 * max(fits)
    assert max(scale.memo) <= 4 * found, sorted(scale.memo)
    assert scale.compiles - 2 <= 4, sorted(scale.memo)


# The transformer of the search rows on the H200 under an 8 GiB cap with growth on
# (2026-12-01): XLA's temporaries (the largest buffer) by batch size, in GiB: 54 MiB at 2, then
# 113 MiB a sample up to 52, then flat near 6.2 GiB with steps either way as XLA rematerializes;
# the arguments and outputs add about 1.3 GiB. The parameters and optimizer state in use before
# the search are 0.60 GB, and the pool left 5.97 GiB under the cap as one piece. A compilation
# took 23-41 s there, two at once 31 s.
H200_TRANSFORMER = [(2, 0.0528), (24, 2.719), (40, 4.531), (52, 5.891), (56, 6.344), (60, 6.328), (71, 6.10)]
H200_TRANSFORMER += [(73, 6.27), (75, 6.15), (77, 6.32), (80, 6.25), (83, 6.16), (86, 6.30), (89, 6.26), (92, 6.29)]
H200_TRANSFORMER += [(223, 14.81), (229, 15.21), (4000, 260.0)]
ROOM_TRANSFORMER, HELD_TRANSFORMER = 6_408_896_512, 604_078_336


def h200_transformer(n: int) -> tuple[int, int]:
    i = min(max(1, bisect.bisect_left([m for m, _ in H200_TRANSFORMER], n)), len(H200_TRANSFORMER) - 1)
    (n0, t0), (n1, t1) = H200_TRANSFORMER[i - 1], H200_TRANSFORMER[i]
    temp = int((t0 + (t1 - t0) * (n - n0) / (n1 - n0)) * GiB)
    return temp + int(1.3 * GiB), temp


class Rounds:
    """Predictions as the search compiles them: one size at a time, or several at once (a round)."""

    def __init__(self, predicted: Callable[[int], tuple[int, int]]) -> None:
        self.predicted = predicted
        self.rounds: list[list[int]] = []

    def one(self, n: int) -> tuple[int, int]:
        self.rounds.append([n])
        return self.predicted(n)

    def many(self, sizes: list[int]) -> list[tuple[int, int]]:
        self.rounds.append(list(sizes))
        return [self.predicted(n) for n in sizes]


def test_a_transformer_that_rematerializes_is_placed_in_three_rounds() -> None:
    # From batch 2 alone, whose temporaries have not levelled off: one more small size where the
    # line from what the step holds crosses the limit (it lands under the answer), then the answer
    # from the line through it, with the size one margin under it beside (no room to lose here).
    # Past 52 the temporaries stay flat over the room: a line through them creeps (on the H200,
    # eleven compilations from 92 down to 71), so nothing is compiled far past the answer.
    rounds = Rounds(h200_transformer)
    scale = Scale(rounds.one, budget=40, predict_many=rounds.many, width=2, room=ROOM_TRANSFORMER, rising=True)
    scale.held = HELD_TRANSFORMER
    scale.peak(2)
    found = scale.locate(LIMIT_8G, 2, None, 0.025, 6)
    largest = max(n for n in range(2, 4000) if h200_transformer(n)[1] <= ROOM_TRANSFORMER)
    assert found is not None and largest >= found >= 0.975 * largest, (found, largest, rounds.rounds)
    assert len(rounds.rounds) - 1 <= 3, rounds.rounds
    assert max(n for r in rounds.rounds for n in r) <= 2 * largest, rounds.rounds


def test_a_line_through_a_flat_stretch_halves_the_bracket_instead_of_creeping() -> None:
    # Only 2 fits and 92 does not: the line between them crosses the room just under 92 again
    # and again (the temporaries are flat there); two rounds that leave it over half as wide halve it.
    rounds = Rounds(h200_transformer)
    scale = Scale(rounds.one, budget=40, predict_many=rounds.many, width=2, room=ROOM_TRANSFORMER, rising=True)
    scale.peak(2), scale.peak(92)
    found = scale.locate(LIMIT_8G, 2, None, 0.025, 8)
    largest = max(n for n in range(2, 4000) if h200_transformer(n)[1] <= ROOM_TRANSFORMER)
    assert found is not None and largest >= found >= 0.975 * largest, (found, largest, rounds.rounds)
    assert len(rounds.rounds) - 2 <= 8, rounds.rounds


def test_a_parameter_as_the_largest_buffer_places_the_first_round_under_the_answer() -> None:
    # At 64 the MLP's largest buffer is a parameter: the line from zero through it is far steeper
    # than the temporaries' own, so the first rounds land under the answer and the next draws the
    # step's own lines; no round compiles a size far past the answer.
    rounds = Rounds(h200_mlp_pieces)
    scale = Scale(rounds.one, budget=40, predict_many=rounds.many, width=2, room=ROOM_8G, rising=True)
    scale.held = 704_852_224
    scale.peak(64)
    found = scale.locate(LIMIT_8G, 64, None, 0.025, 6)
    fits = [n for n in range(40000, 70000, 16) if h200_mlp_pieces(n)[1] <= ROOM_8G]
    assert found is not None and h200_mlp_pieces(found)[1] <= ROOM_8G and found >= 0.975 * max(fits)
    assert all(h200_mlp_pieces(n)[1] <= ROOM_8G for n in rounds.rounds[1]), rounds.rounds
    assert max(n for r in rounds.rounds for n in r) <= 1.1 * max(fits), rounds.rounds
    assert len(rounds.rounds) - 1 <= 3, rounds.rounds


def test_no_fresh_process_bound_once_a_size_predicted_to_fit_failed() -> None:
    # A size predicted to fit that failed says the predictions overstate what the device fits: a bound for
    # a fresh process from them would name sizes that fail there too (on an H200 a JAX MLP's search failed
    # at 59,975 in a pool holding little more than its step; a fresh process fitted 42,197).
    scale = Scale(h200_mlp, budget=40, rising=True)
    for n in (64, 13457, 25576, 54609):
        scale.peak(n)
    limit = int(8 * GiB)
    before = scale.fresh_bound(limit, limit)
    assert before is not None and before > 54609
    scale.ran(54609, False, 0, None)
    assert scale.fresh_bound(limit, limit) is None
