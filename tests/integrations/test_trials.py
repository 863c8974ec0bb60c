"""How the trainers' batch-size finders try a size (``unimem.integrations.trials``), without a framework:
each trial starts from the fit's own start, sizes above the finder's bound never run, and with the
search settings the finders pass, a GPT-2-like step under a cap is found in few calls."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

import unimem
from unimem.integrations.trials import SEARCH_SETTINGS, FitStart, NotTried, bounded

GIB = 1 << 30


class _Parameter:
    def __init__(self, grad: object = None) -> None:
        self.grad = grad


class _Optimizer:
    def __init__(self, state: dict[Any, Any] | None = None) -> None:
        self.state: dict[Any, Any] = dict(state or {})


def test_each_trial_starts_without_the_state_and_gradients_the_fit_starts_without() -> None:
    fresh, resumed = _Optimizer(), _Optimizer({"w": {"exp_avg": 1.0}})
    weights = _Parameter()
    start = FitStart([fresh, resumed], [weights, weights])
    fresh.state["w"] = {"exp_avg": 2.0}  # a trial's steps made state and gradients
    resumed.state["w"] = {"exp_avg": 3.0}
    weights.grad = 0.5
    start.restore()
    assert fresh.state == {} and weights.grad is None
    assert resumed.state == {"w": {"exp_avg": 3.0}}  # a resumed fit starts with its state: it stays


def test_gradients_the_fit_starts_with_are_left_alone() -> None:
    held, empty = _Parameter(grad=1.0), _Parameter()
    start = FitStart([], [held, empty])
    empty.grad = 2.0
    start.restore()
    assert held.grad == 1.0 and empty.grad == 2.0


def _device(
    fits: int, base: float, fixed: float, per: float
) -> tuple[Callable[[int], None], Callable[[], int], list[int]]:
    """A step that runs up to ``fits`` samples, its peak ``base + fixed + per × n`` GB, and the sizes it ran."""
    ran: list[int] = []

    def step(size: int) -> None:
        ran.append(size)
        if size > fits:
            raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    return step, lambda: int((base + fixed + per * ran[-1]) * 1e9), ran


def _search(step: Callable[[int], None], measure: Callable[[], int], start: int, **settings: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.find_batch_size(
            step, start=start, backend="nvml", measure=measure, limit=24 * GIB, baseline=int(0.5e9), **settings
        )


def test_a_size_above_the_bound_is_refused_unrun_and_the_answer_stays_within_it() -> None:
    step, measure, ran = _device(fits=400, base=0.5, fixed=1.0, per=0.05)
    held = bounded(step, 60, "max_val")
    with pytest.raises(NotTried, match="batch size 61 not tried: above max_val \\(60\\)"):
        held(61)
    assert ran == [] and unimem.is_oom(NotTried("x"))  # the search reads it as a size that does not fit
    search = _search(held, measure, 2, return_trials=True, **SEARCH_SETTINGS)
    assert 57 <= search.batch_size <= 60, search.trials
    assert max(ran) <= 60  # no size above the bound ran


# A GPT-2-like step on a 24 GiB cap: a third of a sample's bytes fixed (weights' gradients, the optimizer's
# state), the largest batch 11 to 14 by the loop, a data bound far above it; started at Lightning's default
# (2) and the Trainer's (8).
@pytest.mark.parametrize("fits", [11, 12, 13, 14])
@pytest.mark.parametrize("start", [2, 8])
def test_a_gpt2_like_step_is_found_within_the_margin_in_six_calls_at_most(fits: int, start: int) -> None:
    step, measure, ran = _device(fits, base=0.5, fixed=1.533, per=1.683)
    search = _search(bounded(step, 4096, "the data"), measure, start, return_trials=True, **SEARCH_SETTINGS)
    assert 0.95 * fits <= search.batch_size <= fits, search.trials
    assert len(ran) <= 6 and search.step_calls == len(ran), search.trials  # every call, re-runs included
    assert max(ran) <= 2 * fits  # no first jump far past the answer
