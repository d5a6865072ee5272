"""libra-opt as a ``torch.compile`` backend (issue 15, torch.compile part) and
``torch.compile`` of an optimized module.

The README's "Use it with torch.compile" code trains like the same loop
without libra-opt (bitwise, eager executor on CPU); plans honour the budget in
the simulator; an infeasible budget raises at the first call with the
smallest feasible one; a graph break, a new input shape and a ``no_grad``
call are handled; the Inductor executor is as close to eager as
``torch.compile`` comes.  Tiny MLPs at batch 256: activations dominate the
gradients, so a plan has something to evict."""
from __future__ import annotations

import copy
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import libra_opt
from libra_opt.errors import BudgetError, CaptureError, ExecutorError, InfeasibleBudgetError, SolverNotFoundError
from libra_opt.passes.simulator import no_remat_peak, simulate

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles ``nn.Sequential.forward``: TorchDynamo's cache entries for one code
    object count against ``recompile_limit`` across tests, so start each test from an empty cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp(depth: int = 6, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(depth)], nn.Linear(16, 1))


def _x(batch: int = 256) -> torch.Tensor:
    return torch.randn(batch, 16, generator=torch.Generator().manual_seed(1))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _assert_step_like_eager(compiled, model: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    """One training step of ``compiled`` (compiling ``model``) and of the plain ``ref``: the loss and
    every gradient bitwise equal (the eager executor on CPU)."""
    loss = _loss(compiled(x))
    loss.backward()
    ref_loss = _loss(ref(x))
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(g, r) for g, r in zip(_grads(model), _grads(ref)))


def _assert_plans_honour_budget(be) -> None:
    """Every plan is accepted by the simulator within its graph's budget and evicts something."""
    assert be.plans
    for g in be.graphs:
        if g.plan is None:
            continue
        sim = simulate(g.problem, g.plan.schedule, budget=g.budget_bytes)
        assert sim.peak_bytes <= g.budget_bytes
        assert g.plan.peak_bytes < no_remat_peak(g.problem)       # the plan really remats
        assert g.lowered.recomputed or g.lowered.swapped


# ---------------------------------------------------------------- the README's code
def _readme_code() -> str:
    text = README.read_text()
    section = text.split("### Use it with torch.compile", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_code_trains_like_the_loop_without_libra_opt():
    code = _readme_code()
    compile_line = "compiled = torch.compile(model, backend=backend, dynamic=False)"
    assert compile_line in code
    ours: dict = {}
    exec(compile(code, "README.md", "exec"), ours)        # exactly the README's code
    plain: dict = {}
    loop = code.split("plan = backend.plans")[0]            # the same loop without libra-opt (and no plan to print)
    exec(compile(loop.replace(compile_line, "compiled = model"), "README.md", "exec"), plain)
    assert torch.equal(ours["loss"], plain["loss"])          # the last step's loss
    for p, q in zip(ours["model"].parameters(), plain["model"].parameters()):
        assert torch.equal(p, q)                             # equal after 3 SGD steps: equal gradients each step
    be = ours["backend"]
    assert len(be.plans) == 1 and be.graphs[0].executor == "eager"
    assert be.graphs[0].problem.provenance.extra.get("profile")     # profiled (profile=True by default)
    _assert_plans_honour_budget(be)


# ---------------------------------------------------------------- numerics and budget
def test_eager_executor_grads_bitwise_and_plan_in_budget():
    model, ref = _mlp(), _mlp()
    be = libra_opt.backend(0.5, profile=False, executor="eager")
    compiled = torch.compile(model, backend=be, dynamic=False)
    for _ in range(2):
        _assert_step_like_eager(compiled, model, ref, _x())
    assert len(be.plans) == 1
    assert be.graphs[0].budget_bytes == int(0.5 * no_remat_peak(be.graphs[0].problem))
    _assert_plans_honour_budget(be)
    assert "1 plan(s)" in repr(be)


def test_inductor_executor_grads_close_to_eager():
    """Inductor on CPU (needs a C++ compiler; one g++ call per kernel, compile_threads=1 to skip
    the worker pool).  Tolerance: matmuls stay ATen's (``extern_kernels``), fused pointwise
    kernels use vectorized tanh, a few float32 ulps from ATen's, so gradients agree to
    1e-5 of their largest magnitude."""
    from torch._inductor import config

    model, ref = _mlp(depth=4), _mlp(depth=4)
    be = libra_opt.backend(0.6, profile=False, executor="inductor")
    compiled = torch.compile(model, backend=be, dynamic=False)
    with config.patch(compile_threads=1):
        loss = _loss(compiled(_x()))
    loss.backward()
    ref_loss = _loss(ref(_x()))
    ref_loss.backward()
    scale = max(float(g.abs().max()) for g in _grads(ref))
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=0)
    err = max(float((g - r).abs().max()) for g, r in zip(_grads(model), _grads(ref)))
    assert err <= 1e-5 * scale, (err, scale)
    g = be.graphs[0]
    assert g.executor == "inductor" and set(g._inductor.compiled) == {"forward", "backward"}
    _assert_plans_honour_budget(be)


def test_infeasible_budget_raises_at_first_call_with_smallest_feasible():
    model = _mlp()
    be = libra_opt.backend(1000, profile=False)               # bytes: far below what any plan needs
    compiled = torch.compile(model, backend=be, dynamic=False)
    with pytest.raises(InfeasibleBudgetError) as e:
        compiled(_x())
    smallest = e.value.min_feasible_bytes
    assert smallest is not None and smallest > 1000 and "smallest feasible budget" in str(e.value)
    assert be.plans == [] and be.graphs[0].error is e.value
    model.zero_grad()
    be2 = libra_opt.backend(smallest, profile=False)          # the budget it named is feasible
    _loss(torch.compile(model, backend=be2, dynamic=False)(_x())).backward()
    assert be2.plans[0].peak_bytes <= smallest


# ---------------------------------------------------------------- graph breaks, shapes, no_grad
class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(6)])
        self.tail = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)],
                                  nn.Linear(16, 1))

    def forward(self, x):
        h = self.head(x)
        torch._dynamo.graph_break()
        return self.tail(h)


def test_graph_break_trains_like_eager_and_warns_naming_it():
    model, ref = _Broken(), _Broken()
    be = libra_opt.backend(0.8, profile=False)
    compiled = torch.compile(model, backend=be, dynamic=False)
    with pytest.warns(UserWarning, match=r"2 graphs \(1 graph break\(s\); this one: Call to "
                                         r"`torch._dynamo.graph_break\(\)`.*0.8.*own no-remat peak"):
        _assert_step_like_eager(compiled, model, ref, _x())
    assert be.graph_breaks == 1 and len(be.plans) == 2
    assert "graph_break" in be.graphs[0].break_reason and be.graphs[1].break_reason is None
    _assert_plans_honour_budget(be)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # the same break again (no_grad recompile): no new warning
        with torch.no_grad():
            assert torch.equal(compiled(_x()), ref(_x()))


def test_bytes_budget_at_a_graph_break_says_it_applies_per_graph():
    be = libra_opt.backend("1MiB", profile=False)
    with pytest.warns(UserWarning, match="for each graph alone.*may add more"):
        _loss(torch.compile(_Broken(), backend=be, dynamic=False)(_x())).backward()
    assert [g.budget_bytes for g in be.graphs if g.plan] == [1 << 20, 1 << 20]


def test_new_shape_gets_its_own_plan_and_no_grad_runs_without_one():
    model, ref = _mlp(), _mlp()
    be = libra_opt.backend(0.5, profile=False)
    compiled = torch.compile(model, backend=be, dynamic=False)
    with torch.no_grad():                                   # inference first: no plan
        assert torch.equal(compiled(_x(8)), ref(_x(8)))
    assert be.plans == [] and be.graphs[0].executor == "eager"
    for batch in (256, 192):                                 # a dataloader's short last batch
        _assert_step_like_eager(compiled, model, ref, _x(batch))
    assert [p.budget_bytes > 0 for p in be.plans] == [True, True]
    assert [g.problem.provenance.batch for g in be.graphs if g.plan] == [256, 192]


def test_recomputed_dropout_draws_its_forward_mask():
    """A plan that recomputes every dropout in the backward (``checkpoint-all``): the replayed
    masks are the forward's, so losses and gradients stay bitwise equal to eager's."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.2)) for _ in range(4)],
                             nn.Linear(16, 1))

    ours, ref = model(), model()
    be = libra_opt.backend(0.9, solver="checkpoint-all", profile=False)
    compiled = torch.compile(ours, backend=be, dynamic=False)
    for seed in (10, 11):
        torch.manual_seed(seed)
        loss = _loss(compiled(_x()))
        loss.backward()
        torch.manual_seed(seed)
        ref_loss = _loss(ref(_x()))
        ref_loss.backward()
        assert torch.equal(loss, ref_loss)
        assert all(torch.equal(g, r) for g, r in zip(_grads(ours), _grads(ref)))
    assert sum(n.startswith("native_dropout") for n in be.graphs[0].lowered.recomputed) == 4


def test_call_under_autocast_trains_like_eager_autocast():
    model, ref = _mlp(), _mlp()
    be = libra_opt.backend(0.5, profile=False)
    compiled = torch.compile(model, backend=be, dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):       # the casts are traced into the graph and planned
        loss = _loss(compiled(_x()).float())
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss = _loss(ref(_x()).float())
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(g, r) for g, r in zip(_grads(model), _grads(ref)))
    assert be.graphs[0].problem.provenance.dtype == "bfloat16"
    _assert_plans_honour_budget(be)


def test_fake_example_inputs_are_planned_with_zero_stand_ins():
    """A backend may be handed fake tensors (here: TorchDynamo's own ``example_value`` fakes, as a
    wrapping backend would pass them): the step is profiled on zeros of their sizes."""
    model, ref = _mlp(), _mlp()
    be = libra_opt.backend(0.5)

    def with_fakes(gm, example_inputs):
        return be(gm, [n.meta["example_value"] for n in gm.graph.find_nodes(op="placeholder")])

    _assert_step_like_eager(torch.compile(model, backend=with_fakes, dynamic=False), model, ref, _x())
    fixed = be.graphs[0].problem.fixed
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert fixed.parameters_bytes == fixed.gradients_bytes == param_bytes
    assert fixed.inputs_bytes >= _x().numel() * 4
    _assert_plans_honour_budget(be)


def test_symbolic_shapes_are_refused_with_a_hint():
    be = libra_opt.backend(0.5, profile=False)
    compiled = torch.compile(_mlp(), backend=be, dynamic=True)
    with pytest.raises(CaptureError, match="dynamic=False"):
        compiled(_x())


# ---------------------------------------------------------------- construction
def test_arguments_are_checked_before_anything_compiles():
    with pytest.raises(BudgetError, match="did you mean 80% or 80MiB"):
        libra_opt.backend("80")
    with pytest.raises(BudgetError):
        libra_opt.backend(1.5)
    with pytest.raises(ExecutorError, match="'inductor', 'eager'"):
        libra_opt.backend(0.5, executor="tvm")
    with pytest.raises(SolverNotFoundError):
        libra_opt.backend(0.5, solver="no-such-solver")


def test_backend_is_exported_lazily():
    from libra_opt.compile_backend import backend

    assert libra_opt.backend is backend and "backend" in libra_opt.__all__
    code = ("import sys, libra_opt; assert 'libra_opt.compile_backend' not in sys.modules; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- torch.compile(optimized module)
def test_torch_compile_of_optimized_module_warns_and_runs_the_plan():
    model, ref = _mlp(), _mlp()
    om = libra_opt.optimize(model, (_x(),), 0.7, profile=False)
    seen = []

    def outer_backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    compiled = torch.compile(om, backend=outer_backend)
    with pytest.warns(UserWarning, match="does not compile through its plan.*executor='inductor'.*libra_opt.backend"):
        _assert_step_like_eager(compiled, model, ref, _x())
    assert om._ran and not seen                             # the plan ran; the outer backend was never called
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # once per module
        _loss(compiled(_x())).backward()
    torch._dynamo.reset()           # else the cached frame (with its graph break) is reused
    with pytest.raises(torch._dynamo.exc.Unsupported, match="OptimizedModule runs its plan.*libra_opt.backend"):
        torch.compile(om, backend=outer_backend, fullgraph=True)(_x())


# ---------------------------------------------------------------- CUDA: Inductor executor, memory as allocated
@pytest.mark.cuda
def test_cuda_backend_trains_under_inductor_within_the_budget():
    """On a GPU the default executor is Inductor; after the compiling step, a planned step's
    ``max_memory_allocated`` above what was allocated before it stays within the graph's budget
    (the plan is made to the budget less the 5 % allocator margin), and the gradients are within
    10x ``torch.compile``'s own error against eager (as in ``test_runtime_inductor.py``)."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(8)],
                          nn.Linear(256, 1)).to(dev)
    ref, tc = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.randn(4096, 256, device=dev, generator=torch.Generator(dev).manual_seed(1))
    _loss(ref(x)).backward()
    _loss(torch.compile(tc)(x)).backward()
    eager = _grads(ref)
    tc_err = max(float((g - r).abs().max()) for g, r in zip(_grads(tc), eager))
    tol = max(10 * tc_err, 1e-6 * max(float(g.abs().max()) for g in eager))

    be = libra_opt.backend(0.5)
    compiled = torch.compile(model, backend=be, dynamic=False)
    _loss(compiled(x)).backward()                       # compiles, profiles and plans
    err = max(float((g - r).abs().max()) for g, r in zip(_grads(model), eager))
    assert err <= tol, (err, tol)
    model.zero_grad(set_to_none=True)                   # the gradients are graph outputs: inside the budget
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _loss(compiled(x)).backward()
    torch.cuda.synchronize()
    g = be.graphs[0]
    assert g.executor == "inductor" and g.plan.peak_bytes < no_remat_peak(g.problem)
    assert torch.cuda.max_memory_allocated() - before <= g.budget_bytes
