"""The drop-in for accelerate's ``find_executable_batch_size``: the rule placing each next size (in this
process: it imports no framework), and the decorator against accelerate's own on the same simulated
training loop (a fresh process: accelerate imports torch)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainers import need_package

from unimem.integrations.descent import Attempt, message_figures, next_size

MiB = 1 << 20
# torch's message for a CUDA out-of-memory error, as torch 2.x writes it.
TORCH_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 2.56 MiB "
    "is free. Including non-PyTorch memory, this process has 79.14 GiB memory in use. Of the allocated memory "
    "78.52 GiB is allocated by PyTorch, and 142.38 MiB is reserved by PyTorch but unallocated."
)


def test_the_message_says_what_was_in_use_and_what_the_process_could_hold() -> None:
    in_use, capacity = message_figures(TORCH_MESSAGE)
    assert in_use == int(78.52 * 1024**3)
    assert capacity == in_use + int(142.38 * MiB) + int(2.56 * MiB)
    assert message_figures("CUDA out of memory. Tried to allocate 2.00 GiB.") == (None, None)
    assert message_figures(
        "Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."
    ) == (0, None)


def _message(allocated: str, free: str, *, total: str = "40.00 GiB", process: str = "", allowed: str = "") -> str:
    """torch's CUDA out-of-memory message with the given figures (``process``/``allowed``: left out when empty)."""
    return (
        f"CUDA out of memory. Tried to allocate 14.00 GiB. GPU 0 has a total capacity of {total} of which {free} is "
        "free. "
        + (f"Including non-PyTorch memory, this process has {process} memory in use. " if process else "")
        + (f"{allowed} allowed; " if allowed else "")
        + f"Of the allocated memory {allocated} is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
        "unallocated."
    )


# Each message states figures that cannot all be true.
IMPOSSIBLE = {
    "more allocated than the device holds": _message("50.00 GiB", "5.50 GiB"),
    "more free than the device holds": _message("1.00 GiB", "41.00 GiB"),
    "the pool above the process's bytes": _message("30.00 GiB", "5.50 GiB", process="20.00 GiB"),
    "the process's bytes above the device": _message("30.00 GiB", "5.50 GiB", process="17179869184.00 GiB"),
    "the pool above the cap": _message("30.00 GiB", "5.50 GiB", allowed="20.00 GiB"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_a_message_whose_figures_cannot_all_be_true_bounds_nothing(case: str) -> None:
    assert message_figures(IMPOSSIBLE[case]) == (None, None)
    # torch's rounding to two decimals is no contradiction: 79.14 GiB in use + 2.56 MiB free within 79.15 GiB.
    assert message_figures(TORCH_MESSAGE)[1] is not None
    assert message_figures(_message("30.00 GiB", "5.50 GiB", process="30.50 GiB", allowed="36.00 GiB")) == (
        30 << 30,
        int(35.5 * (1 << 30)),
    )


def test_a_failure_bounds_the_size_by_its_bytes_per_sample() -> None:
    # 100 samples needed at least 1000 bytes above a 100-byte baseline: 10 a sample at least; 500 bytes are left.
    failed = Attempt(100, "oom", needed=1100, capacity=600, baseline=100)
    assert failed.largest_possible == 50
    assert next_size(failed, accelerate_next=90) == 50
    # Figures that do not show the call over the capacity bound nothing: accelerate's step.
    assert Attempt(100, "oom", needed=500, capacity=600).largest_possible is None
    assert next_size(Attempt(100, "oom"), accelerate_next=90) == 90
    # Never at or above the failed size, never below 0.
    assert next_size(Attempt(5, "oom"), accelerate_next=5) == 4
    assert next_size(Attempt(1, "oom", needed=10, capacity=1), accelerate_next=0) == 0


@settings(max_examples=10, deadline=None)
@given(
    fixed=st.integers(0, 500),
    per_sample=st.integers(1, 50),
    size=st.integers(2, 4000),
    share=st.floats(0.01, 1.0),
)
def test_the_bound_never_passes_the_largest_size_that_fits(
    fixed: int, per_sample: int, size: int, share: float
) -> None:
    """A call that needs ``fixed + per_sample × n`` above the baseline fails part-way, at any point past the
    capacity: the size placed after it is never below the largest that fits."""
    capacity, baseline = 10_000, 300
    largest = (capacity - baseline - fixed) // per_sample
    if size <= largest or largest < 1:
        return
    whole = fixed + per_sample * size
    in_use = baseline + int((capacity - baseline) * 0.999)
    asked = max(1, int(share * (baseline + whole - in_use)))
    failed = Attempt(size, "oom", needed=in_use + asked, capacity=capacity, baseline=baseline)
    assert next_size(failed, accelerate_next=int(size * 0.9)) >= min(largest, int(size * 0.9))


COMPARE = """
    import torch
    from accelerate.utils import find_executable_batch_size as accelerates
    from unimem.integrations.accelerate import find_executable_batch_size as unimems

    MiB = 1 << 20

    def mib(count):
        return f"{{count / MiB:.2f}} MiB"

    def loop(calls, per_sample, logits_share, capacity=1000 * MiB, fixed=100 * MiB, layers=12):
        '''A training loop on a simulated device: the model (fixed bytes), then per layer its activations,
        then the logits; the first allocation past the capacity fails as torch's does.'''
        def train(batch_size, tag="ran"):
            calls.append(batch_size)
            layer = int(per_sample * (1 - logits_share) / layers * batch_size)
            used = 0
            for size in [fixed] + [layer] * layers + [int(per_sample * logits_share * batch_size)]:
                if used + size > capacity:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {{mib(size)}}. GPU 0 has a total capacity of "
                        f"{{mib(capacity)}} of which {{mib(capacity - used)}} is free. Of the allocated memory "
                        f"{{mib(used)}} is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."
                    )
                used += size
            return (tag, batch_size)
        return train

    cases = {{}}
    for name, start, per_sample, logits_share in {cases!r}:
        for finder_name, finder in (("accelerate", accelerates), ("unimem", unimems)):
            calls = []
            train = finder(loop(calls, per_sample * MiB, logits_share), starting_batch_size=start)
            result = train(tag="done")
            cases.setdefault(name, {{}})[finder_name] = {{"result": result, "calls": len(calls)}}

    # accelerate's behaviour, kept.
    calls = []
    train = unimems(loop(calls, 30 * MiB, 0.3), starting_batch_size=128)
    first = train()
    kept_from = len(calls)
    second = train()
    behaviour = {{"kept": [first, second, calls[kept_from:]], "attempts": [a.batch_size for a in train.attempts]}}

    def step(batch_size):
        return batch_size
    for finder_name, finder in (("accelerate", accelerates), ("unimem", unimems)):
        try:
            finder(step, starting_batch_size=8)(64)  # the batch size passed by hand
        except TypeError as exc:
            behaviour[finder_name + " type_error"] = str(exc)

    def broken(batch_size):
        calls.append(batch_size)
        raise ValueError("not memory")
    calls = []
    try:
        unimems(broken, starting_batch_size=8)()
    except ValueError:
        behaviour["other_error_calls"] = list(calls)

    sizes = iter([7, 3])
    calls = []
    chosen = unimems(loop(calls, 300 * MiB, 0.3), starting_batch_size=16, reduce_batch_size_fn=lambda: next(sizes))
    behaviour["custom"] = [chosen(), list(calls)]

    calls = []
    try:
        unimems(loop(calls, 2000 * MiB, 0.3), starting_batch_size=4)()
    except RuntimeError as exc:
        behaviour["zero"] = [str(exc), list(calls)]

    @unimems
    def default(batch_size):
        return batch_size
    behaviour["bare_decorator"] = default()

    # Figures that cannot all be true (50 GiB allocated on a 40 GiB device) must not bring the size below
    # accelerate's: sizes up to 57 fit, and the figures, believed, would say no more than 55 can.
    impossible = {{}}
    for finder_name, finder in (("accelerate", accelerates), ("unimem", unimems)):
        calls = []
        def impossible_loop(batch_size):
            calls.append(batch_size)
            if batch_size > 57:
                raise torch.OutOfMemoryError({impossible!r})
            return batch_size
        impossible[finder_name] = [finder(impossible_loop, starting_batch_size=64)(), list(calls)]
    behaviour["impossible"] = impossible
    emit({{"cases": cases, "behaviour": behaviour}})
"""

# (name, starting size, MiB a sample, share of a sample's bytes in the last allocation, the logits)
CASES = [
    ("far above, large logits", 1024, 30, 0.3),
    ("far above, small logits", 128, 30, 0.05),
    ("just above", 128, 8, 0.3),
    ("many small samples", 512, 3, 0.5),
    ("fits at once", 64, 9, 0.0),
]


@pytest.fixture(scope="module")
def compared(pyjson: Any) -> Any:
    need_package("accelerate")
    impossible = IMPOSSIBLE["more allocated than the device holds"]
    return pyjson(COMPARE.format(cases=CASES, impossible=impossible), timeout=300)


@pytest.mark.slow
def test_answers_at_least_accelerates_in_no_more_calls(compared: Any) -> None:
    fewer = 0
    for name, _, per_sample, _ in CASES:
        ours, theirs = compared["cases"][name]["unimem"], compared["cases"][name]["accelerate"]
        largest = 900 // per_sample
        assert ours["result"][0] == "done"  # the function's own result comes back
        assert theirs["result"][1] <= ours["result"][1] <= largest, name
        assert ours["calls"] <= theirs["calls"], name
        fewer += ours["calls"] < theirs["calls"]
    # Where the failing allocation is large (a language model's logits) the figures cut the descent short.
    assert compared["cases"]["far above, large logits"]["unimem"]["result"][1] == 30
    assert fewer >= 2


@pytest.mark.slow
def test_keeps_accelerates_behaviour(compared: Any) -> None:
    behaviour = compared["behaviour"]
    first, second, second_calls = behaviour["kept"]
    assert second == first and second_calls == [first[1]]  # the next call starts at the size that ran
    assert behaviour["attempts"][-2:] == [first[1], first[1]]
    assert behaviour["unimem type_error"] == behaviour["accelerate type_error"]
    assert "Batch size was passed into `step`" in behaviour["unimem type_error"]
    assert behaviour["other_error_calls"] == [8]  # not an out-of-memory error: raised at once, no retry
    assert behaviour["custom"] == [["ran", 3], [16, 7, 3]]  # reduce_batch_size_fn chooses, as in accelerate
    assert behaviour["zero"][0] == "No executable batch size found, reached zero."
    assert behaviour["zero"][1][0] == 4 and len(behaviour["zero"][1]) <= 4
    assert behaviour["bare_decorator"] == 128  # accelerate's default starting size


@pytest.mark.slow
def test_figures_that_cannot_be_true_never_bring_the_answer_below_accelerates(compared: Any) -> None:
    impossible = compared["behaviour"]["impossible"]
    assert impossible["accelerate"] == [57, [64, 57]]
    assert impossible["unimem"] == impossible["accelerate"]  # accelerate's step, not the figures' 55
