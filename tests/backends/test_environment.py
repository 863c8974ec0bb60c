"""The frameworks' own variables, as configure finds them in the environment: a value the
framework would refuse when it starts, or read other than it says, is refused before anything
changes (naming the variable); a user's value that configure replaces is said in ``Applied``.

The frameworks are never imported here: each case configures before the import, the moment
the variables count."""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import run_json

import unimem

# (variable, bad value, backend, a setting that leaves the variable as it is)
BAD = [
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "garbage", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "nan", "jax", {"allocator": "async"}),
    ("XLA_CLIENT_MEM_FRACTION", "half", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "garbage", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "", "jax", {"fraction": 0.5}),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "no", "jax", {"fraction": 0.5}),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "FALSE", "jax", {"allocator": "async"}),
    ("PYTORCH_CUDA_ALLOC_CONF", "garbage", "torch", {"allocator": "expandable"}),
    ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:abc", "torch", {"allocator": "expandable"}),
    ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:10", "torch", {"growth": True}),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:true", "torch", {"fraction": 0.5}),
    ("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:1.5", "torch", {"fraction": 0.5}),
    ("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:3", "torch", {"fraction": 0.5}),
    ("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:[256:3]", "torch", {"fraction": 0.5}),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMalloc", "torch", {"fraction": 0.5}),
    ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:100,,", "torch", {"allocator": "async"}),
    ("PYTORCH_CUDA_ALLOC_CONF", "pinned_num_register_threads:256", "torch", {"fraction": 0.5}),
    ("PYTORCH_ALLOC_CONF", "expandable_segments", "torch", {"allocator": "expandable"}),
    ("PYTORCH_ALLOC_CONF", "a:b:c", "torch", {"fraction": 0.5}),
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "0", "torch", {"fraction": 0.5}),
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "yes", "torch", {"growth": True}),
    ("TF_FORCE_GPU_ALLOW_GROWTH", "True", "tensorflow", {"allocator": "async"}),
    ("TF_FORCE_GPU_ALLOW_GROWTH", "1", "tensorflow", {"allocator": "async"}),
    ("TF_GPU_ALLOCATOR", "cuda_async", "tensorflow", {"growth": True}),
    ("TF_GPU_ALLOCATOR", "bfc", "tensorflow", {"growth": True}),
    ("CUPY_GPU_MEMORY_LIMIT", "lots", "cupy", {"growth": True}),
    ("CUPY_GPU_MEMORY_LIMIT", "150%", "cupy", {"growth": True}),
    ("CUPY_GPU_MEMORY_LIMIT", "-1", "cupy", {"growth": True}),
    ("CUPY_GPU_MEMORY_LIMIT", "nan%", "cupy", {"growth": True}),
    ("CUDA_VISIBLE_DEVICES", "0,x,1", "torch", {"devices": [0]}),
    ("CUDA_VISIBLE_DEVICES", "0,-1,1", "jax", {"devices": [0]}),
    ("CUDA_VISIBLE_DEVICES", "1,1", "tensorflow", {"devices": [0]}),
]


@pytest.mark.parametrize(("var", "value", "backend", "setting"), BAD)
def test_a_bad_framework_variable_is_refused_before_anything_changes(
    var: str, value: str, backend: str, setting: dict[str, Any]
) -> None:
    os.environ[var] = value
    before = dict(os.environ)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend, **setting)
    assert info.value.parameter == var and repr(value) in str(info.value), str(info.value)
    assert dict(os.environ) == before


# (variable, the user's value, backend, the setting that replaces it)
REPLACED = [
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "no", "jax", {"growth": True}),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "garbage", "jax", {"allocator": "async"}),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", "torch", {"allocator": "expandable"}),
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "0", "torch", {"allocator": "default"}),
    ("TF_FORCE_GPU_ALLOW_GROWTH", "True", "tensorflow", {"growth": True}),
    ("TF_GPU_ALLOCATOR", "cuda_malloc", "tensorflow", {"allocator": "async"}),
    ("CUPY_GPU_MEMORY_LIMIT", "lots", "cupy", {"limit": "1GiB"}),
    ("CUDA_VISIBLE_DEVICES", "3,5", "jax", {"devices": [1]}),
]


@pytest.mark.parametrize(("var", "value", "backend", "setting"), REPLACED)
def test_a_users_value_that_configure_replaces_is_said_in_applied(
    var: str, value: str, backend: str, setting: dict[str, Any]
) -> None:
    os.environ[var] = value
    applied = unimem.configure(backend, **setting)
    said = [a for a in applied if f"replaces {var}={value!r} from the environment" in a.note]
    assert said and os.environ.get(var) != value, str(applied)
    assert f"replaces {var}={value!r}" in str(applied)


def test_a_value_unimem_wrote_itself_is_not_called_the_users() -> None:
    unimem.configure("jax", growth=True)
    applied = unimem.configure("jax", growth=False)
    assert not any("from the environment" in a.note for a in applied), str(applied)


@pytest.mark.parametrize(
    ("var", "value", "backend", "setting"),
    [
        ("XLA_PYTHON_CLIENT_ALLOCATOR", "Platform", "jax", {"growth": True}),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "False", "jax", {"allocator": "async"}),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5", "jax", {"growth": True}),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, roundup_power2_divisions:[256:4,>:1]", "torch", {}),
        ("PYTORCH_ALLOC_CONF", "expandable_segments:True,some_newer_key:7", "torch", {}),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", "torch", {}),
        ("TF_FORCE_GPU_ALLOW_GROWTH", "false", "tensorflow", {"limit": "1GiB"}),
        ("TF_GPU_ALLOCATOR", "cuda_malloc_async", "tensorflow", {"limit": "1GiB"}),
        ("CUPY_GPU_MEMORY_LIMIT", "25%", "cupy", {}),
        ("CUPY_GPU_MEMORY_LIMIT", "1073741824", "cupy", {}),
        ("CUDA_VISIBLE_DEVICES", "GPU-aaaa,1,-1", "torch", {}),
    ],
)
def test_good_values_pass(var: str, value: str, backend: str, setting: dict[str, Any]) -> None:
    # A key unimem does not know passes: torch names an unknown key itself when CUDA starts.
    os.environ[var] = value
    unimem.configure(backend, **(setting or {"growth": True}))
    assert os.environ[var] == value


# The values each framework's own parser is asked about, in a fresh process that imports it.
_AGREE = """
import os, sys
import unimem
from unimem.backends.jax import configure as jax_configure
from unimem.backends.torch import configure as torch_configure

def unimem_refuses(check, var, value):
    os.environ[var] = value
    try:
        check(set())
        return False
    except unimem.ConfigError:
        return True
    finally:
        del os.environ[var]

verdicts = []
if sys.argv[1] == "torch":
    import torch  # its common allocator keys are parsed on the CPU too
    for value in CONF:
        try:
            torch._C._accelerator_setAllocatorSettings(value)
            refused = False
        except (RuntimeError, ValueError):
            refused = True
        ours = unimem_refuses(torch_configure.check_environment, "PYTORCH_ALLOC_CONF", value)
        verdicts.append([value, refused, ours])
else:
    from jaxlib import xla_client  # what jaxlib reads when a GPU backend starts
    for var, value in XLA:
        os.environ[var] = value
        try:
            xla_client.generate_pjrt_gpu_plugin_options()
            refused = False
        except ValueError:
            refused = True
        del os.environ[var]
        verdicts.append([value, refused, unimem_refuses(jax_configure.check_environment, var, value)])
emit(verdicts)
"""
_CONF = [
    "garbage",
    "max_split_size_mb:abc",
    "max_split_size_mb:10",
    "max_split_size_mb:100",
    "expandable_segments:true",
    "expandable_segments:True",
    "garbage_collection_threshold:1.5",
    "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:4,>:1]",
    "max_split_size_mb:100,,",
    "a",
]
_XLA = [
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "garbage"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", ""),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "Platform"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "garbage"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"),
]


@pytest.mark.parametrize("framework", [pytest.param("torch", marks=pytest.mark.slow), "jax"])
def test_unimem_refuses_what_the_frameworks_own_parser_refuses(framework: str) -> None:
    # torch's CPU build parses the allocator keys every device shares; jaxlib builds its GPU options anywhere.
    code = f"CONF = {_CONF!r}\nXLA = {_XLA!r}\n" + _AGREE
    verdicts = run_json(f"import sys; sys.argv[1:] = [{framework!r}]\n" + code, timeout=240)
    assert verdicts and all(theirs == ours for _, theirs, ours in verdicts), verdicts


@pytest.mark.slow
def test_tensorflows_growth_variable_that_would_override_the_api_call_is_refused() -> None:
    # TensorFlow reads TF_FORCE_GPU_ALLOW_GROWTH before set_memory_growth when its GPUs start.
    code = """
    import os
    import tensorflow as tf
    import unimem
    tf.config.list_physical_devices = lambda kind=None: ["GPU:0"] if kind == "GPU" else []  # as on a GPU host
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "false"
    try:
        unimem.configure("tensorflow", growth=True)
        emit(None)
    except unimem.ConfigError as exc:
        emit([exc.parameter, str(exc)])
    """
    parameter, message = run_json(code, timeout=240)
    assert parameter == "TF_FORCE_GPU_ALLOW_GROWTH" and "overrides set_memory_growth(True)" in message
