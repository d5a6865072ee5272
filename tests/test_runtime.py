"""The runtime (issue 5) on CPU: every solver's plans execute with the loss and
every parameter gradient equal to eager PyTorch's, the measured peak of live
storages equal to the simulated peak, BatchNorm statistics updated once per
step, and the optimized module behaving like the model."""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from libra_opt.errors import InfeasibleBudgetError, RuntimeExecutionError, SolverUnavailableError
from libra_opt.optimize import optimize, problem_of
from libra_opt.ir.problem import INPUT
from libra_opt.runtime.executor import measure_step_peak
from libra_opt.runtime.partition import lower_plan, run_lowered
from libra_opt.runtime.swap import HostBufferPool, SwapManager
from libra_opt.ir.schedule import Compute, Free, Op, Schedule, SwapIn, SwapOut, Wait, no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, resident_at, simulate
from libra_opt.solvers import solve
from libra_opt.solvers.registry import BUILTIN_SOLVERS
from libra_opt.apps.zoo import build_model
from test_capture import captured  # shares the session's captures (tests/ is on sys.path)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

RUNTIME_ARCHS = ["gpt2", "bert", "resnet", "llama"]   # dropout, dropout, BatchNorm, GQA decoder
SOLVERS = list(BUILTIN_SOLVERS)   # none, checkpoint-all, chen-sqrt, chen-greedy, swap-all, checkmate-*, libra
BUDGETS = [0.9, 0.6]
#: keep the MILP/LP small and bounded so the suite stays fast
SOLVER_OPTIONS = {"checkmate-milp": dict(time_limit_s=5.0, max_nodes=40),
                  "checkmate-lp": dict(time_limit_s=10.0, max_nodes=60)}


# ---------------------------------------------------------------- helpers
class Case:
    """A captured tiny architecture with its eager reference (loss, gradients)."""

    def __init__(self, arch):
        zm, step = captured(arch)
        self.zm, self.step = zm, step
        self.problem = problem_of(step, profile=False)
        ref = copy.deepcopy(zm.model)
        torch.manual_seed(1234)
        loss = zm.loss_fn(ref(*zm.args, **zm.kwargs))
        loss.backward()
        self.loss = loss.detach()
        grads = {id(p): p.grad for p in ref.parameters()}
        own = dict(zip((id(p) for p in zm.model.parameters()), (id(p) for p in ref.parameters())))
        # reference gradient per primal index (None for non-parameters)
        self.ref_grads = [grads[own[id(t)]] if id(t) in own else None for t in step.primals]

    def run(self, schedule):
        low = lower_plan(self.step.joint, self.step.num_fwd_outputs, self.problem, schedule, SwapManager("cpu"))
        torch.manual_seed(1234)
        tracked = measure_step_peak(lambda: run_lowered(low, self.step.primals, self.step.tangents))
        fwd, grads = tracked.result
        return low, fwd, grads, tracked.peak_bytes

    def assert_matches_eager(self, fwd, grads):
        # The joint graph holds the very aten ops eager autograd runs, in the same order, consuming the RNG
        # identically (dropout masks match): results are bitwise equal, no tolerance needed.
        loss = next(v for v in fwd if isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point())
        assert torch.equal(loss, self.loss)
        n = 0
        for g, ref in zip(grads, self.ref_grads):
            if ref is None:
                continue
            assert g is not None and torch.equal(g, ref)
            n += 1
        assert n == sum(1 for k in self.step.primal_kinds if k == "parameter")


_CASES: dict[str, Case] = {}


@pytest.fixture(params=RUNTIME_ARCHS)
def case(request):
    if request.param not in _CASES:
        _CASES[request.param] = Case(request.param)
    return _CASES[request.param]


def _solver_or_skip(name):
    mod = BUILTIN_SOLVERS[name].split(":")[0]
    if importlib.util.find_spec(mod) is None:
        pytest.skip(f"solver {name!r}: its module {mod} is not written yet")


def _solve_feasible(problem, fraction, solver):
    """Solve at ``fraction`` of the no-remat peak; if the solver proves that
    infeasible, check what it says and solve at the smallest budget it reports."""
    opts = SOLVER_OPTIONS.get(solver, {})
    try:
        return solve(problem, fraction, solver, **opts)
    except SolverUnavailableError as e:
        pytest.skip(str(e))
    except InfeasibleBudgetError as e:
        assert e.budget_bytes <= no_remat_peak(problem)
        floor = e.min_feasible_bytes if e.min_feasible_bytes is not None else no_remat_peak(problem)
        assert floor > e.budget_bytes
        return solve(problem, int(floor), solver, **opts)


# ---------------------------------------------------------------- every solver, every architecture
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_plan_executes_like_eager(case, solver, budget):
    _solver_or_skip(solver)
    if solver == "hybrid-milp" and case.problem.num_nodes > 250:
        pytest.skip(f"hybrid-milp is exact and never coarsens: {case.problem.num_nodes} nodes > its max_nodes "
                    f"(test_hybrid_milp_plan_executes_like_eager runs it on a small model)")
    res = _solve_feasible(case.problem, budget, solver)
    low, fwd, grads, peak = case.run(res.schedule)
    case.assert_matches_eager(fwd, grads)
    # the measured peak of live storages is the simulated one (the CPU stand-in for max_memory_allocated)
    assert abs(peak - res.peak_bytes) <= 0.05 * res.peak_bytes, (peak, res.peak_bytes)
    assert peak <= res.budget_bytes * 1.05
    # the plan's remat decisions reached the graphs
    if res.schedule.counts()["swap_out"]:
        assert low.swapped
    if res.schedule.recomputed_nodes():
        assert low.recomputed



def test_hybrid_milp_plan_executes_like_eager():
    """hybrid-milp's plan (keep / recompute / swap, exact) on a small MLP trains
    like eager PyTorch, bitwise; its simulated peak is within the solver budget."""
    from torch import nn

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))

    model, ref = mlp(), mlp()
    x = torch.randn(128, 16)
    om = optimize(model, x, 0.95, solver="hybrid-milp", loss_fn=lambda y: (y * y).mean(), profile=False,
                  executor="eager", time_limit_s=20)
    assert om.plan.solver == "hybrid-milp" and om.plan.peak_bytes <= om.plan.budget_bytes
    loss, ref_loss = om(x), (ref(x) ** 2).mean()
    loss.backward(), ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters()))


def test_early_regeneration_and_retention_execute_like_eager(case):
    """The two decisions beyond keep / recompute / swap, on a real model: a storage recomputed
    early (before a node that does not read it, then kept to its use) and a tensor retained past
    its last use to the end of the step.  Gradients stay bitwise eager's and the measured peak is
    the simulated one."""
    from libra_opt.passes.lowering import Eviction, Policy, Retain, default_windows, lower

    p = case.problem
    wins = default_windows(p)
    early = next(((s, a, b) for s, (a, b) in sorted(wins.items(), key=lambda kv: -p.tensors[kv[0]].nbytes)
                  if b - a >= 3 and p.nodes[p.tensors[s].producer].recomputable
                  and len(p.storage_views[s]) == 1), None)
    assert early is not None
    s, a, b = early
    q = (a + b) // 2 + 1
    kept = next(t.id for t in p.tensors if t.kind != INPUT and t.id not in p.output_set and t.consumers
                and t.storage != s and t.storage not in wins and t.consumers[-1] < p.num_nodes - 2)
    sched = lower(p, [Eviction(s, a, q, Policy.RECOMPUTE, regenerate=(s,)), Retain(kept, p.num_nodes - 2)])
    assert sched.meta["retained"] == [[kept, p.num_nodes - 2]]
    assert p.tensors[s].producer in sched.recomputed_nodes()
    sim = simulate(p, sched)
    low, fwd, grads, peak = case.run(sched)
    case.assert_matches_eager(fwd, grads)
    assert low.recomputed
    assert abs(peak - sim.peak_bytes) <= 0.05 * sim.peak_bytes, (peak, sim.peak_bytes)


def test_swapped_retention_executes_like_eager(case):
    """A swapped retention (``Retain(swap=True)``) on a real model: a tensor copied out once made,
    freed after its last use and swapped back in for the recomputation chain that reads it (or,
    where no chain reads one, for the chain position at the end of the step).  Gradients stay
    bitwise eager's and the measured peak is the simulated one."""
    from libra_opt.passes.lowering import Eviction, Policy, Retain, default_windows, lower

    p = case.problem
    tab = p.tables

    def swappable(t, before):
        return (tab.t_freeable[t] and tab.t_storage[t] == t and len(p.storage_views[t]) == 1
                and t in tab.uses and tab.uses[t][-1] < before)

    plan = next(([Eviction(s, a, b, Policy.RECOMPUTE), Retain(t, b, swap=True)]
                 for s, (a, b) in sorted(default_windows(p).items())
                 if p.nodes[p.tensors[s].producer].recomputable
                 for t in p.nodes[p.tensors[s].producer].inputs if swappable(t, b)), None)
    if plan is None:
        t = next(t.id for t in p.tensors if t.kind != INPUT and swappable(t.id, p.num_nodes - 2))
        plan = [Retain(t, p.num_nodes - 2, swap=True)]
    sched = lower(p, plan)
    t = plan[-1].tensor
    assert sched.meta["swap_retained"] == [[t, plan[-1].until]]
    copies = [i.op for i in sched if i.arg == t and i.op in (Op.SWAP_OUT, Op.SWAP_IN)]
    assert copies.count(Op.SWAP_OUT) == 1 and copies.count(Op.SWAP_IN) >= 1   # a chain may read it earlier too
    sim = simulate(p, sched)
    low, fwd, grads, peak = case.run(sched)
    case.assert_matches_eager(fwd, grads)
    assert abs(peak - sim.peak_bytes) <= 0.05 * sim.peak_bytes, (peak, sim.peak_bytes)


# ---------------------------------------------------------------- hand-made plans
def _saved_candidates(p, schedule):
    """Activation bases saved for backward (forward and backward readers),
    without views, not outputs: (tensor, last forward reader, first backward reader)."""
    out = []
    for t in p.tensors:
        if t.kind == INPUT or t.is_view or t.id in p.output_set or len(p.storage_views[t.id]) > 1:
            continue
        fw = [c for c in t.consumers if c < p.boundary]
        bw = [c for c in t.consumers if c >= p.boundary]
        if fw and bw and t.nbytes > 0:
            out.append((t.id, fw[-1], bw[0]))
    return out


def _hand_schedule(p, recompute, swap):
    """Edit the no-remat plan by hand: a recomputed tensor is freed after its
    last forward reader and its producer computed again before its first
    backward reader; a swapped tensor is copied out right after it is made,
    freed after its last forward reader, copied back and waited for before its
    first backward reader."""
    base = no_remat_schedule(p).instructions
    before: dict[int, list] = {}
    after: dict[int, list] = {}
    for t, last_fw, first_bw in recompute:
        after.setdefault(last_fw, []).append(Free(t))
        before.setdefault(first_bw, []).append(Compute(p.tensors[t].producer))
    for t, last_fw, first_bw in swap:
        after.setdefault(p.tensors[t].producer, []).insert(0, SwapOut(t))
        after.setdefault(last_fw, []).append(Free(t))
        before.setdefault(first_bw, []).extend([SwapIn(t), Wait(t)])
    out = []
    for ins in base:
        if ins.op == Op.COMPUTE:
            out.extend(before.get(ins.arg, []))
            out.append(ins)
            out.extend(after.get(ins.arg, []))
        else:
            out.append(ins)
    return Schedule(out, {"solver": "hand"})


def test_hand_made_recompute_and_swap_plan():
    c = _CASES.setdefault("gpt2", Case("gpt2"))
    p = c.problem
    cands = _saved_candidates(p, no_remat_schedule(p))
    nr = no_remat_schedule(p)
    # recompute: producers that are deterministic and whose inputs stay resident until the backward use
    pos = {ins.arg: k for k, ins in enumerate(nr.instructions) if ins.op == Op.COMPUTE}
    rec = []
    for t, last_fw, first_bw in cands:
        prod = p.nodes[p.tensors[t].producer]
        if not prod.recomputable:
            continue
        live = resident_at(p, nr, pos[first_bw] - 1)
        if all(p.tensors[i].kind == INPUT or i in live for i in prod.inputs):
            rec.append((t, last_fw, first_bw))
    rec = rec[:3]
    swp = [c3 for c3 in cands if c3[0] not in {r[0] for r in rec}][:3]
    assert len(rec) >= 2 and len(swp) == 3
    sched = _hand_schedule(p, rec, swp)
    sim = simulate(p, sched)
    assert sim.d2h_bytes == sum(p.tensors[t].nbytes for t, _, _ in swp)
    low, fwd, grads, peak = c.run(sched)
    c.assert_matches_eager(fwd, grads)
    assert peak == sim.peak_bytes
    assert {p.nodes[p.tensors[t].producer].name for t, _, _ in rec} <= set(low.recomputed)
    assert {p.tensors[t].name for t, _, _ in swp} == set(low.swapped)
    # recomputed tensors are not saved for backward; swapped ones are saved as host buffers
    saved = set(low.saved)
    assert not {p.tensors[t].name for t, _, _ in rec} & saved
    assert {p.tensors[t].name + "_host" for t, _, _ in swp} <= saved


def test_plan_reading_a_freed_tensor_is_rejected():
    c = _CASES.setdefault("gpt2", Case("gpt2"))
    p = c.problem
    t, last_fw, first_bw = _saved_candidates(p, no_remat_schedule(p))[0]
    base = no_remat_schedule(p).instructions
    k = next(i for i, ins in enumerate(base) if ins == Compute(last_fw))
    bad = Schedule(base[:k + 1] + [Free(t)] + base[k + 1:])
    with pytest.raises(RuntimeExecutionError, match=p.tensors[t].name):
        lower_plan(c.step.joint, c.step.num_fwd_outputs, p, bad, SwapManager("cpu"))


def test_plan_for_another_graph_is_rejected():
    c = _CASES.setdefault("gpt2", Case("gpt2"))
    other = _CASES.setdefault("llama", Case("llama"))
    with pytest.raises(RuntimeExecutionError, match="different graph"):
        lower_plan(c.step.joint, c.step.num_fwd_outputs, other.problem, no_remat_schedule(other.problem))


# ---------------------------------------------------------------- the optimized module
def _first_available(*names):
    for n in names:
        if importlib.util.find_spec(BUILTIN_SOLVERS[n].split(":")[0]) is not None:
            return n
    pytest.skip(f"none of the solvers {names} is written yet")


def test_optimize_gpt2_trains_like_eager():
    solver = _first_available("libra", "chen-sqrt")
    zm = build_model("gpt2-tiny", 4, dropout=0.1, seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 0.6, solver=solver, example_kwargs=zm.kwargs, profile=False)
    assert om.plan.schedule is not None and om.plan.peak_bytes <= om.plan.budget_bytes
    opt = torch.optim.AdamW(om.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for _ in range(2):
        torch.manual_seed(7)
        out = om(*zm.args, **zm.kwargs)
        assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"   # the ModelOutput survives
        out.loss.backward()
        torch.manual_seed(7)
        ref_out = ref(*zm.args, **zm.kwargs)
        ref_out.loss.backward()
        assert torch.equal(out.loss, ref_out.loss) and torch.equal(out.logits, ref_out.logits)
        for a, b in zip(zm.model.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad)
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    assert om.lowered is not None and (om.lowered.recomputed or om.lowered.swapped)
    # the whole step through torch.compile + AOTAutograd allocates what the simulator predicts
    def step():
        opt.zero_grad(set_to_none=True)
        out = om(*zm.args, **zm.kwargs)          # outputs (loss, logits) are live to the end, as in the plan
        out.loss.backward()
        return out

    peak = measure_step_peak(step, module=om).peak_bytes
    assert abs(peak - om.plan.peak_bytes) <= 0.05 * om.plan.peak_bytes, (peak, om.plan.peak_bytes)
    # another sequence length: a plan of its own (captured there, priced from the first problem), as eager
    ids = zm.kwargs["input_ids"][:, :16]
    torch.manual_seed(7)
    loss = om(input_ids=ids, labels=ids.clone()).loss
    torch.manual_seed(7)
    assert torch.equal(loss, ref(input_ids=ids, labels=ids.clone()).loss) and len(om.shape_plans) == 1
    # inference runs without a plan
    with torch.no_grad():
        assert om(*zm.args, **zm.kwargs).loss.shape == ()


def test_batchnorm_running_stats_updated_once_per_step():
    """ResNet with BatchNorm under a plan that recomputes BatchNorm nodes in the
    backward: after 3 SGD steps, running statistics and parameters equal eager's."""
    zm = build_model("resnet-tiny", 8, seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 0.75, solver="checkpoint-all", example_kwargs=zm.kwargs,
                  loss_fn=zm.loss_fn, profile=False)
    opt = torch.optim.SGD(om.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = om(*zm.args, **zm.kwargs)               # with loss_fn the module returns the loss
        loss.backward()
        opt.step(), opt.zero_grad()
        ref_loss = zm.loss_fn(ref(*zm.args, **zm.kwargs))
        ref_loss.backward()
        ref_opt.step(), ref_opt.zero_grad()
        assert torch.equal(loss, ref_loss)
    assert any("batch_norm" in n for n in om.lowered.recomputed), om.lowered.recomputed
    sd, ref_sd = zm.model.state_dict(), ref.state_dict()
    for k in sd:
        assert torch.equal(sd[k], ref_sd[k]), k
    assert int(sd[next(k for k in sd if k.endswith("num_batches_tracked"))]) == 3


def test_optimize_with_swaps_runs_on_cpu_and_reuses_host_buffers():
    zm = build_model("llama-tiny", 4, seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 0.9, solver="swap-all", example_kwargs=zm.kwargs, profile=False)
    assert om.plan.schedule.counts()["swap_out"] > 0
    for _ in range(2):
        out = om(*zm.args, **zm.kwargs)
        out.loss.backward()
        ref_out = ref(*zm.args, **zm.kwargs)
        ref_out.loss.backward()
        for a, b in zip(zm.model.parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad)
            a.grad = b.grad = None
    # one host chunk, reserved from the plan; the second step reused its buffers
    assert om.swap.pool.chunks == 1
    assert om.swap.d2h_bytes == 2 * om.plan.simulation.d2h_bytes
    # host buffers are reused after their last reload: keeping the graph for a second backward is refused
    # (by AOTAutograd's donated-buffer check, or by the runtime's own check before a reload)
    out = om(*zm.args, **zm.kwargs)
    with pytest.raises(RuntimeError, match="retain_graph"):
        out.loss.backward(retain_graph=True)


def test_optimize_under_autocast_bf16():
    """Captured and run under torch.autocast(bfloat16): the casts are explicit
    graph ops, so the plan's gradients equal eager autocast's bitwise."""
    zm = build_model("gpt2-tiny", 4, seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 0.6, solver=_first_available("libra", "swap-all"), example_kwargs=zm.kwargs,
                  autocast_dtype=torch.bfloat16, profile=False)
    out = om(*zm.args, **zm.kwargs)
    out.loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_out = ref(*zm.args, **zm.kwargs)
    ref_out.loss.backward()
    assert out.logits.dtype == torch.bfloat16 and torch.equal(out.loss, ref_out.loss)
    for a, b in zip(zm.model.parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_host_buffer_pool_reuses_released_buffers():
    pool = HostBufferPool(pin=False, chunk_bytes=4096)
    a = pool.acquire(1000)
    b = pool.acquire(100)
    assert a.numel() == 1000 and b.numel() == 100 and pool.chunks == 1
    pool.release(a)
    assert pool.acquire(1000).data_ptr() == a.data_ptr()
    pool.acquire(8192)           # too big for the chunk: a new one
    assert pool.chunks == 2


def test_swap_manager_cpu_round_trip_keeps_views_and_offsets():
    mgr = SwapManager("cpu")
    base = torch.randn(6, 8)
    t = base[1:, 2:]                                  # a strided view with an offset
    host = mgr.offload(t)
    assert host.numel() == base.numel() * 4
    back = mgr.wait(mgr.reload(host, t.dtype, list(t.shape), list(t.stride()), t.storage_offset(), True))
    assert torch.equal(back, t) and back.stride() == t.stride()
    assert back.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
