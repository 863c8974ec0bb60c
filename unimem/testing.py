"""The conformance suite every backend keeps, public so third-party backends can run it.

Subclass ``BackendContract`` in a test module of your own, set the class attributes, and
run pytest::

    from unimem.testing import BackendContract

    class TestMyBackend(BackendContract):
        backend = "mine"                      # the name it is registered under
        module = "myframework"                # the framework's top-level module
        start = "import myframework\nmyframework.ones(4).sum()"  # its first device op
        starts_on_cpu = True                  # whether that starts its runtime on this host
        env_kwargs = {"growth": True}         # a configure() applied through env vars before import
        env_expect = {"MYFW_GROWTH": "1"}     # ...and the variables it sets
        late_kwargs = {"growth": False}       # a setting that is too late once started (or None)
        late_setting = "growth"

``BackendContract`` itself is not collected (its name does not start with ``Test``).
Process state matters (a framework reads its settings once), so the lifecycle runs in ONE
fresh interpreter per backend: configure before import, import, start, configure late,
query; each test asserts one part of what that run recorded. The backend's framework
must be installed: a missing one fails the suite rather than skipping it.

Each test names the capability-table features it is evidence for (``covers_features``);
the project's matrix generator turns them into ``backend:feature`` cells.

What a backend is (``unimem.backends.base.Backend``): a core every backend answers (identity,
``CAPABILITIES``, ``phase``, ``check``/``plan``, ``stats``, ``reset_peak``, ``clear_cache``,
``fragmentation``, ``device_uuid``), and one accessor per topic, each typed by a Protocol of
``unimem.backends.topics``: ``diagnose`` (``DiagnoseTopic``: OOM recognition, the report's
places, live arrays), ``observe`` (``ObserveTopic``: the monitor's counters, the profiler),
``precision`` (``PrecisionTopic``), ``savers`` (``SaversTopic``: ``remat``, ``offload``),
``accumulation`` (``AccumulationTopic``), ``search`` (``SearchTopic``: what ``find_batch_size``
asks), ``distributed`` (``DistributedTopic``: the rank's pin, the runtime's store) and
``workloads`` (``WorkloadsTopic``: ``unimem compare``). A topic the framework lacks keeps the
base's default, which answers "cannot" as the capability table's unsupported rows say; the
suite checks every topic has its protocol's members and refuses what the table refuses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import pytest

import unimem
from unimem import registry
from unimem.support import FEATURES, Level, Phase, Support, When

__all__ = ["FEATURE_KWARGS", "FIGURES", "BackendContract", "covers_features", "run_json"]

F = TypeVar("F", bound=Callable[..., Any])
RESULT_MARK = "@@UNIMEM-RESULT@@"


def covers_features(*features: str) -> Callable[[F], F]:
    """Mark a contract test as evidence for these capability-table features.

    The project's matrix generator reads the mark and turns it into ``backend:feature``
    cells of ``compat_matrix.md``.

    Args:
        *features: Feature names of ``unimem.support.FEATURES`` (``"reset_peak"``,
            ``"stats.peak"``, ...).

    Returns:
        A decorator that records the features on the test function (as
        ``unimem_features``) and returns it unchanged otherwise.

    Example:
        ```python
        class TestMyBackend(BackendContract):
            ...

            @covers_features("clear_cache")
            def test_clear_cache_gives_memory_back(self) -> None:
                ...
        ```
    """

    def mark(test: F) -> F:
        test.unimem_features = features  # type: ignore[attr-defined]
        return test

    return mark


_EMIT = f"""
import json as _json
def emit(obj):
    print({RESULT_MARK!r} + _json.dumps(obj, default=repr), flush=True)
"""


def run_json(code: str, timeout: float = 240) -> Any:
    """Run ``code`` (which calls ``emit(obj)`` once) in a fresh interpreter; return ``obj``.

    The child sees this interpreter's ``sys.path``, so it imports the same unimem and
    backends; ``UNIMEM_*`` and ``CUDA_VISIBLE_DEVICES`` are not passed on.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMEM_") and k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [sys.executable, "-c", _EMIT + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        pytest.fail(
            f"subprocess exited {proc.returncode} with {len(lines)} result line(s)\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}",
            pytrace=False,
        )
    return json.loads(lines[0][len(RESULT_MARK) :])


# Figures a framework cannot know on the CPU: every one must be None, never 0.
FIGURES = (
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
)

# configure() keyword arguments that exercise each configurable feature.
FEATURE_KWARGS: dict[str, dict[str, Any]] = {
    "fraction": {"fraction": 0.5},
    "limit": {"limit": "1GiB"},
    "growth": {"growth": True},
    "preallocate": {"growth": False},
    "allocator.default": {"allocator": "default"},
    "allocator.async": {"allocator": "async"},
    "allocator.expandable": {"allocator": "expandable"},
    "allocator.uncached": {"allocator": "uncached"},
    "devices": {"devices": [0]},
}

_LIFECYCLE = r"""
import importlib, os, sys, warnings
P = PARAMS
B, M = P["backend"], P["module"]
import unimem
from unimem import registry
adapter = registry.get_backend(B)
R = {}

def attempt(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn()
            res = {"ok": True, "type": type(out).__name__,
                   "value": out.as_dict() if hasattr(out, "as_dict") else out}
        except Exception as exc:
            res = {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                   "message": str(exc), "backend": getattr(exc, "backend", None),
                   "setting": getattr(exc, "setting", None), "parameter": getattr(exc, "parameter", None)}
    res["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
    return res

START_ENV = dict(os.environ)

def env():
    return {k: v for k, v in os.environ.items() if START_ENV.get(k) != v}

def snap(tag):
    R["phase_" + tag] = int(adapter.phase())
    R["loaded_" + tag] = M in sys.modules
    R["env_" + tag] = env()

snap("fresh")
R["stats_before_import"] = attempt(lambda: unimem.stats(B))
R["loaded_after_stats"] = M in sys.modules
R["first"] = attempt(lambda: unimem.configure(backend=B, **P["env_kwargs"]))
snap("configured")
R["again_before_import"] = attempt(lambda: unimem.configure(backend=B, **P["env_kwargs"]))
importlib.import_module(M)
snap("imported")
R["again_after_import"] = attempt(lambda: unimem.configure(backend=B, **P["env_kwargs"]))
exec(P["start"])
snap("started")
R["again_after_start"] = attempt(lambda: unimem.configure(backend=B, **P["env_kwargs"]))
if P["late_kwargs"] is not None:
    R["late"] = attempt(lambda: unimem.configure(backend=B, **P["late_kwargs"]))
    R["env_after_late"] = env()
    R["late_lenient"] = attempt(lambda: unimem.configure(backend=B, strict=False, **P["late_kwargs"]))
    R["env_after_late_lenient"] = env()
R["stats"] = attempt(lambda: unimem.stats(B))
R["stats_default_backend"] = attempt(lambda: unimem.stats())
R["reset_peak"] = attempt(lambda: unimem.reset_peak(B))
R["clear_cache"] = attempt(lambda: unimem.clear_cache(B))
R["summary"] = attempt(lambda: unimem.summary(B))
snap("end")
emit(R)
"""


def lifecycle_script(params: dict[str, Any]) -> str:
    return _LIFECYCLE.replace("PARAMS", repr(json.loads(json.dumps(params))))


def _all_none(stats: dict[str, Any]) -> list[str]:
    return [name for name in FIGURES if stats[name] is not None]


class BackendContract:
    """Tests every framework backend must pass. Subclasses set the class attributes.

    Not collected itself (its name does not start with ``Test``): subclass it in a test
    module of your own. The lifecycle (configure before import, import, start,
    configure late, query) runs in ONE fresh interpreter per backend, since a framework
    reads its settings once; each test asserts one part of what that run recorded. The
    backend's framework must be installed: a missing one fails the suite rather than
    skipping it.

    Attributes:
        backend (str): The name the backend is registered under.
        module (str): The framework's top-level module.
        start (str): Code (run after the import) that starts the framework: its first op.
        starts_on_cpu (bool): Whether that reaches ``Phase.INITIALIZED`` on this host
            (default True).
        env_kwargs (dict[str, Any]): ``configure()`` keyword arguments applied through
            environment variables before import.
        env_expect (dict[str, str]): The variables ``env_kwargs`` sets, with their values.
        late_kwargs (dict[str, Any] | None): A different setting that is too late once the
            framework started on the CPU; None (default) if none is.
        late_setting (str): The name of that setting (``"growth"``, ...).

    Example:
        ```python
        from unimem.testing import BackendContract

        class TestMyBackend(BackendContract):
            backend = "mine"
            module = "myframework"
            start = "import myframework; myframework.ones(4).sum()"
            starts_on_cpu = True
            env_kwargs = {"growth": True}
            env_expect = {"MYFW_GROWTH": "1"}
            late_kwargs = {"growth": False}
            late_setting = "growth"
        ```
    """

    backend: ClassVar[str]
    module: ClassVar[str]  # the framework's top-level module
    start: ClassVar[str]  # code (after import) that starts the framework: its first op
    starts_on_cpu: ClassVar[bool] = True  # whether that reaches Phase.INITIALIZED on the CPU
    # A setting applied through environment variables before import, and the variables it sets.
    env_kwargs: ClassVar[dict[str, Any]]
    env_expect: ClassVar[dict[str, str]]
    # A different setting that is too late once the framework started on the CPU (None: none is).
    late_kwargs: ClassVar[dict[str, Any] | None] = None
    late_setting: ClassVar[str] = ""

    _cache: ClassVar[dict[str, Any]] = {}

    @pytest.fixture(autouse=True)
    def _framework_present(self) -> None:
        if self.backend not in registry.available_backends():
            pytest.fail(f"{self.backend} is not installed here: the conformance suite tests an installed backend")

    @pytest.fixture
    def run(self) -> dict[str, Any]:
        """The recorded lifecycle run of this framework (one subprocess per class)."""
        key = self.backend
        if key not in BackendContract._cache:
            params = {
                "backend": self.backend,
                "module": self.module,
                "start": self.start,
                "env_kwargs": self.env_kwargs,
                "late_kwargs": self.late_kwargs,
            }
            BackendContract._cache[key] = run_json(lifecycle_script(params), timeout=240)
        return BackendContract._cache[key]

    # --- phases -----------------------------------------------------------------
    def test_phase_moves_forward_and_never_imports(self, run: dict[str, Any]) -> None:
        assert run["phase_fresh"] == Phase.NOT_IMPORTED
        assert run["loaded_fresh"] is False, "phase() imported the framework"
        assert run["loaded_configured"] is False, "configure() before import imported the framework"
        assert run["phase_configured"] == Phase.NOT_IMPORTED
        assert run["phase_imported"] == Phase.IMPORTED, "importing must not start the device runtime"
        expected = Phase.INITIALIZED if self.starts_on_cpu else Phase.IMPORTED
        assert run["phase_started"] == expected
        assert run["phase_end"] == expected, "a query moved the phase"

    # --- configure before import, then import and start --------------------------
    def test_configure_before_import_sets_env_and_is_pending(self, run: dict[str, Any]) -> None:
        first = run["first"]
        assert first["ok"], first
        actions = first["value"]["actions"]
        assert {a["method"] for a in actions} == {"env"}
        assert {a["status"] for a in actions} == {"pending"}
        assert sorted(a["target"] for a in actions) == sorted(f"{k}={v}" for k, v in self.env_expect.items())
        for var, value in self.env_expect.items():
            assert run["env_configured"].get(var) == value

    def test_settings_stay_visible_through_import_and_start(self, run: dict[str, Any]) -> None:
        for tag in ("imported", "started", "end"):
            for var, value in self.env_expect.items():
                assert run[f"env_{tag}"].get(var) == value, (tag, var)

    @pytest.mark.parametrize("when", ["before_import", "after_import", "after_start"])
    def test_same_settings_again_are_unchanged(self, run: dict[str, Any], when: str) -> None:
        again = run[f"again_{when}"]
        assert again["ok"], again
        statuses = [a["status"] for a in again["value"]["actions"]]
        assert statuses and set(statuses) == {"unchanged"}, again
        assert not again["warnings"]

    # --- too late -----------------------------------------------------------------
    def test_late_configure_raises_too_late(self, run: dict[str, Any]) -> None:
        assert self.late_kwargs is not None
        late = run["late"]
        assert not late["ok"], f"a late {self.late_kwargs} was accepted: {late}"
        assert late["type"] == "TooLateError"
        assert "RuntimeError" in late["mro"]
        assert late["backend"] == self.backend
        assert late["setting"] == self.late_setting
        assert self.late_setting in late["message"] and "restart" in late["message"]
        assert run["env_after_late"] == run["env_started"], "a refused setting changed the environment"

    def test_late_configure_lenient_warns_and_skips(self, run: dict[str, Any]) -> None:
        assert self.late_kwargs is not None
        lenient = run["late_lenient"]
        assert lenient["ok"], lenient
        actions = [a for a in lenient["value"]["actions"] if a["setting"] == self.late_setting]
        assert actions and {a["status"] for a in actions} == {"skipped"}
        assert all(a["note"].startswith("too late") for a in actions)
        assert any(cat == "UnimemWarning" and self.late_setting in msg for cat, msg in lenient["warnings"])
        assert run["env_after_late_lenient"] == run["env_started"]

    # --- queries on the CPU -----------------------------------------------------------
    @covers_features(
        "stats.allocated",
        "stats.reserved",
        "stats.peak",
        "stats.limit",
        "stats.num_allocs",
        "stats.device",
        "stats.process_used",
        "stats.largest_free_block",
    )
    @pytest.mark.parametrize("when", ["stats_before_import", "stats"])
    def test_stats_on_cpu_are_none_never_zero(self, run: dict[str, Any], when: str) -> None:
        result = run[when]
        assert result["ok"], result
        assert result["type"] == "MemoryStats"
        stats = result["value"]
        assert stats["backend"] == self.backend
        assert stats["device"] == 0
        assert _all_none(stats) == [], f"figures the CPU cannot know are not None: {stats}"
        assert stats["fragmentation"] is None
        assert run["loaded_after_stats"] is False, "stats() before import imported the framework"

    def test_stats_without_backend_picks_the_configured_one(self, run: dict[str, Any]) -> None:
        result = run["stats_default_backend"]
        assert result["ok"], result
        assert result["value"]["backend"] == self.backend

    @covers_features("reset_peak")
    def test_reset_peak_does_not_raise(self, run: dict[str, Any]) -> None:
        assert run["reset_peak"]["ok"], run["reset_peak"]
        assert run["reset_peak"]["value"] is None

    @covers_features("clear_cache")
    def test_clear_cache_returns_int_zero_on_cpu(self, run: dict[str, Any]) -> None:
        result = run["clear_cache"]
        assert result["ok"], result
        assert result["type"] == "int"
        assert result["value"] == 0

    def test_summary_names_backend_and_shows_na(self, run: dict[str, Any]) -> None:
        result = run["summary"]
        assert result["ok"], result
        text = result["value"]
        assert isinstance(text, str) and self.backend in text.splitlines()[0]
        assert "n/a" in text and "allocated" in text

    # --- capability table (data; read in this process) --------------------------------
    def test_capabilities_have_every_feature(self) -> None:
        caps = unimem.capabilities(self.backend)
        assert set(caps) == set(FEATURES)
        for feature, support in caps.items():
            assert isinstance(support, Support), feature
            assert isinstance(support.level, Level) and isinstance(support.when, When), feature
            if support.supported:
                assert support.api, f"{feature}: a supported feature names its API or variable"
            else:
                assert support.note, f"{feature}: an unsupported feature says why"
        assert self.module not in sys.modules

    def test_unsupported_allocators_are_refused_and_supported_ones_accepted(self) -> None:
        caps = unimem.capabilities(self.backend)
        for allocator in ("default", "async", "expandable", "uncached"):
            supported = caps[f"allocator.{allocator}"].supported
            try:
                applied = unimem.configure(backend=self.backend, allocator=allocator)
            except unimem.UnsupportedFeature as exc:
                assert not supported, f"capabilities say {allocator} works but configure refused: {exc}"
                assert exc.backend == self.backend and exc.feature == "allocator"
            else:
                assert supported, f"capabilities say {allocator} is unsupported but configure took it"
                assert applied.get(self.backend, "allocator")

    def test_env_variables_configure_sets_are_the_ones_the_table_names(self) -> None:
        caps = unimem.capabilities(self.backend)
        checked = 0
        clean = dict(os.environ)
        for feature, kwargs in FEATURE_KWARGS.items():
            if caps[feature].level is not Level.ENV:
                continue
            os.environ.clear()
            os.environ.update(clean)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", unimem.UnimemWarning)
                applied = unimem.configure(backend=self.backend, strict=False, **kwargs)
            for action in applied:
                if action.method == "env" and action.status == "pending":
                    var = action.target.split("=")[0].removeprefix("unset ")
                    assert var in caps[feature].api, f"{feature}: sets {var}, table says {caps[feature].api!r}"
                    checked += 1
                elif action.status == "skipped":
                    assert action.note, f"{feature}: skipped without a note"
        assert checked, "no env-level feature set any variable"

    # --- topics (read in this process; none imports the framework) ---------------------
    def test_every_topic_has_its_protocols_members(self) -> None:
        adapter = registry.get_backend(self.backend)
        for topic, names in registry.topic_members().items():
            found = getattr(adapter, topic)
            missing = [name for name in names if not hasattr(found, name)]
            assert not missing, f"{self.backend}.{topic} lacks {missing} (unimem.backends.topics)"
        assert self.module not in sys.modules, "making a topic imported the framework"

    def test_topics_refuse_what_the_capability_table_calls_unsupported(self) -> None:
        caps = unimem.capabilities(self.backend)
        adapter = registry.get_backend(self.backend)
        for policy in ("full", "matmuls", "offload"):
            if not caps[f"remat.{policy}"].supported:
                with pytest.raises(unimem.UnsupportedFeature) as info:
                    adapter.savers.remat(lambda: None, policy)
                assert info.value.backend == self.backend and info.value.feature == f"remat.{policy}"
        if not caps["accumulate"].supported:
            with pytest.raises(unimem.UnsupportedFeature):
                adapter.accumulation.add_gradients(None, 1.0, 1.0)
        if not any(caps[f"precision.{p}"].supported for p in ("bf16", "fp16")):
            with pytest.raises(unimem.UnsupportedFeature):
                adapter.precision.device()
        if not caps["ranks.cluster"].supported:
            assert adapter.distributed.distributed_store() is None
        assert self.module not in sys.modules

    def test_strict_must_be_a_bool(self) -> None:
        with pytest.raises(unimem.ConfigError) as info:
            unimem.configure(backend=self.backend, growth=True, strict="no")  # type: ignore[arg-type]
        assert info.value.parameter == "strict"
