"""Know before you run: a training step's peak memory predicted without allocating it.

``unimem.estimate_memory`` (``api``) runs the user's step the way its framework can size it
without its memory (torch under fake tensors, JAX and TensorFlow from XLA's compiled program) and
returns a ``MemoryEstimate`` (``result``): per batch size, the predicted peak and its parts, and
whether it fits a target; the largest batch that fits (``largest``). Under it: ``allocator``, a
model of torch's CUDA caching allocator, ``trace``, a step's allocations replayed through it,
and ``plan``, the plain types a framework's ``estimate`` topic takes and returns.
"""
