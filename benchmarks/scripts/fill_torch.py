"""An unmodified torch script (it never mentions unimem): fill the GPU 1 GiB at a time
until torch raises, then print how much it held. Used with `unimem run --fraction 0.25`."""

import json
import sys

import torch

chunks = []
error = None
while True:
    try:
        chunks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as exc:
        error = str(exc).splitlines()[0][:200]
        break
    if len(chunks) > 200:
        break
total = torch.cuda.get_device_properties(0).total_memory
print(
    "RESULT "
    + json.dumps(
        {
            "held_gib": len(chunks),
            "device_total": total,
            "fraction_in_force": torch.cuda.get_per_process_memory_fraction(0),
            "oom": error,
        }
    )
)
sys.exit(0)
