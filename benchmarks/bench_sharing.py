"""On a GPU: `unimem run` caps an unmodified torch script; torch and JAX share one
device in one process without either starving. Writes JSON to --out.

Each part runs in a fresh process. Run on a GPU machine:
    python benchmarks/bench_sharing.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

SHARE = textwrap.dedent(
    """
    import json
    import unimem
    import torch, jax, jax.numpy as jnp

    applied = unimem.configure(backend=["torch", "jax"], fraction={"torch": 0.5, "jax": 0.3})
    total = torch.cuda.get_device_properties(0).total_memory
    GiB = 1 << 30
    torch_chunks, jax_chunks = [], []
    torch_oom = jax_oom = None
    # Interleave: each framework takes 1 GiB in turn until each hits its own share.
    while torch_oom is None or jax_oom is None:
        if torch_oom is None:
            try:
                torch_chunks.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError as exc:
                torch_oom = str(exc).splitlines()[0][:160]
        if jax_oom is None:
            try:
                jax_chunks.append(jnp.zeros(GiB, dtype=jnp.uint8).block_until_ready())
            except Exception as exc:
                if "RESOURCE_EXHAUSTED" not in str(exc):  # JAX's out-of-memory error
                    raise
                jax_oom = str(exc).splitlines()[0][:160]
        if len(torch_chunks) + len(jax_chunks) > 400:
            break
    print("RESULT " + json.dumps({
        "applied": str(applied),
        "device_total": total,
        "torch_held_gib": len(torch_chunks),
        "torch_share_gib": 0.5 * total / GiB,
        "jax_held_gib": len(jax_chunks),
        "jax_share_gib": 0.3 * total / GiB,
        "torch_oom": torch_oom,
        "jax_oom": jax_oom,
        "process_used": unimem.stats("torch").process_used,
        "torch_stats": unimem.stats("torch").as_dict(),
        "jax_stats": unimem.stats("jax").as_dict(),
    }))
    """
)


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "exit": proc.returncode, "stderr": proc.stderr[-2000:]}
    return {"ok": True, **json.loads(lines[-1][len("RESULT ") :])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    env = dict(os.environ)
    capped = subprocess.run(
        [
            sys.executable,
            "-m",
            "unimem",
            "run",
            "--backend",
            "torch",
            "--fraction",
            "0.25",
            "--",
            sys.executable,
            str(HERE / "scripts" / "fill_torch.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    shared = subprocess.run([sys.executable, "-c", SHARE], capture_output=True, text=True, env=env, timeout=300)
    report = {
        "date": datetime.date.today().isoformat(),
        "unimem_run_fraction_0_25": _result(capped),
        "torch_jax_split_0_5_0_3": _result(shared),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sharing-gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
