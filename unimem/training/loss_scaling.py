"""Loss scaling lives in ``unimem.loss_scaling``, below the adapters that subclass ``LossScaler``.

This path stays importable: the API reference named it before the move.
"""

from __future__ import annotations

from unimem.loss_scaling import LossScaler, NoLossScaling, ScalerConfig, next_scale

__all__ = ["LossScaler", "NoLossScaling", "ScalerConfig", "next_scale"]
