"""Random ops are recomputable (issue 10, item 2): a plan that recomputes dropout and ``rand_like``
replays the generator state saved at their first run, so the gradients are bitwise eager's with
the same seed and the RNG stream after the step is eager's (the next ``torch.rand`` matches)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from libra_opt.frontend.capture import build_problem, capture
from libra_opt.passes.lowering import Eviction, Policy, default_windows, lower
from libra_opt.optimize import optimize
from libra_opt.runtime.partition import lower_plan, run_lowered
from libra_opt.runtime.swap import SwapManager
from libra_opt.passes.simulator import simulate
from libra_opt.apps.zoo import build_model
from test_capture import captured  # shares the session's captures (tests/ is on sys.path)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 1234


def _recompute_in_backward(p, node_ids):
    """A plan that evicts every storage made by ``node_ids`` over its eager window (from its last
    forward use to its first backward use) and recomputes it there (the lowering regenerates the
    chain of inputs the recompute needs)."""
    wins = default_windows(p)
    evict = []
    for nid in node_ids:
        for t in p.nodes[nid].outputs:
            s = p.tensors[t].storage
            if s in wins and s not in {e.storage for e in evict}:
                a, b = wins[s]
                evict.append(Eviction(s, a, b, Policy.RECOMPUTE))
    return lower(p, evict)


class _Noisy(nn.Module):
    """``rand_like`` noise multiplied into an activation: the noise is saved for the backward."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h * torch.rand_like(h))


def _run_plan_vs_eager(model, args, kwargs, loss_fn, targets, step=None):
    step = step or capture(model, args, kwargs, loss_fn=loss_fn)
    p = build_problem(step)
    rand = [n.id for n in p.nodes if n.target in targets]
    assert rand and all(p.nodes[i].recomputable for i in rand)
    sched = _recompute_in_backward(p, rand)
    assert set(rand) & set(sched.recomputed_nodes())           # the plan recomputes the random nodes
    simulate(p, sched)                                          # and the simulator accepts it
    low = lower_plan(step.joint, step.num_fwd_outputs, p, sched, SwapManager("cpu"))
    assert {p.nodes[i].name for i in rand} & set(low.recomputed)
    ref = copy.deepcopy(model)
    torch.manual_seed(SEED)
    ref_loss = loss_fn(ref(*args, **kwargs))
    ref_loss.backward()
    ref_next = torch.rand(16)
    torch.manual_seed(SEED)
    fwd, grads = run_lowered(low, step.primals, step.tangents)
    next_ = torch.rand(16)
    assert torch.equal(fwd[0], ref_loss.detach())
    ref_grads = {id(q): r.grad for q, r in zip(model.parameters(), ref.parameters())}
    n = 0
    for t, g in zip(step.primals, grads):
        if id(t) in ref_grads:
            assert torch.equal(g, ref_grads[id(t)])
            n += 1
    assert n == len(ref_grads)
    assert torch.equal(next_, ref_next)                         # the RNG stream is eager's after the step


def test_gpt2_dropout_recomputed_bitwise_and_rng_stream_kept():
    zm, step = captured("gpt2")                # GPT-2 tiny, dropout 0.1 (shared with test_capture)
    _run_plan_vs_eager(zm.model, zm.args, zm.kwargs, zm.loss_fn, {"aten.native_dropout.default"}, step)


def test_rand_like_recomputed_bitwise_and_rng_stream_kept():
    torch.manual_seed(0)
    _run_plan_vs_eager(_Noisy(), (torch.randn(8, 16),), {}, lambda y: y.square().mean(),
                       {"aten.rand_like.default"})


def test_optimize_recomputes_random_ops_like_eager():
    """Through optimize() and the optimized module: checkpoint-all recomputes every recomputable
    node, rand_like included; two training steps match eager bitwise, as does the RNG stream."""
    torch.manual_seed(0)
    model, x = _Noisy(), torch.randn(8, 16)
    ref = copy.deepcopy(model)
    loss_fn = lambda y: y.square().mean()         # noqa: E731
    om = optimize(model, (x,), 1.0, solver="checkpoint-all", loss_fn=loss_fn, profile=False)
    for _ in range(2):
        torch.manual_seed(SEED)
        loss = om(x)
        loss.backward()
        after = torch.rand(8)
        torch.manual_seed(SEED)
        ref_loss = loss_fn(ref(x))
        ref_loss.backward()
        assert torch.equal(after, torch.rand(8))
        assert torch.equal(loss, ref_loss)
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad)
            a.grad = b.grad = None
    assert any("rand_like" in n for n in om.lowered.recomputed), om.lowered.recomputed


@pytest.mark.cuda
def test_cuda_dropout_recomputed_replays_philox_state():
    """On CUDA: GPT-2 tiny with dropout 0.1 under checkpoint-all (every dropout recomputed in the
    backward with its saved Philox seed and offset): gradients within 1e-2 relative of eager's (a
    different dropout mask would be far off), the CUDA RNG stream after the step equal to eager's."""
    zm = build_model("gpt2-tiny", 2, dropout=0.1, device="cuda", seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 1.0, solver="checkpoint-all", example_kwargs=zm.kwargs, profile=False)
    torch.manual_seed(SEED)
    om(*zm.args, **zm.kwargs).loss.backward()
    after = torch.rand(8, device="cuda")
    torch.manual_seed(SEED)
    ref(*zm.args, **zm.kwargs).loss.backward()
    assert torch.equal(after, torch.rand(8, device="cuda"))
    assert any("native_dropout" in n for n in om.lowered.recomputed), om.lowered.recomputed
    for a, b in zip(zm.model.parameters(), ref.parameters()):
        assert (a.grad - b.grad).abs().max() <= 1e-2 * b.grad.abs().max().clamp_min(1e-12)


@pytest.mark.cuda
def test_cuda_dropout_recomputed_under_inductor_replays_philox_state():
    """On CUDA under the Inductor executor: GPT-2 tiny with dropout 0.1 and
    checkpoint-all (every dropout recomputed in the backward graph as
    ``run_with_rng_state`` with the Philox state its forward saved through
    ``run_and_save_rng_state``): for two steps, gradients within torch.compile's
    own error against eager (torch.compile with ``fallback_random=True``, so
    its masks are eager's) and within 1e-2 relative (a different mask would be
    far off), and the CUDA RNG stream after the step eager's."""
    from torch._inductor import config

    zm = build_model("gpt2-tiny", 2, dropout=0.1, device="cuda", seed=0)
    ref, tc = copy.deepcopy(zm.model), copy.deepcopy(zm.model)

    def step(m):
        torch.manual_seed(SEED)
        m(*zm.args, **zm.kwargs).loss.backward()
        return torch.rand(8, device="cuda")

    ref_next = step(ref)
    with config.patch(fallback_random=True):
        step(torch.compile(tc))
    err_of = lambda m: max(float((a.grad - b.grad).abs().max()) for a, b in zip(m.parameters(), ref.parameters()))  # noqa: E731
    tc_err = err_of(tc)
    scale = max(float(b.grad.abs().max()) for b in ref.parameters())
    om = optimize(zm.model, zm.args, 1.0, solver="checkpoint-all", example_kwargs=zm.kwargs, profile=False,
                  executor="inductor")
    for _ in range(2):
        after = step(om)
        err = err_of(zm.model)
        assert err <= max(10 * tc_err, 1e-5 * scale) and err <= 1e-2 * scale, (err, tc_err, scale)
        assert torch.equal(after, ref_next)
        zm.model.zero_grad(set_to_none=True)
    assert om.inductor.fallback_random
    assert any("native_dropout" in n for n in om.lowered.recomputed), om.lowered.recomputed
    assert "run_with_rng_state" in om.inductor.compiled["backward"].code
