"""The batch search's step policy, regime by regime: pure functions of the evidence the trials
gathered (``unimem.search.regimes``), so each rule is checked on the few figures that decide it."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import assume, given
from hypothesis import strategies as st

from unimem.search.regimes import Evidence, Step, next_size, saturate
from unimem.search.rules import MOST, closing

MARGIN = 0.05


def _evidence(**figures: object) -> Evidence:
    return Evidence(**{"good": 100, "margin": MARGIN, **figures})  # type: ignore[arg-type]


def test_nothing_ran_halves_the_smallest_failure() -> None:
    assert next_size(_evidence(good=0, bad=64)) == Step(32, "halve", relies=False)
    assert next_size(_evidence(good=0, bad=1)).size == 1  # never below one sample


def test_a_filled_pool_grown_in_regions_tries_the_size_that_ends_the_search() -> None:
    # 1000 took about all the room left: the size whose failure leaves 1000 within the margin.
    ends = math.floor(1000 / (1 - MARGIN)) + 1
    assert next_size(_evidence(good=1000, filled_room=True)) == Step(ends, "close", relies=False)
    assert next_size(_evidence(good=1000, filled_room=True, high=1040)).size == 1040  # within every bound


def test_a_room_filled_within_its_count_is_passed_by_two_margins_then_closed() -> None:
    # The room counts all a step adds as one piece; only its largest buffer needs one. A first size that
    # filled it with its peak within that count, nothing failed: two margins past it (the Flax MLP on an
    # H200 ran more than two past such a size), then the size whose failure ends the search.
    first = _evidence(good=1000, filled_room=True, within_room=True)
    assert next_size(first) == Step(closing(1000, MARGIN, 2), "past-room", relies=False)
    assert next_size(replace(first, refilled=True)) == Step(closing(1000, MARGIN), "close", relies=False)
    assert next_size(replace(first, bad=2000, high=1999)) == Step(closing(1000, MARGIN), "close", relies=False)
    assert next_size(replace(first, high=1080)).size == 1080  # within every bound


def test_growing_before_any_bound_doubles() -> None:
    assert next_size(_evidence()) == Step(200, "grow")


def test_growing_takes_the_sure_step_where_the_headroom_is_known() -> None:
    # Surely fits up to 400: the step is 400 less half the margin.
    assert next_size(_evidence(safe=400)) == Step(math.floor(400 * (1 - MARGIN / 2)), "safe-jump")


def test_growing_over_a_plateau_of_fixed_costs_squares_its_ratio() -> None:
    # The two largest sizes peaked the same (sizes 2 apart): stride 4; 3 apart: stride 9.
    assert next_size(_evidence(flat=2.0)) == Step(400, "grow")
    assert next_size(_evidence(flat=3.0)) == Step(900, "grow")


def test_max_size_in_reach_is_tried_itself() -> None:
    assert next_size(_evidence(max_size=150, high=150)) == Step(150, "upper-bound")


def test_max_size_far_above_the_sure_bound_is_no_evidence_memory_reaches_it() -> None:
    # GPT-2 under 24 GiB, the dataset's 4096 samples as max_size: after 2 ran, the sure step (9) as without
    # max_size, not the geometric mean of 9 and 4096 (192, which failed, then 41 and 18 did).
    for figures in ({"good": 2, "safe": 10}, {"safe": 1000}, {"safe": 1000, "flat": 2.0}):
        unbounded = next_size(_evidence(**figures))
        assert next_size(_evidence(**figures, max_size=4096, high=4096)) == unbounded, figures
    assert next_size(_evidence(good=2, safe=10, max_size=4096, high=4096)) == Step(9, "safe-jump")
    # The step capped at max_size: a stride over a plateau of fixed costs.
    assert next_size(_evidence(safe=200, flat=3.0, max_size=800, high=800)) == Step(800, "grow")


def test_no_bracket_under_max_size_alone_stalls() -> None:
    # Sure steps from below leave a bracket up to max_size more than half as wide: no stall, no
    # bisection towards max_size (sqrt(34 x 4096) = 373); the line's answer, as without max_size.
    line = _evidence(good=34, safe=73, predicted=97, stalled=True)
    assert next_size(replace(line, max_size=4096, high=4096)) == next_size(line) == Step(94, "predict")
    # A failure makes it a bracket: then it stalls.
    assert next_size(replace(line, bad=4096, high=4095)) == Step(math.floor(math.sqrt(34 * 4095)), "bisect")


def test_a_sure_bound_past_max_size_tries_max_size_itself() -> None:
    assert next_size(_evidence(good=4, safe=1000, max_size=500, high=500)) == Step(500, "upper-bound")
    # A failure refuted the limit the sure bound was measured against: no such shortcut then.
    assert next_size(_evidence(good=4, bad=600, safe=1000, max_size=500, high=500)).size < 500


def test_a_trusted_line_is_extrapolated_to_just_under_its_answer() -> None:
    assert next_size(_evidence(predicted=1000)) == Step(math.floor(1000 * (1 - MARGIN / 2)), "predict")


def test_a_convex_line_is_only_an_upper_estimate_and_is_bisected_towards() -> None:
    # Peaks that steepen: the line's answer is too high, so the geometric mean of 100 and it.
    assert next_size(_evidence(predicted=1000, convex=True)) == Step(math.floor(math.sqrt(100 * 1000)), "predict-far")


def test_a_sure_bound_a_step_up_is_taken() -> None:
    low = math.floor(300 * (1 - MARGIN / 2))
    assert next_size(_evidence(bad=1000, high=999, safe=300)) == Step(low, "safe-jump")


def test_no_second_small_sure_step_in_a_row() -> None:
    # A sure bound only 10% up after a sure step that fit: bisect instead of creeping up.
    small = _evidence(bad=200, high=199, safe=113)
    assert next_size(small) == Step(110, "safe-jump")
    assert next_size(_evidence(bad=200, high=199, safe=113, jumped=True)) == Step(
        math.floor(math.sqrt(110 * 199)), "bisect"
    )


def test_a_line_that_missed_by_a_size_aims_at_the_top_of_the_bracket() -> None:
    # 2 and 9 ran, the line's size 13 failed, refuting the sure bound and the line: bisecting in size
    # would try 10, 11 and 12. Where the line said 12 fits with the margin to spare, 12 itself.
    missed = _evidence(good=9, bad=13, high=12, linear=True)
    assert next_size(missed) == Step(10, "bisect")
    assert next_size(replace(missed, line_with_margin=12)) == Step(12, "predict")
    assert next_size(replace(missed, line_with_margin=14)) == Step(12, "predict")  # within every bound
    assert next_size(replace(missed, line_with_margin=11)) == Step(10, "bisect")  # the evidence falls short


def test_a_bracket_is_bisected_in_log_size() -> None:
    assert next_size(_evidence(bad=1000, high=999)) == Step(math.floor(math.sqrt(100 * 999)), "bisect")


def test_costly_failures_split_the_bracket_a_third_of_the_way_up() -> None:
    third = math.floor(math.exp(2 / 3 * math.log(100) + 1 / 3 * math.log(999)))
    step = next_size(_evidence(bad=1000, high=999, cautious=True))
    assert step == Step(third, "bisect") and step.size < math.sqrt(100 * 999)


def test_after_a_refuted_sure_bound_on_a_line_the_bracket_is_split_in_size() -> None:
    # The capacity lies under the limit: the answer nearer the failure, so the middle in size, not log-size.
    assert next_size(_evidence(bad=200, high=199, linear=True)) == Step(149, "bisect")
    assert next_size(_evidence(bad=200, high=199)).size == math.floor(math.sqrt(100 * 199))


def test_a_climb_past_flat_peaks_steps_three_margins_past_the_last_peak_then_closes() -> None:
    # The framework saves memory to fit: 905 ran above 900, the last size whose peak rose.
    three = closing(900, MARGIN, 3)
    assert next_size(_evidence(good=905, climb=1, peaked=900)) == Step(three, "saturated")
    assert next_size(_evidence(good=1000, climb=2, peaked=900)) == Step(closing(1000, MARGIN), "saturated")
    assert next_size(_evidence(good=1000, climb=4, peaked=900)) == Step(closing(1000, MARGIN, 2), "saturated")


def test_a_knee_near_the_limit_steps_by_the_margin_then_doubles() -> None:
    assert next_size(_evidence(good=1000, saturated=True)) == Step(closing(1000, MARGIN), "saturated")
    # Past three saturated steps in a row each doubles: four margins after four.
    assert next_size(_evidence(good=1000, saturated=True, streak=4)) == Step(closing(1000, MARGIN, 4), "saturated")


def test_near_the_edge_the_size_that_ends_the_search_within_the_bracket() -> None:
    # The bisection (1019) is a smaller step than the margin: try the size that ends the search, capped by 1039.
    assert next_size(_evidence(good=1000, bad=1040, high=1039)) == Step(1039, "close")


def test_a_stalled_bracket_is_bisected_whatever_placed_the_size() -> None:
    line = _evidence(predicted=990, high=1000)
    assert next_size(line).reason == "predict"
    assert next_size(_evidence(predicted=990, high=1000, stalled=True)) == Step(
        math.floor(math.sqrt(100 * 1000)), "bisect"
    )


def test_on_a_host_no_size_grows_past_its_factor() -> None:
    assert next_size(_evidence(predicted=10_000, host_growth=8)) == Step(800, "predict")


def test_every_bound_holds_the_size() -> None:
    assert next_size(_evidence(predicted=10_000, high=5_000)) == Step(5_000, "predict")


@given(
    good=st.integers(1, 10**6),
    above=st.integers(2, 10**6),
    predicted=st.none() | st.integers(0, 10**7),
    safe=st.none() | st.integers(0, 10**7),
    missed=st.none() | st.integers(0, 10**7),
    flags=st.lists(st.booleans(), min_size=7, max_size=7),
    flat=st.sampled_from([0.0, 1.5, 4.0]),
    climb=st.integers(0, 5),
    streak=st.integers(0, 6),
    failed=st.booleans(),
)
def test_every_measured_step_lies_above_good_and_within_the_bounds(
    good: int,
    above: int,
    predicted: int | None,
    safe: int | None,
    missed: int | None,
    flags: list[bool],
    flat: float,
    climb: int,
    streak: int,
    failed: bool,
) -> None:
    high = good + above
    convex, saturated, refit, jumped, cautious, linear, stalled = flags
    assume(not refit or failed)
    evidence = Evidence(
        good=good,
        bad=high + 1 if failed else None,
        margin=MARGIN,
        high=high,
        predicted=predicted,
        convex=convex,
        safe=safe,
        flat=flat,
        saturated=saturated,
        streak=streak,
        refit=refit,
        jumped=jumped,
        cautious=cautious,
        linear=linear,
        climb=climb,
        peaked=good,
        stalled=stalled,
        line_with_margin=missed,
    )
    step = next_size(evidence)
    assert good < step.size <= high and step.relies


def test_a_long_saturated_climb_stays_a_whole_size() -> None:
    # Each saturated step doubles its margins; after a long streak the divisor underflowed to 0 and the
    # search raised ZeroDivisionError. Past what any memory holds, the step stops at ``MOST``.
    assert closing(6101, MARGIN, 2**14) == MOST
    assert saturate(_evidence(good=6101, streak=16)) == (MOST, "saturated")
    assert closing(1000, MARGIN, 2) == math.floor(1000 / (1 - MARGIN) ** 2) + 1  # short climbs as before
