"""MemoryStats (the one set of field names), its fragmentation figure, and how results print."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import unimem
from unimem import Action, Applied, MemoryStats, format_bytes

DESIGN_FIELDS = [
    "backend",
    "device",
    "allocated",
    "reserved",
    "peak_allocated",
    "peak_reserved",
    "limit",
    "largest_free_block",
    "num_allocs",
    "num_ooms",
    "device_total",
    "device_free",
    "process_used",
    "host_rss",
    "timestamp",
]
MIB = 1 << 20


def test_fields_are_exactly_the_designs():
    assert dataclasses.is_dataclass(MemoryStats)
    assert [f.name for f in dataclasses.fields(MemoryStats)] == DESIGN_FIELDS


def test_is_frozen():
    snapshot = MemoryStats("torch", 0, allocated=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.allocated = 2  # type: ignore[misc]


def test_constructor_takes_every_field_in_order_and_keeps_dataclass_behaviour():
    # MemoryStats writes its own __init__ (the generated frozen one is slow): a field added
    # to the class but not to __init__ would be missing from every snapshot.
    import inspect

    assert list(inspect.signature(MemoryStats).parameters) == DESIGN_FIELDS
    values = {name: i for i, name in enumerate(DESIGN_FIELDS[2:], start=2)}
    by_name = MemoryStats("torch", 1, **values)
    by_position = MemoryStats("torch", 1, *values.values())
    assert by_name == by_position and hash(by_name) == hash(by_position)
    assert vars(by_name) == {"backend": "torch", "device": 1, **values}
    changed = dataclasses.replace(by_name, allocated=99)
    assert changed.allocated == 99 and changed.timestamp == by_name.timestamp and by_name.allocated == 2
    assert MemoryStats("torch", 0, timestamp=5.0).timestamp == 5.0


def test_unknown_figures_default_to_none_not_zero():
    snapshot = MemoryStats("jax", 1)
    assert all(getattr(snapshot, name) is None for name in DESIGN_FIELDS[2:-1])
    assert isinstance(snapshot.timestamp, float) and snapshot.timestamp > 0


@pytest.mark.parametrize(
    ("allocated", "reserved", "largest", "expected"),
    [
        (100 * MIB, 200 * MIB, 100 * MIB, 0.0),  # all free pool memory is one block
        (100 * MIB, 200 * MIB, 25 * MIB, 0.75),
        (0, 400 * MIB, 100 * MIB, 0.75),
        (200 * MIB, 200 * MIB, 0, 0.0),  # nothing free in the pool: nothing fragmented
        (300 * MIB, 200 * MIB, 0, 0.0),  # inconsistent figures never give a negative share
        (100 * MIB, 200 * MIB, 500 * MIB, 0.0),  # a block bigger than the free bytes clamps at 0
    ],
)
def test_fragmentation(allocated, reserved, largest, expected):
    snapshot = MemoryStats("jax", 0, allocated=allocated, reserved=reserved, largest_free_block=largest)
    assert snapshot.fragmentation == pytest.approx(expected)


@pytest.mark.parametrize(
    "known",
    [
        {"allocated": 1, "reserved": 2},
        {"allocated": 1, "largest_free_block": 1},
        {"reserved": 2, "largest_free_block": 1},
        {},
    ],
)
def test_fragmentation_is_none_when_a_figure_is_unknown(known):
    assert MemoryStats("torch", 0, **known).fragmentation is None


figure = st.none() | st.integers(0, 1 << 45)


@given(allocated=figure, reserved=figure, largest=figure)
def test_fragmentation_is_a_share_or_none(allocated, reserved, largest):
    value = MemoryStats("jax", 0, allocated=allocated, reserved=reserved, largest_free_block=largest).fragmentation
    if None in (allocated, reserved, largest):
        assert value is None
    else:
        assert value is not None and 0.0 <= value <= 1.0


def test_as_dict_is_json_ready_and_has_fragmentation():
    snapshot = MemoryStats(
        "jax", 0, allocated=100 * MIB, reserved=200 * MIB, largest_free_block=25 * MIB, device_total=8 << 30
    )
    data = snapshot.as_dict()
    assert list(data) == [*DESIGN_FIELDS, "fragmentation"]
    assert data["fragmentation"] == pytest.approx(0.75)
    assert data["peak_allocated"] is None
    assert json.loads(json.dumps(data)) == data


def test_as_dict_keeps_none_as_null():
    text = json.dumps(MemoryStats("tensorflow", 0).as_dict())
    assert json.loads(text)["allocated"] is None
    assert '"allocated": null' in text


def test_summary_shows_na_for_unknown_and_sizes_for_known():
    unimem.configure(backend="jax", growth=True)
    text = unimem.summary("jax")
    assert isinstance(text, str)
    lines = text.splitlines()
    assert "jax" in lines[0] and "device 0" in lines[0]
    rows = {line.split("  ")[0].strip(): line.rsplit("  ", 1)[-1].strip() for line in lines[2:]}
    assert rows["allocated"] == "n/a"
    assert rows["fragmentation"] == "n/a"
    assert rows["device total"] == "n/a"


def test_rows_format_known_figures():
    rows = dict(MemoryStats("torch", 0, allocated=1536 * MIB, num_allocs=7, num_ooms=0).rows())
    assert rows["allocated"] == "1.50 GiB"
    assert rows["allocations"] == "7"
    assert rows["OOMs"] == "0", "a known zero is a zero, not n/a"
    assert rows["reserved"] == "n/a"


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536 * MIB, "1.50 GiB"), (-2048, "-2.00 KiB")]
    + [(1 << 58, "256.00 PiB"), (3 << 60, "3.00 EiB"), (1 << 70, "1024.00 EiB")],
)
def test_format_bytes(value, text):
    assert format_bytes(value) == text


# --- Applied -------------------------------------------------------------------------------------


def test_applied_str_lists_backend_setting_status_and_how():
    applied = Applied(
        (
            Action("jax", "fraction", 0.3, "env", "XLA_CLIENT_MEM_FRACTION=0.3", "pending"),
            Action("torch", "fraction", 0.5, "api", "torch.cuda.set_per_process_memory_fraction", "skipped", "no GPU"),
        ),
        ("jax", "torch"),
    )
    text = str(applied)
    lines = text.splitlines()
    assert len(lines) == 3
    for word in ("backend", "setting", "value", "status", "how"):
        assert word in lines[0]
    assert all(w in lines[1] for w in ("jax", "fraction", "0.3", "pending", "env: XLA_CLIENT_MEM_FRACTION=0.3"))
    assert all(w in lines[2] for w in ("torch", "skipped", "api: torch.cuda.set_per_process_memory_fraction"))
    assert "(no GPU)" in lines[2]
    # Columns line up: each row's status starts where the header's does.
    assert lines[1].index("pending") == lines[0].index("status") == lines[2].index("skipped")


def test_applied_from_configure_prints_the_exact_variable():
    text = str(unimem.configure(backend="tf", growth=True))
    assert "tensorflow" in text and "growth" in text and "pending" in text
    assert "env: TF_FORCE_GPU_ALLOW_GROWTH=true" in text


def test_applied_with_nothing_to_change_says_so():
    text = str(Applied((), ("jax",)))
    assert "jax" in text and "nothing to change" in text


def test_applied_accessors():
    with pytest.warns(unimem.UnimemWarning, match="expandable"):
        applied = unimem.configure(backend="jax", growth=True, allocator="expandable", strict=False)
    assert [a.setting for a in applied.pending] == ["growth"]
    assert [a.setting for a in applied.skipped] == ["allocator"]
    assert applied.get("jax", "growth") == applied.pending
    assert applied.for_backend("torch") == []
    assert len(applied) == 2 and list(applied) == list(applied.actions)
    assert json.loads(json.dumps(applied.as_dict()))["backends"] == ["jax"]
