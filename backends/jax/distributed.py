"""JAX under a launcher: the rank's device pin, and the coordinator's key-value store.

The pin restricts the CUDA devices JAX uses to the rank's own: ``jax_cuda_visible_devices``
at import (what ``jax.distributed.initialize(local_device_ids=...)`` sets), and
``JAX_LOCAL_DEVICE_IDS``, which ``initialize`` reads when it is given no ids, so that its
own SLURM detection (local ids = ``SLURM_LOCALID``) does not pick a device a task that
sees one GPU does not have. Ids the script passes to ``initialize`` still win.

The gather reads the coordinator's key-value store (``jax._src.distributed.global_state``:
jax 0.10 has no public handle on it) with a bounded wait, not ``process_allgather``: a
collective that one process calls alone never returns. ``find_batch_size`` agrees on its
trials through the same store; its step must be process-local, since a computation that
spans processes cannot fail on one of them alone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from unimem.backends.base import Distributed
from unimem.backends.jax import _runtime as runtime
from unimem.backends.jax.configure import FIX
from unimem.backends.steps import STATUS_PENDING, STATUS_SKIPPED, STATUS_UNCHANGED, Step, env_step
from unimem.backends.topics import KeyValueStore

from unimem.import_hooks import when_imported
from unimem.support import When

__all__ = ["LOCAL_IDS", "CoordinatorStore", "JaxDistributed"]

LOCAL_IDS = "JAX_LOCAL_DEVICE_IDS"
_FLAG = "jax_cuda_visible_devices"


class CoordinatorStore:
    """The distributed runtime client's key-value store: ``set``, and ``get`` with a bounded wait."""

    def __init__(self, client: Any, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.client = client

    def set(self, key: str, value: str) -> None:
        # Replacing: the cluster view keeps two keys per rank, each rewritten every other call.
        self.client.key_value_set(key, value, allow_overwrite=True)

    def get(self, key: str, timeout: float) -> str | None:
        errors = sys.modules["jax"].errors.JaxRuntimeError  # DEADLINE_EXCEEDED, or the coordinator has gone
        try:
            if timeout <= 0:
                found = self.client.key_value_try_get(key)
            else:
                found = self.client.blocking_key_value_get(key, max(1, int(timeout * 1000)))
        except errors:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)


class JaxDistributed(Distributed):
    """JAX under a launcher (``DistributedTopic``): its visible CUDA devices at import, the coordinator's store."""

    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        """The rank's device as JAX's visible CUDA devices, set when JAX is imported; ``per_rank``: the
        base's ``CUDA_VISIBLE_DEVICES`` step, and ``JAX_LOCAL_DEVICE_IDS=0`` for the one device left."""
        if device is None:
            return super().plan_pin(device, per_rank=per_rank, note=note)
        if per_rank:
            # The rank then sees one device, 0: jax.distributed.initialize must not ask for SLURM_LOCALID's.
            phase = self.backend.phase()
            ids = env_step("jax", "devices", [device], LOCAL_IDS, "0", phase=phase, when=When.BEFORE_INIT, fix=FIX)
            return [*super().plan_pin(device, per_rank=True, note=note), ids]
        value = str(device)
        target = f"{LOCAL_IDS}={value}; jax.config.update({_FLAG!r}, {value!r}) at import"
        if runtime.started():
            current = getattr(sys.modules["jax"].config, "_read", lambda name: None)(_FLAG)
            if current == value:
                return [Step("jax", "pin", device, "api", target, status=STATUS_UNCHANGED, note=note)]
            skipped = (
                f"{note}; JAX's backend has already started with its devices fixed: pin before its first "
                f"operation, or pass local_device_ids=[{device}] to jax.distributed.initialize"
            )
            return [Step("jax", "pin", device, "api", target, status=STATUS_SKIPPED, note=skipped)]
        theirs = os.environ.get(LOCAL_IDS)
        if theirs is not None and theirs != value:
            mine = f"{note}; {LOCAL_IDS}={theirs} is set in the environment and wins"
            return [Step("jax", "pin", device, "env", target, status=STATUS_SKIPPED, note=mine)]

        def run() -> None:
            os.environ[LOCAL_IDS] = value

            def restrict(jax: Any) -> None:
                if not runtime.started():
                    jax.config.update(_FLAG, value)

            when_imported("jax", restrict, key="unimem.jax.pin")

        return [Step("jax", "pin", device, "hook", target, run=run, status=STATUS_PENDING, note=note)]

    def distributed_store(self) -> KeyValueStore | None:
        """The coordinator's store once ``jax.distributed.initialize`` has run in this process."""
        dist = sys.modules.get("jax._src.distributed")
        state = None if dist is None else getattr(dist, "global_state", None)
        if state is None or state.client is None:
            return None
        return CoordinatorStore(state.client, int(state.process_id), int(state.num_processes))
