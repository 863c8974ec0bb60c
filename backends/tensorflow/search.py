"""What ``find_batch_size`` asks of TensorFlow beyond the defaults: its peaks may stop growing near
the cap, since Grappler's memory optimizer (and XLA under ``jit_compile``) may recompute or swap
tensors to fit. Each size is a real trial measured against the memory_limit unimem set."""

from __future__ import annotations

from unimem.backends.base import Search

__all__ = ["TensorFlowSearch"]


class TensorFlowSearch(Search):
    """TensorFlow in the batch search (``SearchTopic``): measured per trial; may trade compute for memory."""

    rematerializes = True
