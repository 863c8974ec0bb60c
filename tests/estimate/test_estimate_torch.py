"""``unimem.estimate_memory`` for torch, with real torch in fresh processes: the estimate of a CPU
step equals what a real run of it holds, its parts are the parameters', gradients' and Adam's own
bytes, a CUDA device is planned without starting CUDA, and what CUDA does differently is done."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from conftest import run_json

pytestmark = pytest.mark.slow  # each run imports torch in a fresh process and traces several steps

_MODEL = r"""
import os, sys
import torch
import unimem
from unimem.estimate.trace import replay
from unimem.step_estimates import Trace
from unimem.backends.torch._recorder import Phases, make_recorder

class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))

def build(d=64, depth=3):
    model = torch.nn.Sequential(*[Block(d) for _ in range(depth)])
    opt = torch.optim.AdamW(model.parameters())
    def step(n):
        x = torch.randn(n, 16, d)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, model

def factory():
    return build()[0]

def real_cpu_peak(n):
    # The same tracker over a real CPU run: the second step's peak of live storages, in exact bytes.
    torch.manual_seed(0)
    trace, phases = Trace(caching=False), Phases()
    with make_recorder(trace, phases):
        step, model = build()
        step(n)
        trace.window = len(trace.events)
        step(n)
    return replay(trace).peak, sum(p.numel() * p.element_size() for p in model.parameters())
"""

_CPU = (
    _MODEL
    + r"""
estimate = unimem.estimate_memory(factory, [32, 64], device="cpu", backend="torch")
measured, params = real_cpu_peak(64)

def encoder():  # nn.TransformerEncoder deep-copies its layer into each of its layers
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    def step(n):
        model(torch.randn(n, 16, 64)).sum().backward()
    return step
layer_params = sum(p.numel() * 4 for p in torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).parameters())
encoded = unimem.estimate_memory(encoder, 8, device="cpu", backend="torch")[8].parts
size = estimate[64]
emit({"predicted": size.peak, "measured": measured, "params": params, "parts": size.parts, "required": size.required,
      "reserved": size.reserved, "fits": size.fits, "cuda_started": torch.cuda.is_initialized(),
      "text": str(estimate), "dict": estimate.as_dict(), "count": sum(1 for _ in build()[1].parameters()),
      "encoder": [encoded["parameters"], 2 * layer_params]})
"""
)

_CUDA = (
    _MODEL
    + r"""
class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(d, 3 * d), heads
    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, d)

def attention_factory():
    with torch.device("cuda"):  # read as the host: CUDA never starts
        model = Attention(64, 4)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters())
    def step(n):
        model(torch.randn(n, 32, 64, device="cuda")).sum().backward()
        opt.step()
    return step

R = {}
plan = unimem.estimate_memory(factory, 64, device="cuda", backend="torch", target="1GiB")
R["cuda"] = plan[64].as_dict()
R["largest"], R["above"] = plan.largest, plan.above
def planned(build, n, **kwargs):
    return unimem.estimate_memory(build, n, device="cuda", backend="torch", **kwargs)[n].as_dict()
R["bf16"] = planned(factory, 64, precision="bf16")
R["saved"] = planned(factory, 64, saver="full", match=Block)
R["attention"] = planned(attention_factory, 8)
R["attention_bf16"] = planned(attention_factory, 8, precision="bf16")
R["host"] = unimem.estimate_memory(factory, 64, device="cpu", backend="torch")[64].as_dict()
from unimem import registry
from unimem.step_estimates import Plan
def mask_sized(device):  # allocations of one byte per element of a block's output, in the measured step
    narrow = lambda: build(d=40)[0]  # 64 x 16 x 40 bytes: no other tensor of the step has that size
    trace = registry.get_backend("torch").estimate.estimate_size(narrow, 64, Plan(device=device)).trace
    return sum(1 for _, nbytes in trace.events[trace.window:] if nbytes == 64 * 16 * 40)
R["masks"] = {"cuda": mask_sized("cuda"), "cpu": mask_sized("cpu")}
with torch.autocast("cpu"):  # the host's own autocast is back: pow stays in bfloat16 there
    R["host_pow"] = str(torch.pow(torch.ones(2, dtype=torch.bfloat16), 2.0).dtype)
R["cuda_started"] = torch.cuda.is_initialized()
emit(R)
"""
)


@functools.cache
def _run(script: str) -> Any:
    return run_json(script, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, timeout=300)


def test_the_cpu_estimate_is_what_a_real_cpu_run_holds(need: Any) -> None:
    need("torch")
    r = _run(_CPU)
    assert r["predicted"] == r["measured"]
    assert r["reserved"] is None and r["required"] == r["predicted"]
    assert not r["cuda_started"]


def test_a_model_that_deep_copies_its_layers_is_estimated(need: Any) -> None:
    need("torch")
    estimated, expected = _run(_CPU)["encoder"]
    assert estimated == expected  # the two copies' parameters, made under the estimate's fake tensors


def test_the_parts_are_the_parameters_gradients_and_adam_state(need: Any) -> None:
    need("torch")
    r = _run(_CPU)
    parts = r["parts"]
    assert sum(parts.values()) == r["predicted"]
    assert parts["parameters"] == r["params"]
    # AdamW: two moments per parameter, and one 4-byte step count each (a tensor on the host).
    assert parts["optimizer"] == 2 * r["params"] + 4 * r["count"]
    assert parts["workspace"] == parts["rounding"] == 0


def test_the_result_reads_as_a_table_and_as_data(need: Any) -> None:
    need("torch")
    r = _run(_CPU)
    assert r["text"].startswith("unimem.estimate_memory: torch on cpu, no target")
    assert "parameters" in r["text"] and "nothing allocated" in r["text"]
    data = r["dict"]
    assert [s["batch"] for s in data["sizes"]] == [32, 64] and data["largest"] is None
    assert data["sizes"][0]["peak"] < data["sizes"][1]["peak"]


def test_a_cuda_device_is_planned_on_the_host_without_starting_cuda(need: Any) -> None:
    need("torch")
    r = _run(_CUDA)
    assert not r["cuda_started"]
    cuda = r["cuda"]
    assert cuda["device"] == "cuda" and cuda["reserved"] >= cuda["required"] >= cuda["peak"]
    assert sum(v for k, v in cuda["parts"].items() if k != "cache") == cuda["peak"]
    assert cuda["peak"] + cuda["parts"]["cache"] == cuda["reserved"]
    # CUBLAS_WORKSPACE_CONFIG=:4096:8 is 32 MiB, for the step's thread and autograd's; cuBLASLt's 1 MiB
    # for the forward's Linear layers only (addmm with a bias; their backward is plain products).
    assert cuda["parts"]["workspace"] == (2 * 32 + 1) * 2**20
    assert any("CUBLAS_WORKSPACE_CONFIG" in note for note in cuda["notes"])
    assert r["largest"] is not None and r["above"] is not None and r["largest"] < r["above"]


def test_cuda_dropout_keeps_a_one_byte_mask(need: Any) -> None:
    need("torch")
    r = _run(_CUDA)
    # CUDA's fused dropout keeps a byte per element (three dropouts of 64 x 16 x 40); the host's a float.
    assert r["masks"] == {"cuda": 3, "cpu": 0}
    assert r["host"]["parts"]["activations"] > r["cuda"]["parts"]["activations"]


def test_attention_takes_the_kernel_cuda_would(need: Any) -> None:
    need("torch")
    r = _run(_CUDA)
    assert any("memory-efficient attention" in note for note in r["attention"]["notes"])
    assert any("flash attention" in note for note in r["attention_bf16"]["notes"])
    assert any("scratch buffers" in item for item in r["attention"]["unseen"])


def test_precision_and_saver_lower_the_activations_and_leave_autocast_as_it_was(need: Any) -> None:
    need("torch")
    r = _run(_CUDA)
    fp32, bf16, saved = r["cuda"]["parts"], r["bf16"]["parts"], r["saved"]["parts"]
    assert bf16["activations"] < fp32["activations"]
    assert saved["activations"] < fp32["activations"]
    assert any("saver 'full' on 3 block(s)" in note for note in r["saved"]["notes"])
    assert r["host_pow"] == "torch.bfloat16"
