"""Plans per shape and autocast, shape buckets, and saved plans (issue 15,
"Shapes" and "Saved plans and profiles"): a dataloader's short last batch
and another sequence length train like eager PyTorch under plans of their
own, made without profiling; an enclosing ``torch.autocast`` picks the
dtype; padding to a bucket keeps the loss and gradients; a restart loads the
saved profile and plan instead of profiling and solving."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import libra_opt.frontend.profiling
from libra_opt.errors import InfeasibleBudgetError, ShapeMismatchError
from libra_opt.optimize import optimize
from libra_opt.plan_cache import _io_bytes, pad_to_bucket, scale_to_step
from libra_opt.plan_store import CACHE_DIR_ENV, PlanCacheWarning, PlanStore

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), *[nn.Sequential(nn.Tanh(), nn.Linear(64, 64)) for _ in range(5)],
                         nn.Tanh(), nn.Linear(64, 4))


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def square_loss(y):
    return (y * y).mean()


class TinyLM(nn.Module):
    """Embedding, one masked self-attention, an MLP and a token-level
    cross-entropy with ``ignore_index=-100``."""

    def __init__(self, vocab=40, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask, labels):
        h = self.emb(input_ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(attention_mask[:, None, :] == 0, float("-inf"))
        h = h + scores.softmax(-1) @ v
        h = h + self.mlp(h)
        logits = self.head(h)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def lm_batch(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (b, t), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(b, t, dtype=torch.long), "labels": ids.clone()}


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_short_last_batch_trains_like_eager_under_a_plan_of_its_own(caplog):
    """A loader of 456 samples in batches of 256: the last batch (200) gets its
    own plan (no profiling), and three epochs' losses, gradients and
    parameters equal eager PyTorch's bitwise (executor eager, CPU)."""
    model, ref = mlp(), mlp()
    data = torch.randn(456, 16, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(data, batch_size=256)
    om = optimize(model, data[:256], 0.6, solver="libra", loss_fn=square_loss, profile=False, executor="eager")
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    calls = []
    orig = libra_opt.frontend.profiling.profile_step
    libra_opt.frontend.profiling.profile_step = lambda *a, **k: calls.append(a) or orig(*a, **k)
    try:
        with caplog.at_level(logging.INFO, logger="libra_opt.plan_cache"):
            for _ in range(2):
                for x in loader:
                    loss, ref_loss = om(x), square_loss(ref(x))
                    loss.backward(), ref_loss.backward()
                    assert torch.equal(loss, ref_loss)
                    assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(ref)))
                    opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    finally:
        libra_opt.frontend.profiling.profile_step = orig
    assert not calls                                         # the new shape was not profiled
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
    (sp,) = om.shape_plans.values()                           # one plan for batch 200, made once
    assert sp.problem.provenance.extra["scaled_from"] == om.problem.name
    assert sp.plan.peak_bytes <= sp.plan.budget_bytes and sp.lowered is not None
    assert (sp.lowered.recomputed or sp.lowered.swapped)     # the plan of batch 200 does remat
    assert "new plan for input shapes [[200, 16]]" in caplog.text and "solved in" in caplog.text


def test_scaled_problem_prices_ops_by_their_bytes():
    """Same graph at 3/4 of the batch: every op's time is 3/4 of a profiled
    time scaled by the bytes it reads and writes (between the two: weights
    do not scale), storages' bytes are exact."""
    from libra_opt.frontend.capture import build_problem, capture

    model = mlp()
    s256, s192 = capture(model, (torch.randn(256, 16),), loss_fn=square_loss), \
        capture(model, (torch.randn(192, 16),), loss_fn=square_loss)
    ref = build_problem(s256, times={n.name: 1e-3 for n in s256.joint.graph.nodes}, optimizer="sgd")
    scaled = scale_to_step(ref, s192)
    exact = build_problem(s192, optimizer="sgd")
    assert [t.nbytes for t in scaled.tensors] == [t.nbytes for t in exact.tensors]
    assert scaled.fixed == exact.fixed and scaled.provenance.extra["matched_nodes"] == [len(ref.nodes)] * 2
    times = [n.time_s for n in scaled.nodes]
    assert all(0.75e-3 - 1e-12 <= t <= 1e-3 + 1e-12 for t in times) and min(times) < 0.76e-3
    # ops without a node of their name (the graph changed): priced at their op's seconds per byte
    renamed = ref.replace(nodes=[dataclasses.replace(n, name=n.name + "_old") if n.target == "aten.mm.default"
                                 else n for n in ref.nodes])
    priced = scale_to_step(renamed, s192)
    mm = [n for n in priced.nodes if n.target == "aten.mm.default"]
    assert priced.provenance.extra["matched_nodes"] == [len(ref.nodes) - len(mm), len(ref.nodes)]
    per_byte = [n.time_s / b for n, b in zip(priced.nodes, _io_bytes(priced)) if n.target == "aten.mm.default"]
    assert len(mm) > 2 and max(per_byte) - min(per_byte) <= 1e-9 * max(per_byte)
    assert sum(n.time_s for n in mm) < 1e-3 * len(mm)       # 3/4 of the batch: less than the profiled time


def test_other_sequence_length_and_infeasible_shape_named():
    """Other sequence lengths get plans of their own within the example's
    budget bytes, and loss and gradients equal eager's; a shape no plan fits
    within them raises InfeasibleBudgetError naming it."""
    torch.manual_seed(0)
    model = TinyLM()
    ref = copy.deepcopy(model)
    om = optimize(model, (), 0.8, solver="libra", example_kwargs=lm_batch(8, 32, 0), profile=False)
    for t in (32, 24, 16):
        b = lm_batch(8, t, t)
        loss, ref_loss = om(**b), ref(**b)
        loss.backward(), ref_loss.backward()
        assert torch.equal(loss, ref_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(ref)))
        model.zero_grad(), ref.zero_grad()
    assert len(om.shape_plans) == 2 and all(sp.plan.peak_bytes <= om.budget_bytes for sp in om.shape_plans.values())
    shape = r"at input shapes \[\[8, 256\], \[8, 256\], \[8, 256\]\]"
    with pytest.raises(InfeasibleBudgetError, match="smallest feasible budget.*" + shape):
        om(**lm_batch(8, 256, 0))                             # its attention scores alone exceed the budget


def test_enclosing_autocast_picks_the_dtype():
    """optimize and the calls inside ``torch.autocast(cpu, bfloat16)`` without
    autocast_dtype: the plan is made under bfloat16 (the key says so) and
    trains exactly as with autocast_dtype=torch.bfloat16; outside the
    autocast the same module makes a float32 plan, equal to eager float32."""
    model, twin, ref = mlp(), mlp(), mlp()
    x = torch.randn(256, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        om = optimize(model, x, 0.9, solver="libra", loss_fn=square_loss, profile=False)
        loss = om(x)
    explicit = optimize(twin, x, 0.9, solver="libra", loss_fn=square_loss, profile=False,
                        autocast_dtype=torch.bfloat16)
    assert om.autocast_dtype == torch.bfloat16 and om.example_key[2] == "torch.bfloat16"
    assert not om.shape_plans                               # the call inside matched the example's key
    loss.backward()
    twin_loss = explicit(x)
    twin_loss.backward()
    assert torch.equal(loss, twin_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(twin)))
    model.zero_grad()
    loss32 = om(x)                                          # no autocast around the call: a float32 plan
    loss32.backward()
    ref_loss = square_loss(ref(x))
    ref_loss.backward()
    assert torch.equal(loss32, ref_loss) and [k[2] for k in om.shape_plans] == ["None"]
    assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(ref)))


def test_padding_to_a_bucket_keeps_loss_and_gradients():
    """Sequences of 21 and 27 tokens padded to the 32 bucket (attention mask
    0, labels -100): one plan, and the loss and gradients equal the unpadded
    eager step's (to float32 rounding: softmax and the mean sum more zeros)."""
    torch.manual_seed(0)
    model = TinyLM()
    ref = copy.deepcopy(model)
    pads = {"input_ids": 0, "attention_mask": 0, "labels": -100}
    om = optimize(model, (), 0.8, solver="libra", example_kwargs=pad_to_bucket(lm_batch(8, 30, 0), [16, 32],
                                                                             pad_values=pads), profile=False)
    for t in (21, 27):
        raw = lm_batch(8, t, t)
        padded = pad_to_bucket(raw, [16, 32], pad_values=pads)
        assert padded["input_ids"].shape == (8, 32) and (padded["labels"][:, t:] == -100).all()
        loss, ref_loss = om(**padded), ref(**raw)
        loss.backward(), ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        for a, b in zip(grads(model), grads(ref)):
            torch.testing.assert_close(a, b)
        model.zero_grad(), ref.zero_grad()
    assert not om.shape_plans                               # every batch had the example's bucket shape
    with pytest.raises(ShapeMismatchError, match="largest bucket 32"):
        pad_to_bucket(lm_batch(2, 40, 0), [16, 32])


def test_restart_reuses_saved_profile_and_plan(tmp_path, monkeypatch):
    """optimize with a cache_dir profiles and solves once; a fresh optimize of
    the same model (a restart) calls neither the profiler nor the solver and
    gets the same plan, also for a shape planned after the first.  A corrupt or stale entry warns (naming the field)
    and is made again."""
    calls = {"profile": 0, "solve": 0}
    orig_profile = libra_opt.frontend.profiling.profile_step

    def spy_profile(*a, **k):
        calls["profile"] += 1
        return orig_profile(*a, warmup=0, repeats=1)

    import libra_opt.solvers as solvers
    orig_solve = solvers.solve

    def spy_solve(*a, **k):
        calls["solve"] += 1
        return orig_solve(*a, **k)

    monkeypatch.setattr(libra_opt.frontend.profiling, "profile_step", spy_profile)
    monkeypatch.setattr(solvers, "solve", spy_solve)
    x = torch.randn(256, 16)
    first = optimize(small(), x, 0.9, solver="libra", loss_fn=square_loss, cache_dir=tmp_path)
    assert calls == {"profile": 1, "solve": 1}
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["plan", "profile"]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))           # the environment variable names the same dir
    again = optimize(small(), x, 0.9, solver="libra", loss_fn=square_loss)
    assert calls == {"profile": 1, "solve": 1}
    assert again.plan.schedule.instructions == first.plan.schedule.instructions
    assert again.plan.peak_bytes == first.plan.peak_bytes and "loaded from" in again.plan.message
    assert again(x).item() == first(x).item()
    assert pickle.loads(pickle.dumps(again)).planner.solve_fn.__self__.root == tmp_path   # still pickles
    # the plan of a new shape (a short last batch) is saved too: a restart loads it instead of solving
    assert calls["solve"] == 1 and again(x[:200]).item() == square_loss(small()(x[:200])).item()
    assert calls["solve"] == 2
    restarted = optimize(small(), x, 0.9, solver="libra", loss_fn=square_loss)
    restarted(x[:200])
    assert calls == {"profile": 1, "solve": 2}
    (sp,) = restarted.shape_plans.values()
    assert sp.plan.schedule.instructions == next(iter(again.shape_plans.values())).plan.schedule.instructions
    # a stale profile (another torch version in its key): a warning naming the field, profiled again
    (prof,) = tmp_path.glob("profile-*")
    store = PlanStore(tmp_path)
    import gzip
    d = json.loads(gzip.decompress(prof.read_bytes()))
    d["provenance"]["extra"]["cache_key"]["torch"] = "0.0"
    prof.write_bytes(gzip.compress(json.dumps(d).encode()))
    with pytest.warns(PlanCacheWarning, match=r"stale: its key differs in torch \(saved '0.0'"):
        optimize(small(), x, 0.9, solver="libra", loss_fn=square_loss, cache_dir=store.root)
    assert calls["profile"] == 2
    # corrupt plan files: a warning, solved again (the profile saved just above is loaded)
    for plan in tmp_path.glob("plan-*"):
        plan.write_text("{not json")
    solves = calls["solve"]
    with pytest.warns(PlanCacheWarning, match="corrupt"):
        optimize(small(), x, 0.9, solver="libra", loss_fn=square_loss, cache_dir=tmp_path)
    assert calls["profile"] == 2 and calls["solve"] == solves + 1
    assert PlanStore.open(False) is None and PlanStore.open(None).root == tmp_path   # False: off despite the variable


def test_many_shapes_stay_below_dynamos_recompile_limit():
    """Three batch sizes with TorchDynamo's recompile limits at 1 and 2: each
    shape compiles a code object of its own, so every call runs its plan (none
    falls back to eager) and matches eager PyTorch.  With max_shapes=1 a new
    shape is refused with ShapeMismatchError."""
    model, ref = small(), small()
    om = optimize(model, torch.randn(64, 16), 1.0, solver="none", loss_fn=square_loss, profile=False)
    with torch._dynamo.config.patch(recompile_limit=1, accumulated_recompile_limit=2):
        for b in (64, 32, 16, 32):
            x = torch.randn(b, 16)
            loss, ref_loss = om(x), square_loss(ref(x))
            loss.backward(), ref_loss.backward()
            assert torch.equal(loss, ref_loss)
            assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(ref)))
            model.zero_grad(), ref.zero_grad()
    assert sorted(k[1][0][1][0] for k in om.shape_plans) == [16, 32]
    fixed = optimize(small(), torch.randn(64, 16), 1.0, solver="none", loss_fn=square_loss, profile=False,
                     max_shapes=1)
    with pytest.raises(ShapeMismatchError, match=r"input shapes \[\[32, 16\]\].*max_shapes=1"):
        fixed(torch.randn(32, 16))


@pytest.mark.cuda
def test_short_last_batch_on_cuda_under_inductor_within_the_budget():
    """GPT-2 (tiny) on CUDA, Inductor executor: a batch of 5 after an example
    of 16 gets a plan of its own, compiled by Inductor; its loss is eager's
    (to Inductor's rounding) and its allocated peak stays within the budget
    bytes resolved at the example."""
    from libra_opt.apps.zoo import build_model

    zm = build_model("gpt2-tiny", 16, 128, device="cuda", seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 0.6, solver="libra", example_kwargs=zm.kwargs, loss_fn=zm.loss_fn)
    assert om.executor == "inductor"
    small = {k: (v[:5] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in zm.kwargs.items()}
    args = tuple(a[:5] if isinstance(a, torch.Tensor) else a for a in zm.args)
    for _ in range(2):                        # the first call plans and compiles; the second is measured
        for p in zm.model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = om(*args, **small)
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    assert peak <= om.budget_bytes, (peak, om.budget_bytes)
    out = ref(*args, **small)
    ref_loss = out if zm.loss_fn is None else zm.loss_fn(out)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-3, atol=1e-4)
    (sp,) = om.shape_plans.values()
    assert sp.inductor is not None and "forward" in sp.inductor.compiled


def test_readme_loop_trains_like_eager_and_a_restart_loads_its_plans(tmp_path, monkeypatch):
    """The README's "Varying shapes and saved plans" loop, run as written: a
    loader with a short last batch trains with parameters bitwise equal to the
    same loop without libra-opt; run again in a fresh model (a restart) it
    neither profiles nor solves, loading the saved profile and both plans."""
    import re
    from pathlib import Path

    import libra_opt.solvers as solvers

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text[text.index("### Varying shapes and saved plans\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    data = torch.randn(456, 16, generator=torch.Generator().manual_seed(3))

    def run():
        ns = {"net": mlp(), "loss_fn": square_loss, "cache_dir": tmp_path,
              "loader": torch.utils.data.DataLoader(data, batch_size=256)}
        exec(code, ns)
        return ns["net"], ns["model"]

    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x in torch.utils.data.DataLoader(data, batch_size=256):
        square_loss(ref(x)).backward(), ref_opt.step(), ref_opt.zero_grad()
    net, model = run()
    assert len(model.shape_plans) == 1                      # batch 200: a plan of its own
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))
    calls = []
    monkeypatch.setattr(libra_opt.frontend.profiling, "profile_step", lambda *a, **k: calls.append("profile"))
    orig_solve = solvers.solve
    monkeypatch.setattr(solvers, "solve", lambda *a, **k: calls.append("solve") or orig_solve(*a, **k))
    net2, model2 = run()
    assert calls == []                                      # the restart loaded the profile and both plans
    assert model2.plan.schedule.instructions == model.plan.schedule.instructions
    assert all(torch.equal(a, b) for a, b in zip(net2.parameters(), ref.parameters()))
