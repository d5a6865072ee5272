"""Tests of graph coarsening (``libra_opt.solvers.checkmate.coarsen``): the coarse
problem is valid IR, and every coarse plan expands to a plan on the original
problem that the simulator accepts, with the same compute time and a peak no
higher than the coarse plan's."""
from __future__ import annotations

import os

import numpy as np
import pytest

from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.ir.schedule import Compute, Free, Op, Schedule, SwapIn, SwapOut, Wait, no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers.checkmate.model import CheckmateGraph
from libra_opt.solvers.checkmate.plan import keep_all_s, recompute_forward_s, rs_from_s, schedule_from_rs
from libra_opt.solvers.checkmate.coarsen import coarsen

KiB = 1 << 10
HERE = os.path.dirname(os.path.abspath(__file__))


def transformer_like(blocks: int = 12):
    """A forward stack of transformer-like blocks (layer norm with a saved
    mean/rstd output, matmuls, a reshape view kept for the backward, a
    residual add) and a backward half mirroring it; weight gradients are step
    outputs, and the input gradient is returned as a view.  ~20 nodes per block."""
    b = ProblemBuilder()
    h = b.input("x", 64 * KiB)
    saved = []
    for k in range(blocks):
        mod = f"h.{k}"
        ln, stats = b.op(f"ln{k}", [h], [(f"ln{k}", 64 * KiB), (f"ln{k}_stats", KiB)], time_s=1e-4, module=mod)
        (mm,) = b.op(f"mm{k}", [ln], [(f"mm{k}", 256 * KiB)], time_s=8e-4, module=mod, workspace_bytes=16 * KiB)
        (view,) = b.op(f"view{k}", [mm], [(f"view{k}", 0, mm)], module=mod)
        (act,) = b.op(f"gelu{k}", [view], [(f"gelu{k}", 256 * KiB)], time_s=2e-4, module=mod)
        (mm2,) = b.op(f"mm2_{k}", [act], [(f"mm2_{k}", 64 * KiB)], time_s=8e-4, module=mod)
        (res,) = b.op(f"add{k}", [mm2, h], [(f"add{k}", 64 * KiB)], time_s=5e-5, module=mod)
        saved.append((h, ln, stats, view, act))
        h = res
    (loss,) = b.op("loss", [h], [("loss", 4)], time_s=1e-4, phase=BACKWARD)
    g = loss
    outputs = []
    for k in reversed(range(blocks)):
        h_in, ln, stats, view, act = saved[k]
        mod = f"h.{k}"
        (g_mm2, w2) = b.op(f"bw_mm2_{k}", [g, act], [(f"g_act{k}", 256 * KiB), (f"w2_{k}", 32 * KiB)],
                           time_s=1.6e-3, phase=BACKWARD, module=mod)
        (g_view,) = b.op(f"bw_gelu{k}", [g_mm2, view], [(f"g_view{k}", 256 * KiB)], time_s=3e-4,
                         phase=BACKWARD, module=mod)
        (g_ln, w1) = b.op(f"bw_mm{k}", [g_view, ln], [(f"g_ln{k}", 64 * KiB), (f"w1_{k}", 32 * KiB)],
                          time_s=1.6e-3, phase=BACKWARD, module=mod)
        (g_h,) = b.op(f"bw_ln{k}", [g_ln, h_in, stats, g], [(f"g_h{k}", 64 * KiB)], time_s=2e-4,
                      phase=BACKWARD, module=mod)
        outputs += [w1, w2]
        g = g_h
    (gx,) = b.op("gx", [g], [("gx", 0, g)], phase=BACKWARD)
    return b.build(outputs=outputs + [gx])


def gpt2_tiny():
    from libra_opt.ir.problem_io import load_problem

    path = os.path.join(HERE, "..", "problems", "gpt2-tiny-b2-s32-cpu.json.gz")
    return load_problem(path)


PROBLEMS = [transformer_like, gpt2_tiny]


def assert_expands(cp, coarse_schedule):
    """Expanded plan: valid, same compute time, peak <= the coarse plan's."""
    coarse_sim = simulate(cp.problem, coarse_schedule)
    sim = simulate(cp.original, cp.expand(coarse_schedule))
    assert sim.time_s == pytest.approx(coarse_sim.time_s)
    assert sim.peak_bytes <= coarse_sim.peak_bytes
    return sim, coarse_sim


@pytest.mark.parametrize("make", PROBLEMS)
@pytest.mark.parametrize("target", [10, 40, 100])
def test_groups_are_consecutive_single_phase_and_at_most_target(make, target):
    p = make()
    cp = coarsen(p, target)
    assert cp.num_nodes <= target
    flat = [m for grp in cp.groups for m in grp]
    assert flat == list(range(p.num_nodes))
    for g, grp in enumerate(cp.groups):
        assert {p.nodes[m].phase for m in grp} == {cp.problem.nodes[g].phase}
        assert cp.problem.nodes[g].time_s == pytest.approx(sum(p.nodes[m].time_s for m in grp))
    assert cp.problem.total_compute_s == pytest.approx(p.total_compute_s)
    # every step output is represented by a coarse output
    represented = {x for c in cp.problem.outputs for x in cp.tensor_map[c]}
    assert set(p.outputs) <= represented


@pytest.mark.parametrize("make", PROBLEMS)
@pytest.mark.parametrize("target", [8, 30, 90])
def test_expanded_no_remat_plan_is_valid(make, target):
    p = make()
    cp = coarsen(p, target)
    sim, _ = assert_expands(cp, no_remat_schedule(cp.problem))
    assert sim.time_s == pytest.approx(p.total_compute_s)
    assert sim.peak_bytes >= no_remat_peak(p)


@pytest.mark.parametrize("make", PROBLEMS)
@pytest.mark.parametrize("seed", range(4))
def test_expanded_rematerialization_plans_are_valid(make, seed):
    """Random Checkmate plans on the coarse problem (recomputing coarse nodes,
    freeing merged tensors) expand to valid plans on the original."""
    p = make()
    cp = coarsen(p, 25 + 10 * seed)
    g = CheckmateGraph.from_problem(cp.problem, "node" if seed % 2 else "tensor")
    rng = np.random.default_rng(seed)
    for S0 in (keep_all_s(g), recompute_forward_s(g), rng.random((g.n, g.nv)) < 0.3):
        R, S = rs_from_s(g, S0)
        assert_expands(cp, schedule_from_rs(g, R, S))


def test_target_above_size_keeps_every_node():
    p = transformer_like(2)
    cp = coarsen(p, p.num_nodes + 5)
    assert cp.groups == tuple((i,) for i in range(p.num_nodes))
    assert cp.problem.num_nodes == p.num_nodes
    assert no_remat_peak(cp.problem) == no_remat_peak(p)
    assert_expands(cp, no_remat_schedule(cp.problem))


def test_tensors_exported_on_one_storage_are_freed_together():
    # node "mm" and its view "view" end up in one coarse node; both are read outside it
    b = ProblemBuilder()
    x = b.input("x", KiB)
    (a,) = b.op("mm", [x], [("mm", 4 * KiB)], time_s=1.0)
    (v,) = b.op("view", [a], [("view", 0, a)])
    (c,) = b.op("use_base", [a], [("c", KiB)], time_s=5.0)
    (d,) = b.op("use_view", [v, c], [("d", KiB)], time_s=5.0, phase=BACKWARD)
    p = b.build(outputs=[d])
    cp = coarsen(p, 3)
    assert cp.groups[0] == (0, 1)
    merged = [c for c, xs in enumerate(cp.tensor_map) if set(xs) == {a, v}]
    assert len(merged) == 1
    coarse_t = cp.problem.tensors[merged[0]]
    assert coarse_t.nbytes == 4 * KiB and not coarse_t.is_view
    expanded = cp.expand(Schedule([Compute(0), Compute(1), Compute(2), Free(merged[0])]))
    assert [i for i in expanded if i == Free(a) or i == Free(v)] == [Free(a), Free(v)]
    simulate(p, expanded)
    with pytest.raises(ValueError, match="stands for"):  # a swap of two tensors has no single original
        cp.expand(Schedule([SwapOut(merged[0])]))


def test_swaps_expand_only_for_single_tensors():
    b = ProblemBuilder()
    x = b.input("x", KiB)
    (a,) = b.op("f", [x], [("a", 8 * KiB)], time_s=1.0)
    (c,) = b.op("g", [a], [("c", KiB)], time_s=1.0)
    (d,) = b.op("h", [c, a], [("d", KiB)], time_s=1.0, phase=BACKWARD)
    p = b.build(outputs=[d])
    cp = coarsen(p, 3)
    ca = next(k for k, xs in enumerate(cp.tensor_map) if xs == (a,))
    coarse = Schedule([Compute(0), Compute(1), SwapOut(ca), Free(ca), SwapIn(ca), Wait(ca), Compute(2)])
    simulate(cp.problem, coarse)
    expanded = cp.expand(coarse)
    on_a = [i for i in expanded if i.op != Op.COMPUTE and i.arg == a]
    assert on_a == [SwapOut(a), Free(a), SwapIn(a), Wait(a)]
    assert simulate(p, expanded).h2d_bytes == 8 * KiB


def test_invalid_target():
    p = transformer_like(1)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            coarsen(p, bad)
