"""What holds memory in this process: the largest live tensors and arrays per framework.

Read at an out-of-memory failure, while the failed step's frames are still alive.
One pass over ``gc.get_objects()`` finds torch tensors and TensorFlow tensors and
variables (a fraction of a second for a million objects); JAX lists its own live
arrays. Only the ``top`` largest are kept, as descriptions: the report must not keep
a tensor alive.

Python sees only tensors that have a Python object: autograd's saved activations and
gradients that were never read from Python live in C++ and are missing here, which is
why the report compares what it found with the allocator's ``allocated``.
"""

from __future__ import annotations

import gc
import heapq
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from .sizes import format_bytes

__all__ = ["LiveMemory", "LiveObject", "scan"]


@dataclass(frozen=True)
class LiveObject:
    """One live tensor, array or variable, described (not referenced)."""

    framework: str
    kind: str  # "tensor", "parameter", "gradient", "array", "variable"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    device: str

    def __str__(self) -> str:
        shape = ", ".join(str(d) for d in self.shape)
        return f"{format_bytes(self.nbytes):>10}  {self.kind} {self.dtype}[{shape}] on {self.device}"


@dataclass(frozen=True)
class LiveMemory:
    """The live tensors of one framework on the failing device: counts and the largest."""

    framework: str
    device: str | None  # the device looked at; None: every device
    count: int
    total_bytes: int
    largest: tuple[LiveObject, ...]
    method: str  # how they were found


def _keep(heap: list[tuple[int, int, LiveObject]], item: LiveObject, top: int) -> None:
    entry = (item.nbytes, id(item), item)
    if len(heap) < top:
        heapq.heappush(heap, entry)
    elif top and entry[0] > heap[0][0]:
        heapq.heapreplace(heap, entry)


def _result(framework: str, device: str | None, count: int, total: int, heap: list[Any], method: str) -> LiveMemory:
    largest = tuple(item for _, _, item in sorted(heap, key=lambda entry: -entry[0]))
    return LiveMemory(framework, device, count, total, largest, method)


def _torch_device_matches(tensor: Any, place: str | None) -> bool:
    if place is None:
        return True
    device = tensor.device
    kind, _, index = place.partition(":")
    if device.type != kind:
        return False
    return not index or device.index is None or device.index == int(index)


def _scan_torch(objects: list[Any], place: str | None, top: int) -> LiveMemory | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor_type, parameter_type = torch.Tensor, torch.nn.Parameter
    seen: set[tuple[str, int]] = set()
    heap: list[tuple[int, int, LiveObject]] = []
    count = total = 0

    def visit(tensor: Any, kind: str) -> None:
        nonlocal count, total
        try:
            if tensor.device.type == "meta" or not _torch_device_matches(tensor, place):
                return
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            nbytes = int(storage.nbytes())
        except Exception:  # sparse, nested or functional tensors without one storage
            return
        if key in seen or nbytes == 0:
            return  # views share their base's storage: count it once
        seen.add(key)
        count += 1
        total += nbytes
        _keep(heap, LiveObject("torch", kind, tuple(tensor.shape), str(tensor.dtype), nbytes, str(tensor.device)), top)

    for obj in objects:
        if isinstance(obj, tensor_type):
            is_parameter = isinstance(obj, parameter_type)
            visit(obj, "parameter" if is_parameter else "tensor")
            grad = obj.grad if is_parameter else None
            if grad is not None:
                visit(grad, "gradient")
    return _result("torch", place, count, total, heap, "gc over torch.Tensor objects, one per storage")


def _tf_device_matches(name: str, place: str | None) -> bool:
    if place is None:
        return True
    kind, _, index = place.partition(":")
    return f"device:{kind.upper()}:{index or 0}" in name


def _scan_tensorflow(objects: list[Any], place: str | None, top: int) -> LiveMemory | None:
    if "tensorflow" not in sys.modules:
        return None
    ops = sys.modules.get("tensorflow.python.framework.ops")
    variables = sys.modules.get("tensorflow.python.ops.resource_variable_ops")
    kinds: list[tuple[type, str]] = []
    if ops is not None and hasattr(ops, "EagerTensor"):
        kinds.append((ops.EagerTensor, "tensor"))
    if variables is not None and hasattr(variables, "BaseResourceVariable"):
        kinds.append((variables.BaseResourceVariable, "variable"))
    if not kinds:
        return None
    types_ = tuple(cls for cls, _ in kinds)
    heap: list[tuple[int, int, LiveObject]] = []
    count = total = 0
    for candidate in objects:
        if not isinstance(candidate, types_):
            continue
        obj: Any = candidate
        kind = next(name for cls, name in kinds if isinstance(obj, cls))
        try:
            device = str(obj.device)
            if not _tf_device_matches(device, place):
                continue
            elements = obj.shape.num_elements()
            if elements is None:
                continue
            nbytes = int(elements * obj.dtype.size)
            shape = tuple(int(d) for d in obj.shape)
            dtype = obj.dtype.name
        except Exception:  # string tensors have no byte size
            continue
        if nbytes == 0:
            continue  # resource handles and empty tensors hold no tensor memory
        count += 1
        total += nbytes
        _keep(heap, LiveObject("tensorflow", kind, shape, dtype, nbytes, device), top)
    return _result("tensorflow", place, count, total, heap, "gc over EagerTensor and tf.Variable objects")


def _scan_jax(place: str | None, top: int) -> LiveMemory | None:
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "live_arrays"):
        return None
    heap: list[tuple[int, int, LiveObject]] = []
    count = total = 0
    for array in jax.live_arrays():
        try:
            if array.is_deleted():
                continue
            devices = sorted(array.devices(), key=lambda d: d.id)
            names = [f"{d.platform}:{d.id}" for d in devices]
            if place is not None and not any(_jax_place_matches(name, place) for name in names):
                continue
            nbytes = int(array.nbytes)
            shape = tuple(int(d) for d in array.shape)
            dtype = str(array.dtype)
        except Exception:  # an array deleted while we looked
            continue
        count += 1
        total += nbytes
        _keep(heap, LiveObject("jax", "array", shape, dtype, nbytes, ",".join(names)), top)
    return _result("jax", place, count, total, heap, "jax.live_arrays()")


def _jax_place_matches(name: str, place: str) -> bool:
    platform, _, index = name.partition(":")
    kind, _, wanted = place.partition(":")
    aliases = {"cuda": "gpu", "rocm": "gpu"}
    return aliases.get(platform, platform) == aliases.get(kind, kind) and (not wanted or index == wanted)


def scan(frameworks: list[str], places: dict[str, str | None], top: int) -> list[LiveMemory]:
    """The live tensors of each framework in ``frameworks`` (already imported ones
    only) on ``places[framework]`` (``"cuda:0"``, ``"gpu:0"``, ``"cpu"``; None: all)."""
    found: list[LiveMemory] = []
    needs_gc = any(name in ("torch", "tensorflow") for name in frameworks)
    objects = gc.get_objects() if needs_gc else []
    try:
        # Some objects warn when merely inspected (deprecated lazy proxies such as
        # torch.distributed.reduce_op): the scan must not spray the user's log.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in frameworks:
                place = places.get(name)
                result: LiveMemory | None = None
                if name == "torch":
                    result = _scan_torch(objects, place, top)
                elif name == "tensorflow":
                    result = _scan_tensorflow(objects, place, top)
                elif name == "jax":
                    result = _scan_jax(place, top)
                if result is not None:
                    found.append(result)
    finally:
        objects.clear()  # the list holds every object in the process: let go at once
    return found
