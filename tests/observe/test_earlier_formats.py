"""Every format unimem ever wrote loads: one file per format, each written by the version that wrote
it (``fixtures/earlier``, whose README names the commits)."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

import pytest

from unimem.observe.recording import Recording, load_recording

EARLIER = Path(__file__).resolve().parent / "fixtures" / "earlier"
sys.path.insert(0, str(EARLIER))
from write import run  # noqa: E402  (the run every saved fixture holds, as today's types)

SAVED = sorted(path.name for path in EARLIER.iterdir() if path.suffix in (".csv", ".json"))
LACKING = {"2ede7a2": {"host_peak"}}  # fields the version that wrote the file did not have yet


def _loaded(path: Path) -> Recording:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole file: no "cut short" warning, nothing else either
        return load_recording(path)


def test_every_format_has_its_file() -> None:
    assert SAVED == [
        "0bb88f9.json",
        "2ede7a2.csv",
        "2ede7a2.json",
        "61d827c.csv",
        "61d827c.json",
        "be323f6.csv",
        "be323f6.json",
        "f84631c.csv",
    ]
    assert (EARLIER / "7004c77.jsonl").is_file()


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_recording_of_any_earlier_version_loads_whole(name: str) -> None:
    loaded = _loaded(EARLIER / name)
    written = run()
    lacking = LACKING.get(name.split(".")[0], set())
    expected = [dataclasses.replace(s, **dict.fromkeys(lacking)) for s in written.samples]
    assert loaded.samples == expected
    assert loaded.marks == written.marks
    if name == "2ede7a2.csv":  # the first CSVs kept no metadata
        assert loaded.meta == {}
    else:
        assert loaded.meta == written.meta


def test_a_stream_of_the_first_streaming_version_loads_whole() -> None:
    loaded = _loaded(EARLIER / "7004c77.jsonl")
    assert [m.label for m in loaded.marks] == ["epoch 1", 'say "hi", then go', "ünïcode ✓"]
    assert len(loaded.samples) >= 10 and {s.source for s in loaded.samples} == {"device"}
    assert all(s.host_rss for s in loaded.samples)
    assert loaded.meta["stopped"] > loaded.meta["started"] and loaded.meta["max_samples"] == 20000
