"""Capture fidelity (issue 10, item 1): the no-eviction plan runs the expensive aten ops an eager
training step runs, op for op.

Per tiny zoo model, in fp32 and under bf16 autocast, the aten ops dispatched by one eager step
(forward, loss, ``backward()``) are counted with a ``TorchDispatchMode``, and so are those of the
no-eviction plan's step as the eager executor runs it (the captured step lowered by
``lower_plan`` and run; ``optimize(..., solver="none")`` and its optimized module for the
fp32-region model, to check the runtime's own trace gets the same passes).  Compared, per group: matmuls and convolutions by dtype (no GEMM in another dtype),
attention by kernel and by how it is called (mask or ``is_causal``), batch norm, casts and clones.

Ops counted as equivalent (:data:`EQUIVALENT`): AOTAutograd's functional batch norm
(``_native_batch_norm_legit_functional``) is eager's ``native_batch_norm`` on the CPU (the same
kernel; on CUDA eager runs cuDNN's, which the cuda test demands).  Casts: the plan may cast less
than eager, by exactly the casts :func:`~libra_opt.capture_passes.dedupe_casts` merged.

Before the capture-fidelity passes this failed on the CPU for GPT-2, Llama (attention called with a
materialized mask instead of ``is_causal``; Llama's key/value heads copied per query head instead
of ``enable_gqa``), ViT, BERT, GPT-2 and Llama (``clone`` for every ``dropout(p=0)``) and for a model
with an fp32 region under autocast (its backward matmuls ran in bf16: the backward was traced
under autocast).  The cuda test adds cuDNN batch norm, the fused attention kernels and device time
per group (``gpu-measurements/diag_ops.py``).
"""
from __future__ import annotations

import collections
import copy
import functools
import operator

import pytest
import torch
import torch.fx as fx
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from libra_opt.frontend.capture import build_problem, capture
from libra_opt.frontend.capture_passes import (apply_graph_passes, dedupe_casts, drop_constant_attention_masks,
                                               remove_identity_clones, use_cudnn_batch_norm)
from libra_opt.optimize import optimize
from libra_opt.runtime.partition import lower_plan, run_lowered
from libra_opt.runtime.swap import SwapManager
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.apps.zoo import build_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

#: (zoo name, batch): the tiny zoo, dropout 0 (zoo default)
MODELS = {"gpt2": ("gpt2-tiny", 2), "bert": ("bert-tiny", 2), "llama": ("llama-tiny", 2),
          "vit": ("vit-tiny", 2), "resnet": ("resnet-tiny", 2)}

#: op name -> the name it is counted as (ops the CPU runs as the same kernel)
EQUIVALENT = {"aten::_native_batch_norm_legit_functional": "aten::native_batch_norm"}
#: expensive op groups compared one for one (keys of the counts)
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::convolution",
          "aten::convolution_backward"}
BATCH_NORM = {"aten::native_batch_norm", "aten::native_batch_norm_backward", "aten::cudnn_batch_norm",
              "aten::cudnn_batch_norm_backward"}
SOFTMAX = {"aten::_softmax", "aten::_safe_softmax", "aten::_softmax_backward_data"}
CAST, CLONE = "aten::_to_copy", "aten::clone"


def _named_arg(func, args, kwargs, names):
    for i, a in enumerate(func._schema.arguments):
        if a.name in names:
            return args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return None


def op_key(func, args, kwargs):
    """The key an op is counted under, or None for cheap ops: name (after :data:`EQUIVALENT`), with
    the dtype for matmuls and the mask / ``is_causal`` for attention."""
    name = EQUIVALENT.get(func._schema.name, func._schema.name)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    dtype = str(first.dtype).replace("torch.", "") if first is not None else ""
    if name in MATMUL:
        return f"{name}[{dtype}]"
    if "scaled_dot_product" in name:
        mask = _named_arg(func, args, kwargs, ("attn_mask", "attn_bias")) is not None
        causal = bool(_named_arg(func, args, kwargs, ("is_causal",)))
        return f"{name}[{dtype}, mask={mask}, causal={causal}]"
    if name in BATCH_NORM or name in SOFTMAX or name in (CAST, CLONE):
        return name
    return None


class CountOps(TorchDispatchMode):
    """Counts the expensive aten ops dispatched while active (:func:`op_key`)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = op_key(func, args, kwargs) if isinstance(func, torch._ops.OpOverload) else None
        if key is not None:
            self.counts[key] += 1
        return func(*args, **kwargs)


def _compare(eager: collections.Counter, plan: collections.Counter, merged_casts: int):
    casts_e, casts_p = eager.pop(CAST, 0), plan.pop(CAST, 0)
    assert dict(plan) == dict(eager), {k: (eager[k], plan[k]) for k in set(eager) | set(plan) if eager[k] != plan[k]}
    assert casts_p == casts_e - merged_casts, (casts_e, casts_p, merged_casts)


def _eager_counts(model, args, kwargs, loss_fn, autocast_dtype):
    dev = next(model.parameters()).device
    with CountOps() as ce:
        with torch.autocast(dev.type, autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss = loss_fn(model(*args, **kwargs))
        loss.backward()
    return ce.counts


def _no_eviction_counts(step):
    """Op counts of the no-eviction plan of a captured step, lowered and run as the eager executor
    runs it (the forward and backward graphs of :func:`~libra_opt.runtime.partition.lower_plan`)."""
    p = build_problem(step)
    low = lower_plan(step.joint, step.num_fwd_outputs, p, no_remat_schedule(p), SwapManager("cpu"))
    with CountOps() as cp:
        run_lowered(low, step.primals, step.tangents)
    return cp.counts


@functools.lru_cache(maxsize=None)
def _captured(arch, autocast):
    if autocast is None:
        from test_capture import ARCHS, captured      # shares the session's fp32 captures (dropout 0.1 there)

        if arch in ARCHS:
            return captured(arch)
    name, batch = MODELS[arch]
    zm = build_model(name, batch, seed=0)
    return zm, capture(zm.model, zm.args, zm.kwargs, autocast_dtype=autocast, loss_fn=zm.loss_fn)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", list(MODELS))
def test_plan_dispatches_the_expensive_ops_eager_does(arch, autocast):
    zm, step = _captured(arch, autocast)
    torch.manual_seed(0)
    eager = _eager_counts(copy.deepcopy(zm.model), zm.args, zm.kwargs, zm.loss_fn, autocast)
    torch.manual_seed(0)
    plan = _no_eviction_counts(step)
    assert any(k.startswith(("aten::mm", "aten::addmm", "aten::convolution")) for k in eager)
    _compare(eager, plan, step.passes["dedupe_casts"])


class _Fp32Head(nn.Module):
    """A bf16 trunk and an fp32 head under autocast (``autocast(enabled=False)``): eager runs the
    head's backward matmuls in fp32, as the forward's."""

    def __init__(self):
        super().__init__()
        self.trunk, self.head = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        with torch.autocast("cpu", enabled=False):
            return self.head(h.float())


def test_fp32_region_backward_stays_fp32_under_autocast():
    """Through optimize() and the optimized module (its own trace, the same passes)."""
    torch.manual_seed(0)
    model, x = _Fp32Head(), torch.randn(4, 16)
    loss_fn = lambda y: y.square().mean()           # noqa: E731
    eager = _eager_counts(copy.deepcopy(model), (x,), {}, loss_fn, torch.bfloat16)
    om = optimize(model, (x,), 1.0, solver="none", loss_fn=loss_fn, autocast_dtype=torch.bfloat16, profile=False)
    with om.tracking(CountOps()) as cp:
        om(x).backward()
    assert eager["aten::mm[float32]"] >= 2          # the head's weight and input gradients
    _compare(eager, cp.counts, om.problem.provenance.extra["capture_passes"]["dedupe_casts"])


# ---------------------------------------------------------------- each pass on its own
def _dynamo_graph(model, args, kwargs):
    """(TorchDynamo graph of ``model``, the real example inputs it was traced with)."""
    box = {}

    def backend(gm, example_inputs):
        box["gm"], box["inputs"] = gm, list(example_inputs)
        return gm.forward

    torch.compile(lambda *a, **k: model(*a, **k), backend=backend, fullgraph=True, dynamic=False)(*args, **kwargs)
    return box["gm"], box["inputs"]


def _sdpa_calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in
            (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)]


def test_drop_constant_attention_masks_gives_is_causal_and_same_values():
    zm = build_model("gpt2-tiny", 2, seed=0)
    gm, inputs = _dynamo_graph(zm.model, zm.args, zm.kwargs)
    calls = _sdpa_calls(gm)
    assert calls and all(n.kwargs.get("attn_mask") is not None for n in calls)
    n_nodes = len(gm.graph.nodes)
    with torch.no_grad():
        before = gm(*inputs)
        assert drop_constant_attention_masks(gm) == len(calls)
        after = gm(*inputs)
    assert all(n.kwargs.get("attn_mask") is None and n.kwargs.get("is_causal") is True for n in _sdpa_calls(gm))
    assert len(gm.graph.nodes) < n_nodes - 5           # the mask's computation is gone
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_mask_that_depends_on_an_input_is_kept():
    class Masked(nn.Module):
        def forward(self, q, m):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m)

    q, m = torch.randn(1, 2, 4, 8), torch.ones(4, 4, dtype=torch.bool)
    gm, _ = _dynamo_graph(Masked(), (q, m), {})
    assert apply_graph_passes(gm)["drop_constant_attention_masks"] == 0


def test_llama_repeat_kv_folds_into_enable_gqa():
    zm = build_model("llama-tiny", 2, seed=0)
    gm, inputs = _dynamo_graph(zm.model, zm.args, zm.kwargs)
    with torch.no_grad():
        before = gm(*inputs)
        done = apply_graph_passes(gm)
        after = gm(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert done["drop_constant_attention_masks"] == done["fold_repeated_kv_into_gqa"] == 2
    for n in _sdpa_calls(gm):
        assert n.kwargs["enable_gqa"] is True and n.kwargs["is_causal"] is True
        k = n.args[1].meta["example_value"]
        assert k.shape[1] == zm.model.config.num_key_value_heads


class _Casts(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = x.float() * 2
        return self.a(h) + self.b(h)          # under autocast: h is cast to bf16 for each linear


def test_dedupe_casts_merges_identical_casts_and_keeps_values():
    torch.manual_seed(0)
    model, x = _Casts(), torch.randn(4, 8)
    step = capture(model, (x,), autocast_dtype=torch.bfloat16, loss_fn=lambda y: y.float().sum())
    assert step.passes["dedupe_casts"] >= 1
    casts = [n for n in step.joint.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    keys = [(n.args, tuple(sorted(map(str, n.kwargs.items())))) for n in casts]
    fwd = [k for k, n in zip(keys, casts) if n.meta.get("partitioner_tag") == "is_forward"]
    assert len(fwd) == len(set(fwd))
    # the pass on its own, on a graph with two identical casts
    g = fx.Graph()
    p = g.placeholder("p")
    c1 = g.call_function(torch.ops.aten._to_copy.default, (p,), {"dtype": torch.bfloat16})
    c2 = g.call_function(torch.ops.aten._to_copy.default, (p,), {"dtype": torch.bfloat16})
    g.output((g.call_function(torch.ops.aten.add.Tensor, (c1, c2)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert dedupe_casts(gm, {n.name: "forward" for n in g.nodes}) == 1
    gm.recompile()
    t = torch.randn(3)
    assert torch.equal(gm(t)[0], t.bfloat16() + t.bfloat16())


def test_remove_identity_clones_keeps_layout_changes_and_inputs():
    g = fx.Graph()
    p = g.placeholder("p")
    x = torch.randn(4, 6)
    p.meta["val"] = x
    e = g.call_function(torch.ops.aten.mul.Tensor, (p, p))
    e.meta["val"] = x * x
    same = g.call_function(torch.ops.aten.clone.default, (e,))
    same.meta["val"] = x * x
    t = g.call_function(torch.ops.aten.t.default, (e,))
    t.meta["val"] = (x * x).t()
    contig = g.call_function(torch.ops.aten.clone.default, (t,), {"memory_format": torch.contiguous_format})
    contig.meta["val"] = (x * x).t().contiguous()
    of_input = g.call_function(torch.ops.aten.clone.default, (p,))
    of_input.meta["val"] = x.clone()
    g.output((g.call_function(torch.ops.aten.add.Tensor, (same, of_input)), g.call_function(
        torch.ops.aten.relu.default, (contig,))))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert remove_identity_clones(gm) == 1
    left = [n for n in g.nodes if n.target is torch.ops.aten.clone.default]
    assert left == [contig, of_input]
    gm.recompile()
    out = gm(x)
    assert torch.equal(out[0], x * x + x) and torch.equal(out[1], torch.relu((x * x).t()))


def test_cudnn_batch_norm_rewrite_structure():
    """The rewrite on a CPU-captured ResNet with the cuDNN condition forced (the kernels need CUDA;
    tests/test_capture_fidelity.py::test_cuda_* run them): every training batch norm pair becomes
    cudnn_batch_norm / cudnn_batch_norm_backward, the running statistics come from clones the cuDNN
    op updates, the reserve space is a new tensor saved for the backward, and the problem IR is valid."""
    zm = build_model("resnet-tiny", 2, seed=0)
    step = capture(zm.model, zm.args, zm.kwargs, loss_fn=zm.loss_fn)
    g = step.joint.graph
    n_bn = len([n for n in g.nodes if n.target is torch.ops.aten._native_batch_norm_legit_functional.default])
    assert n_bn and use_cudnn_batch_norm(step.joint, applies=lambda *a: True) == n_bn
    step.joint.recompile()
    assert not [n for n in g.nodes if n.target in (torch.ops.aten._native_batch_norm_legit_functional.default,
                                                   torch.ops.aten.native_batch_norm_backward.default)]
    fw = [n for n in g.nodes if n.target is torch.ops.aten.cudnn_batch_norm.default]
    bw = [n for n in g.nodes if n.target is torch.ops.aten.cudnn_batch_norm_backward.default]
    assert len(fw) == len(bw) == n_bn
    out = next(iter(g.find_nodes(op="output")))
    fwd_outs = set(out.args[0][:step.num_fwd_outputs])
    for n in fw:
        rm, rv = n.args[3], n.args[4]
        assert rm.target is torch.ops.aten.clone.default and rv.target is torch.ops.aten.clone.default
        assert rm in fwd_outs and rv in fwd_outs               # the new running statistics
    p = build_problem(step)
    p.validate()
    for n in bw:
        res = n.args[8]
        assert res.target is operator.getitem and res.args[1] == 3
        t = next(t for t in p.tensors if t.name == res.name)
        assert p.nodes[t.consumers[-1]].phase == "backward"     # saved for the backward


# ---------------------------------------------------------------- on the device
@pytest.mark.cuda
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", list(MODELS))
def test_cuda_plan_runs_eager_kernels_and_reports_device_time(arch, autocast):
    """On CUDA: the same op counts per group (with cuDNN batch norm and the fused attention kernel
    eager picks, no equivalences), measured with torch.profiler, and the device time per group of
    both steps printed (``pytest -s``) as ``gpu-measurements/diag_ops.py`` does."""
    from torch.profiler import ProfilerActivity, profile

    name, batch = MODELS[arch]
    zm = build_model(name, batch, device="cuda", seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 1.0, solver="none", example_kwargs=zm.kwargs, loss_fn=zm.loss_fn,
                  autocast_dtype=autocast, profile=False)

    def eager():
        with torch.autocast("cuda", autocast or torch.bfloat16, enabled=autocast is not None):
            loss = zm.loss_fn(ref(*zm.args, **zm.kwargs))
        loss.backward()

    def plan():
        om(*zm.args, **zm.kwargs).backward()

    counts, times = {}, {}
    for tag, fn, model in (("eager", eager, ref), ("plan", plan, zm.model)):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            fn()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        c, t = collections.Counter(), collections.Counter()
        for ev in prof.key_averages():
            key = ev.key
            # attention: the kernels (``aten::_scaled_dot_product_*``), not eager's composite wrapper
            group = (key if key in MATMUL | BATCH_NORM | SOFTMAX | {CAST, CLONE}
                     or key.startswith("aten::_scaled_dot_product") else None)
            if group is None:
                continue
            c[group] += ev.count
            t[group] += getattr(ev, "device_time_total", getattr(ev, "cuda_time_total", 0)) / 1e3
        counts[tag], times[tag] = c, t
    print(f"\n{name} autocast={autocast}: op group, eager calls / ms, plan calls / ms")
    for g in sorted(set(counts["eager"]) | set(counts["plan"])):
        print(f"  {g:55s} {counts['eager'][g]:5d} {times['eager'][g]:8.3f}   {counts['plan'][g]:5d} "
              f"{times['plan'][g]:8.3f}")
    merged = om.problem.provenance.extra["capture_passes"]["dedupe_casts"]
    _compare(counts["eager"], counts["plan"], merged)
