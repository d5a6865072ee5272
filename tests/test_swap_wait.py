"""Swaps that wait for their copy out (issue 12, "Reach: the swap half of the
idea does not show"): a ``Wait`` after ``SwapOut`` (and ``Free``) makes the
compute stream wait for that copy, so that the storage is released there even
where the device-to-host link is slower than the forward pass that fills it.

Covers the IR (format versions, which copy a ``Wait`` waits for), the
simulator (the stall is charged, the bytes released at the wait), the lowering
(``Eviction.out_wait``), the libra estimate (equal to the simulator with such
waits), libra's swap-only mode (plans at the memory floor only with them) and
the runtime (bitwise gradients on CPU through ``optimize``; the CUDA path
skips without a GPU)."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from libra_opt.bounds import memory_lower_bound
from libra_opt.errors import ProblemFileError, ScheduleError
from libra_opt.lowering import Eviction, Policy, default_windows, lower
from libra_opt.problem import BACKWARD, DeviceProfile, ProblemBuilder
from libra_opt.schedule import (SCHEDULE_VERSION, Compute, Free, Op, Schedule, SwapIn, SwapOut, Wait,
                                no_remat_schedule, wait_kinds)
from libra_opt.simulator import no_remat_peak, simulate
from libra_opt.solvers import get_solver
from libra_opt.solvers.base import Solver
from libra_opt.solvers.libra_estimate import REC, SWAP, Timeline
from libra_opt.solvers.result import RawSolution
from test_libra import fwd_bwd   # tests/ is on sys.path


def slow_chain(n=6, nbytes=100, bandwidth=10.0):
    """x -> f0 -> a0 -> ... -> f{n-1} -> a{n-1} -> loss; backward d{i} reads the gradient and
    a{i}.  Every node takes 1 s, every activation is ``nbytes`` bytes and a copy of one takes
    ``nbytes / bandwidth`` s (10 s by default: ten times a forward op)."""
    b = ProblemBuilder()
    acts = [b.input("x", 4)]
    for i in range(n):
        acts += b.op(f"f{i}", [acts[-1]], [(f"a{i}", nbytes)], time_s=1.0)
    (loss,) = b.op("loss", [acts[-1]], [("L", 4)], time_s=1.0)
    g = loss
    for i in reversed(range(n)):
        (g,) = b.op(f"d{i}", [g, acts[i]] if i > 0 else [g], [(f"g{i}", 8)], time_s=1.0, phase=BACKWARD)
    dev = DeviceProfile(h2d_bytes_per_s=bandwidth, d2h_bytes_per_s=bandwidth, copies_overlap_compute=True)
    return b.build(outputs=[loss, g], device=dev)


def out_waits(schedule) -> int:
    """Number of Waits that wait for a swap-out."""
    return sum(1 for op in wait_kinds(schedule.instructions).values() if op == Op.SWAP_OUT)


# ------------------------------------------------------------------ IR and simulator
def test_wait_after_swap_out_stalls_and_releases():
    """f0 makes a0 (100 B, its copy out runs from 1 s to 11 s); a0 is freed after f1 (t = 2 s)
    and waited for: the compute stream stalls 9 s and a0's bytes are gone before f2 allocates
    a2.  Without the wait f2 runs at 2 s with a0 still held (until its copy ends)."""
    p = slow_chain(n=3)
    t = {x.name: x.id for x in p.tensors}
    n = {x.name: x.id for x in p.nodes}
    plan = [Compute(n["f0"]), SwapOut(t["a0"]), Compute(n["f1"]), Free(t["a0"]), Wait(t["a0"]),
            Compute(n["f2"]), Compute(n["loss"]), Free(t["a2"]), Compute(n["d2"]), Free(t["a1"]),
            SwapIn(t["a0"]), Wait(t["a0"]), Compute(n["d1"]), Free(t["a0"]), Free(t["g2"]), Compute(n["d0"]),
            Free(t["g1"])]
    assert wait_kinds(plan) == {4: Op.SWAP_OUT, 11: Op.SWAP_IN}
    r = simulate(p, Schedule(plan))
    assert r.timeline_bytes[4] == 100 and r.timeline_t[5] == pytest.approx(11.0)
    # 9 s for the copy out; the swap-in starts after d2 (14 s) and takes 10 s
    assert r.stall_s == pytest.approx(9.0 + 10.0)
    assert r.peak_bytes == 204   # loss: a1, a2, L
    r2 = simulate(p, Schedule(plan[:4] + plan[5:]))
    assert r2.peak_bytes == 304 and r2.timeline_t[4] == pytest.approx(2.0)   # loss runs with a0 held
    # (the swap-in issued at 5 s waits for the host copy, ready at 11 s)
    assert r2.stall_s == pytest.approx(21.0 - 5.0)


def test_wait_without_a_copy_in_flight_is_rejected():
    p = slow_chain(n=2)
    a0 = next(t.id for t in p.tensors if t.name == "a0")
    with pytest.raises(ScheduleError, match="no copy in flight .*never swapped"):
        simulate(p, Schedule([Compute(0), Wait(a0)]))
    with pytest.raises(ScheduleError, match="already waited for") as e:
        simulate(p, Schedule([Compute(0), SwapOut(a0), Wait(a0), Wait(a0)]))
    assert e.value.index == 3


def test_schedule_format_versions():
    """A plan without swap-out waits is written as version 1 (older readers read it), one with
    them as version 2; both read back; an unknown version says what to do."""
    p = slow_chain()
    plain = no_remat_schedule(p)
    waiting = get_solver("libra", policy="swap").solve(p, memory_lower_bound(p)).schedule
    assert plain.to_dict()["version"] == 1 and waiting.to_dict()["version"] == SCHEDULE_VERSION == 2
    for s in (plain, waiting):
        assert Schedule.from_dict(s.to_dict()) == s
    with pytest.raises(ProblemFileError, match="reads versions 1, 2"):
        Schedule.from_dict(dict(waiting.to_dict(), version=3))


def test_lowering_checks_out_wait():
    p = slow_chain()
    s, (a, b) = next(iter(default_windows(p).items()))
    with pytest.raises(ScheduleError, match="out_wait=.* needs policy swap"):
        lower(p, [Eviction(s, a, b, Policy.RECOMPUTE, out_wait=a + 1)])
    with pytest.raises(ScheduleError, match="out_wait=.* needs policy swap and after"):
        lower(p, [Eviction(s, a, b, Policy.SWAP, out_wait=b)])
    with pytest.raises(ScheduleError, match="issued before its wait"):
        lower(p, [Eviction(s, a, b, Policy.SWAP, out_wait=a + 2, prefetch_after=a)])
    sched = lower(p, [Eviction(s, a, b, Policy.SWAP, out_wait=a + 1)])
    assert out_waits(sched) == 1 and sched.meta["out_waits"] == [[s, a + 1]]


# ------------------------------------------------------------------ libra
def test_swap_only_reaches_the_floor_only_with_waits():
    """Copies take ten forward ops: without waits no swapped storage is released before the
    backward (swap-only and swap-all stay at the no-remat peak); with them swap-only plans at the
    memory floor, paying the stalls; its estimate equals the simulation."""
    p = slow_chain()
    floor, peak = memory_lower_bound(p), no_remat_peak(p)
    assert floor < peak
    assert not get_solver("libra", policy="swap", swap_waits=False).solve(p, floor, raise_on_infeasible=False).success
    assert not get_solver("swap-all").solve(p, floor, raise_on_infeasible=False).success
    r = get_solver("libra", policy="swap").solve(p, floor)
    sim = simulate(p, r.schedule, budget=floor)
    assert sim.peak_bytes == floor and sim.stall_s > 0 and out_waits(r.schedule) > 0
    assert r.extras["estimated_peak_bytes"] == sim.peak_bytes
    assert r.extras["estimated_added_s"] == pytest.approx(sim.added_s)
    assert get_solver("libra").solve(p, floor).peak_bytes <= floor   # hybrid reaches it too


def random_decisions(seed):
    """A random two-phase problem on a slow link and a :class:`Timeline` with random recompute /
    swap decisions, swaps waiting for their copy out at random positions."""
    rng = random.Random(seed)
    p = fwd_bwd(seed, rng.randint(6, 10), views=seed % 2 == 0, bandwidth=rng.choice([4.0, 8.0]))
    wins = sorted((s, a, b) for s, (a, b) in default_windows(p).items())
    tl = Timeline(p, wins)
    for j, (s, a, b) in enumerate(wins):
        r = rng.random()
        if r < 0.3:
            tl.apply(j, REC)
        elif r < 0.8:
            w = rng.randint(a + 1, b - 1) if b - a >= 2 and rng.random() < 0.6 else -1
            tl.apply(j, SWAP, tl.evaluate(j, SWAP, wait=w))
    return p, tl


@pytest.mark.parametrize("seed", range(16))
def test_estimate_matches_the_simulator_with_waits(seed):
    """Random recompute / swap decisions on a slow link, swaps waiting for their copy out at
    random positions: where no swap-in is issued before its copy out ends (the model's
    ``pessimistic`` case), the incremental model's peak and added time equal the simulator's."""
    p, tl = random_decisions(seed)
    sched = lower(p, tl.evictions())
    sim = simulate(p, sched)
    if tl.state.swap.pessimistic:   # the model over-counts there (as without waits)
        assert tl.peak()[0] >= sim.peak_bytes
        return
    assert tl.peak()[0] == sim.peak_bytes
    assert tl.added_s() == pytest.approx(sim.added_s, abs=1e-9)
    assert out_waits(sched) == int((tl.state.swap.wait >= 0).sum())


def test_estimate_cases_with_waits_are_exercised():
    """The seeds above include plans with swap-out waits the model replays exactly."""
    exact = 0
    for seed in range(16):
        _, tl = random_decisions(seed)
        if not tl.state.swap.pessimistic and (tl.state.swap.stall_s > 0).any() and (tl.state.swap.wait >= 0).any():
            exact += 1
    assert exact >= 4


def test_swap_only_plans_resnet50_where_it_could_not():
    """``problems/h100_resnet50_b128`` (H100 profile, 55 GB/s): swap-only used to stop at 0.79
    of the no-remat peak (copies out cannot keep up with the forward); waiting for them, it
    plans 0.5."""
    from pathlib import Path

    from libra_opt import load_problem

    p = load_problem(Path(__file__).parent.parent / "problems" / "h100_resnet50_b128.json.gz")
    r = get_solver("libra", policy="swap").solve(p, 0.5)
    sim = simulate(p, r.schedule, budget=r.budget_bytes)
    assert sim.peak_bytes <= 0.5 * no_remat_peak(p) + 1 and out_waits(r.schedule) > 0


def test_swap_only_bulk_move_reaches_the_floor_where_the_descent_stops():
    """A 16-op chain whose copies take three forward ops each: the swap-only descent alone
    (``portfolio=False``) stops far above the memory floor (each further swap's prefetch pushes
    the queued ones before the backward starts); the bulk move (every window swapped, waiting
    for its copy out, swapped in right before its use) plans at the floor, and a budget between
    the two gets that plan with what it does not need given back: within the budget, no costlier."""
    p = slow_chain(n=16, bandwidth=30.0)
    floor = memory_lower_bound(p)
    alone = get_solver("libra", policy="swap", portfolio=False).solve(p, floor, raise_on_infeasible=False)
    assert not alone.success and alone.min_feasible_bytes > 2 * floor
    r = get_solver("libra", policy="swap").solve(p, floor)
    sim = simulate(p, r.schedule, budget=floor)
    assert sim.peak_bytes <= floor and sim.stall_s > 0 and out_waits(r.schedule) > 0
    mid = (floor + alone.min_feasible_bytes) // 2
    r2 = get_solver("libra", policy="swap").solve(p, mid)
    sim2 = simulate(p, r2.schedule, budget=mid)
    assert sim2.peak_bytes <= mid and sim2.added_s <= sim.added_s


def test_bulk_swap_and_relax_on_the_timeline():
    """``Timeline.swap_bulk`` puts the model at the floor of the chain above in one move, its
    estimate equal to the simulator's; ``relax_swaps`` gives back what a higher budget does not
    need: the estimated peak stays within it, the added time goes down, and the lowered plan
    simulates as estimated."""
    p = slow_chain(n=16, bandwidth=30.0)
    floor = memory_lower_bound(p)
    wins = sorted((s, a, b) for s, (a, b) in default_windows(p).items())
    tl = Timeline(p, wins)
    assert tl.swap_bulk(range(len(wins))) > 0
    sim = simulate(p, lower(p, tl.evictions()))
    assert tl.peak()[0] == sim.peak_bytes == floor
    assert tl.added_s() == pytest.approx(sim.added_s)
    budget = 3 * floor
    before = tl.added_s()
    kept = tl.relax_swaps(budget)
    sim2 = simulate(p, lower(p, tl.evictions()), budget=budget)
    assert kept and tl.added_s() < before
    assert tl.peak()[0] <= budget and sim2.peak_bytes <= budget
    assert tl.added_s() == pytest.approx(sim2.added_s)


# ------------------------------------------------------------------ runtime (CPU)
class _SwapAndWait(Solver):
    """Every default window swapped, each waiting for its copy out right after the
    storage's last forward use (a test solver: plans with swap-out waits on any device)."""

    name = "test-swap-and-wait"
    citation = "test"

    def _solve(self, problem, budget_bytes):
        evs = [Eviction(s, a, b, Policy.SWAP, out_wait=a + 1) for s, (a, b) in default_windows(problem).items()
               if b - a >= 2 and problem.nodes[problem.tensors[s].producer].recomputable]
        return RawSolution(schedule=lower(problem, evs))


def test_lowered_graphs_wait_for_offloads_and_measure_as_simulated():
    """The lowered graphs call ``SwapManager.wait_offload`` once per swap-out wait (of a storage
    with bytes); run on CPU
    under the storage tracker, the measured peak equals the simulated one; with the swap steps
    as ``libra`` operators (the Inductor executor's graphs) they run too."""
    from test_runtime import Case

    from libra_opt.runtime.inductor import with_swap_ops
    from libra_opt.runtime.offload_ops import wait_offload
    from libra_opt.runtime.partition import lower_plan, run_lowered
    from libra_opt.runtime.swap import SwapManager

    c = Case("gpt2")   # its own capture: the shared one of test_runtime stays as that module left it
    p = c.problem
    sched = _SwapAndWait().solve(p, 1.0).schedule
    kinds = wait_kinds(sched.instructions)
    n = sum(1 for k, op in kinds.items() if op == Op.SWAP_OUT and p.tensors[sched[k].arg].nbytes > 0)
    assert n > 0   # (a 0-byte storage, a view of an input, is never copied: nothing to wait for)
    low, fwd, grads, peak = c.run(sched)
    c.assert_matches_eager(fwd, grads)
    assert peak == simulate(p, sched).peak_bytes
    calls = [nd for g in (low.fw.graph, low.bw.graph) for nd in g.nodes
             if nd.op == "call_function" and getattr(nd.target, "__name__", "") == "wait_offload"]
    assert len(calls) == n
    sw = SwapManager("cpu")
    low = lower_plan(c.step.joint, c.step.num_fwd_outputs, p, sched, sw)
    low.fw, low.bw = with_swap_ops(low.fw, sw), with_swap_ops(low.bw, sw)
    ops = [nd for g in (low.fw.graph, low.bw.graph) for nd in g.nodes if nd.target is wait_offload]
    assert len(ops) == n
    torch.manual_seed(1234)
    fwd, grads = run_lowered(low, c.step.primals, c.step.tangents)
    c.assert_matches_eager(fwd, grads)


# ------------------------------------------------------------------ runtime (CUDA)
@pytest.mark.cuda
def test_wait_offload_returns_the_storage_on_cuda():
    """``wait_offload`` makes the compute stream wait for the copy and drops the manager's
    reference: the device storage goes back to the allocator there, and the host copy is right."""
    from libra_opt.runtime.swap import SwapManager

    sw = SwapManager("cuda")
    x = torch.randn(1 << 22, device="cuda")    # 16 MiB
    ref = x.cpu()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    host = sw.offload(x)
    del x
    sw.wait_offload(host)
    assert not sw._offloads and all(e[1] is None for e in sw._inflight)
    assert torch.cuda.memory_allocated() == held - (1 << 24)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(host.view(torch.float32), ref)


@pytest.mark.cuda
@pytest.mark.parametrize("executor", ["eager", "inductor"])
def test_plan_with_swap_out_waits_runs_on_cuda(executor):
    """A plan whose swaps wait for their copies out trains like eager on the GPU (gradients as
    close as the executor allows) with both executors."""
    from libra_opt.optimize import optimize
    from libra_opt.zoo import build_model

    zm = build_model("gpt2-tiny", 8, 64, device="cuda", seed=0)
    ref = copy.deepcopy(zm.model)
    om = optimize(zm.model, zm.args, 1.0, solver=_SwapAndWait(), example_kwargs=zm.kwargs, executor=executor)
    assert out_waits(om.plan.schedule) > 0
    torch.manual_seed(0)
    om(*zm.args, **zm.kwargs).loss.backward()
    torch.manual_seed(0)
    ref(*zm.args, **zm.kwargs).loss.backward()
    om.swap.synchronize()
    assert not om.swap._offloads
    for a, b in zip(zm.model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)


def test_a_waits_slide_adds_no_time_raises_no_point_and_saves_steps(monkeypatch):
    """A swap-only descent moves a swapped window's wait for its copy out to the peak at no added
    time, then slides it further back (``Refiner._slide_wait``): each slide leaves the estimated
    added time as it was, keeps every point under the estimated peak and moves the wait earlier;
    the descent then takes fewer steps than without slides, and its plan passes the simulator
    within the budget (``h100_vit-base_b128`` at 0.5 of its peak: 525 steps without, 129 with)."""
    from libra_opt.ir.problem_io import load_problem
    from libra_opt.solvers.libra.refine import Refiner

    from test_libra_bounds import PROBLEMS

    seen = []
    slide = Refiner._slide_wait

    def recorded(self, j, p):
        tl = self.tl
        before = (tl.added_s(), int(tl.memory().max()), int(tl.state.wait[j]))
        slide(self, j, p)
        seen.append((before, (tl.added_s(), int(tl.memory().max()), int(tl.state.wait[j])), p))

    def solve():
        p = load_problem(PROBLEMS / "h100_vit-base_b128.json.gz")
        r = get_solver("libra", policy="swap").solve(p, 0.5)
        assert simulate(p, r.schedule).peak_bytes <= r.budget_bytes
        return r

    monkeypatch.setattr(Refiner, "_slide_wait", recorded)
    slid = solve()
    assert seen and any(after[2] < p for _, after, p in seen)
    for (cost, top, wait), (cost2, top2, wait2), p in seen:
        assert wait == p and wait2 <= p
        assert cost2 <= cost + 1e-12 and top2 <= top
    monkeypatch.setattr(Refiner, "_slide_wait", lambda self, j, p: None)
    plain = solve()
    assert slid.extras["steps"] < plain.extras["steps"]


def test_the_hybrid_descent_that_waits_does_not_slide_its_waits(monkeypatch):
    """Waits slide in swap-only descents only (``Refiner._slide_wait``): in hybrid mode's descent that
    waits for copies out, a slid wait changed its later choices between recomputing and swapping (the
    shared ``random_layered_n100`` with copies 4x slower than compute at 0.5 of its peak: 225,539 instead
    of 189,729). On a random layered graph of 80 nodes with such copies, at 0.6 of its peak, hybrid's plan
    passes the simulator within the budget, no hybrid descent slides, and the plan is cheaper than where
    that descent slides its waits (0.8 %)."""
    from libra_opt.frontend.generators import random_layered_graph
    from libra_opt.solvers.libra.estimate import SWAP
    from libra_opt.solvers.libra.refine import Refiner

    base = random_layered_graph(80, seed=0)
    peak = simulate(base).peak_bytes
    rate = peak / (4 * base.total_compute_s)
    problem = base.with_device(h2d_bytes_per_s=rate, d2h_bytes_per_s=rate, copies_overlap_compute=True)
    budget = int(0.6 * peak)
    slide, slid_by = Refiner._slide_wait, []

    def recorded(self, j, p):
        slid_by.append(self.opts.policy)
        slide(self, j, p)

    monkeypatch.setattr(Refiner, "_slide_wait", recorded)
    got = get_solver("libra", policy="hybrid").solve(problem.replace(), budget)
    assert simulate(problem, got.schedule).peak_bytes <= budget
    assert "hybrid" not in slid_by

    commit = Refiner._commit

    def sliding(self, mv, p, peak):   # the rule before: every descent that waits slides
        tl, j = self.tl, mv.j
        moved = (tl.state.pol[j] == SWAP and mv.policy == SWAP and mv.eff.wait == p and int(tl.state.wait[j]) != p
                 and mv.eff.cost_s <= 0 and self.opts.policy != "swap")
        commit(self, mv, p, peak)
        if moved:
            slide(self, j, p)

    monkeypatch.setattr(Refiner, "_commit", sliding)
    everywhere = get_solver("libra", policy="hybrid").solve(problem.replace(), budget)
    assert got.time_s < everywhere.time_s
