"""Baseline solvers (solvers/baselines.py) on hand-made graphs.

Expected peaks and recompute times are derived by hand in the comments, with
the simulator's rules (outputs allocated when an op starts, tensors freed
after their last use or their eviction point).
"""
import pytest

from libra_opt.errors import BudgetExceededError, InfeasibleBudgetError, ScheduleError
from libra_opt.passes.lowering import Policy, default_windows, evictions_for, lower
from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.passes.simulator import simulate
from libra_opt.solvers import OPTIMAL, get_solver, solve, solver_class
from libra_opt.solvers.baselines import (ChenGreedySolver, ChenSqrtSolver, CheckpointAllSolver, NoRematSolver,
                                         SwapAllSolver, chen_greedy_checkpoints, chen_sqrt_checkpoints,
                                         forward_cut_points, safe_recompute_decisions, segment_windows)

BASELINES = ["none", "checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all"]


def layered_chain(n=9, size=10, time=1.0):
    """f1..fn (each ``size`` bytes, ``time`` s) then a 1-byte loss; backward g_n..g_1 where g_i reads
    the incoming gradient and a_{i-1}, the input of layer i (so a_1..a_{n-1} are saved)."""
    b = ProblemBuilder()
    acts = [b.input("x", 4)]
    for i in range(1, n + 1):
        acts += b.op(f"f{i}", [acts[-1]], [(f"a{i}", size)], time_s=time)
    (L,) = b.op("loss", [acts[-1]], [("L", 1)], time_s=time)
    grad = L
    for i in range(n, 0, -1):
        out = ("gw", 1) if i == 1 else (f"e{i - 1}", size)
        (grad,) = b.op(f"g{i}", [grad, acts[i - 1]], [out], time_s=time, phase=BACKWARD)
    return b.build(outputs=[L, grad]), acts


# With n = 9, size 10, 1 s per node (positions: f_i at i-1, loss at 9, g_i at 18-i+1 = 19-i):
# no remat: after f9 a1..a9 = 90, the loss node adds L: 91.
NO_REMAT_PEAK = 91


def test_registry_names_resolve_to_baselines():
    assert solver_class("none") is NoRematSolver
    assert solver_class("checkpoint-all") is CheckpointAllSolver
    assert solver_class("chen-sqrt") is ChenSqrtSolver
    assert solver_class("chen-greedy") is ChenGreedySolver
    assert solver_class("swap-all") is SwapAllSolver


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_cite_their_source(name):
    cls = solver_class(name)
    assert cls.name == name
    assert len(cls.citation) > 20
    assert cls.__doc__ and "Source" in cls.__doc__


def test_none_keeps_everything():
    p, _ = layered_chain()
    r = solve(p, 1.0, "none")
    assert r.schedule == no_remat_schedule(p)
    assert r.status == OPTIMAL
    assert r.peak_bytes == NO_REMAT_PEAK and r.added_s == 0
    assert r.lower_bound_s == pytest.approx(p.total_compute_s)
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, NO_REMAT_PEAK - 1, "none")
    assert e.value.min_feasible_bytes == NO_REMAT_PEAK


def test_checkpoint_all_on_chain():
    p, _ = layered_chain()
    r = solve(p, 1.0, "checkpoint-all")
    # a1..a8 evicted after their forward use: the forward holds 2 activations (20).  Before g_{i+1}
    # a_i is rebuilt from x: f1..f_i, each step freeing its input: L + e_{i+1} + 2 temps + e_i = 31
    # at most.  Replays: 8 + 7 + ... + 1 = 36 nodes of 1 s.
    assert r.peak_bytes == 31
    assert r.added_s == pytest.approx(36.0)
    assert r.simulation.recompute_s == pytest.approx(36.0)
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, 30, "checkpoint-all")
    assert e.value.min_feasible_bytes == 31


def test_forward_cut_points():
    p, _ = layered_chain()
    assert forward_cut_points(p) == list(range(9))  # every layer of a chain; the loss ends the forward
    # a residual block: a skips over b, c into d
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)])
    (tb,) = b.op("fb", [a], [("b", 10)])
    (tc,) = b.op("fc", [tb], [("c", 10)])
    (d,) = b.op("fd", [a, tc], [("d", 10)])
    (e,) = b.op("fe", [d], [("e", 10)])
    (L,) = b.op("loss", [e], [("L", 1)])
    (g,) = b.op("g", [L, a, tb, tc, d], [("g", 1)], phase=BACKWARD)
    res = b.build(outputs=[L, g])
    # inside the block (after fb, after fc) a still crosses the cut: not articulation points
    assert forward_cut_points(res) == [0, 3, 4]


def test_chen_checkpoint_selection():
    cand = list(range(9))
    assert chen_sqrt_checkpoints(cand) == [2, 5, 8]  # k = 3: every third candidate
    assert chen_sqrt_checkpoints([]) == []
    p, _ = layered_chain()
    # running sums of 10 bytes: exceeds 25 at the 3rd node of each segment
    assert chen_greedy_checkpoints(p, cand, 25) == [2, 5, 8]
    assert chen_greedy_checkpoints(p, cand, 0) == cand
    assert chen_greedy_checkpoints(p, cand, 1e9) == []
    assert chen_greedy_checkpoints(p, [4], 5) == [4]  # only candidates can end a segment


def test_segment_windows_end_with_the_segment():
    p, acts = layered_chain()
    w = default_windows(p)
    # a_i is last used in the forward by f_{i+1} (position i) and first in the backward by g_{i+1}
    # (position 18 - i)
    assert w[acts[7]] == (7, 11) and w[acts[8]] == (8, 10)
    seg = segment_windows(p, [2, 5, 8], w, [acts[i] for i in (1, 2, 4, 5, 7, 8)])
    # segment (f7, f8 | f9) comes back when g9 (position 10) needs a8: a7's window ends there too
    assert seg[acts[7]] == (7, 10) and seg[acts[8]] == (8, 10)
    assert seg[acts[1]] == (1, 16) and seg[acts[2]] == (2, 16)
    assert seg[acts[4]] == (4, 13)


def test_chen_sqrt_on_chain():
    p, _ = layered_chain()
    r = solve(p, 1.0, "chen-sqrt")
    assert r.extras["checkpoints"] == [2, 5, 8]  # a3, a6, a9 kept
    # each segment's forward is replayed once: (f1, f2), (f4, f5), (f7, f8) = 6 s.
    # Peak: before g9, L + a3 + a6 + replayed a7, a8 = 41, g9 adds e8: 51 (again at g6).
    assert r.added_s == pytest.approx(6.0)
    assert r.peak_bytes == 51
    assert sorted(r.schedule.recomputed_nodes()) == [0, 1, 3, 4, 6, 7]
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, 50, "chen-sqrt")
    assert e.value.min_feasible_bytes == 51


def test_chen_greedy_searches_the_threshold():
    p, _ = layered_chain()
    # the sqrt plan (threshold in [20, 30) bytes) is among those tried, so greedy is no worse
    r = solve(p, 51, "chen-greedy")
    assert r.peak_bytes <= 51 and r.added_s <= 6.0 + 1e-9
    # with room for everything, threshold 0 checkpoints every layer: nothing recomputed
    r = solve(p, 1.0, "chen-greedy")
    assert r.added_s == 0 and r.extras["threshold_bytes"] == 0
    # the smallest feasible budget it reports is feasible, and one byte less is not
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, 20, "chen-greedy")
    m = e.value.min_feasible_bytes
    assert 20 < m <= 51
    assert solve(p, m, "chen-greedy").peak_bytes <= m
    with pytest.raises(InfeasibleBudgetError):
        solve(p, m - 1, "chen-greedy")


def test_swap_all_on_chain():
    p, _ = layered_chain()
    r = solve(p, 1.0, "swap-all")
    sim = r.simulation
    # a1..a8 (80 bytes) copied out and back; copies at 55 GB/s hide behind 1 s nodes
    assert sim.d2h_bytes == 80 and sim.h2d_bytes == 80
    assert sim.recompute_s == 0 and sim.stall_s < 1e-6
    # prefetches run one node ahead: g8 sees L + e8 + a7 + a6 (prefetched) + e7 = 41
    assert r.peak_bytes == 41
    assert r.extras["prefetch"] == "auto"


def test_swap_all_falls_back_to_late_prefetch():
    p, _ = layered_chain()
    # prefetching right before use holds one activation at a time: L + e_{i+1} + a_i + e_i = 31
    r = solve(p, 31, "swap-all")
    assert r.extras["prefetch"] == "late" and r.peak_bytes == 31
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, 30, "swap-all")
    assert e.value.min_feasible_bytes == 31


# ------------------------------------------------------ non-recomputable nodes
def dropout_chain(save_dropout_output: bool):
    """f1 -> dropout (not recomputable) -> f3 -> f4 -> loss; z = f3(y) is saved for backward.

    If ``save_dropout_output``, the backward also reads y (the dropout output) after z's use."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f1", [x], [("a", 10)], time_s=1)
    (y,) = b.op("dropout", [a], [("y", 10)], time_s=1, recomputable=False)
    (z,) = b.op("f3", [y], [("z", 10)], time_s=1)
    (h,) = b.op("f4", [z], [("h", 10)], time_s=1)
    (L,) = b.op("loss", [h], [("L", 1)], time_s=1)
    (gz,) = b.op("g4", [L, z], [("gz", 10)], time_s=1, phase=BACKWARD)
    (gy,) = b.op("g3", [gz, y] if save_dropout_output else [gz], [("gy", 10)], time_s=1, phase=BACKWARD)
    (gw,) = b.op("g2", [gy, a], [("gw", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, gw]), dict(a=a, y=y, z=z)


def test_chain_through_freed_dropout_output_is_kept():
    p, t = dropout_chain(save_dropout_output=False)
    # recomputing z would need y, freed after f3, whose producer cannot be replayed
    with pytest.raises(ScheduleError, match="not recomputable"):
        lower(p, evictions_for(p, {t["z"]: Policy.RECOMPUTE}))
    assert safe_recompute_decisions(p, [t["a"], t["z"]]) == {t["a"]: Policy.RECOMPUTE, t["z"]: Policy.KEEP}


def test_chain_through_resident_dropout_output_is_fine():
    p, t = dropout_chain(save_dropout_output=True)
    # y is saved for g3 (after g4), so it is resident when z is rebuilt for g4
    dec = safe_recompute_decisions(p, [t["a"], t["y"], t["z"]])
    assert dec == {t["a"]: Policy.RECOMPUTE, t["y"]: Policy.KEEP, t["z"]: Policy.RECOMPUTE}


@pytest.mark.parametrize("saved", [False, True])
@pytest.mark.parametrize("name", ["checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all"])
def test_baselines_never_recompute_dropout(name, saved):
    p, t = dropout_chain(saved)
    r = solve(p, 1.0, name)
    dropout = p.node_by_name("dropout").id
    assert dropout not in r.schedule.recomputed_nodes()
    simulate(p, r.schedule, r.budget_bytes)  # accepted within budget


def dropout_read_after_the_window():
    """m = dropout(x) (not recomputable) -> t = f(m) -> tv = view(t) -> L.
    m is read again by b1 at 5 (where t's window (3, 5) ends) and then freed;
    b3 at 7 reads the view tv, whose regeneration (from t, from m) comes
    after m is gone."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (m,) = b.op("dropout", [x], [("m", 10)], time_s=1, recomputable=False)
    (t,) = b.op("f", [m], [("t", 10)], time_s=1)
    (tv,) = b.op("view", [t], [("tv", 0, t)], time_s=0)
    (L,) = b.op("loss", [tv], [("L", 1)], time_s=1)
    (g0,) = b.op("b0", [L], [("g0", 1)], time_s=1, phase=BACKWARD)
    (g1,) = b.op("b1", [g0, t, m], [("g1", 1)], time_s=1, phase=BACKWARD)
    (g2,) = b.op("b2", [g1], [("g2", 1)], time_s=1, phase=BACKWARD)
    (g3,) = b.op("b3", [g2, tv], [("g3", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, g3]), dict(m=m, t=t, tv=tv)


def test_regeneration_after_the_window_through_a_freed_dropout_output_is_kept():
    p, t = dropout_read_after_the_window()
    assert default_windows(p)[t["t"]] == (3, 5)
    # at 5, m is resident; at 7 (tv's use) it is not, and dropout cannot run again
    with pytest.raises(ScheduleError, match="not recomputable"):
        lower(p, evictions_for(p, {t["t"]: Policy.RECOMPUTE}))
    assert safe_recompute_decisions(p, [t["t"]]) == {t["t"]: Policy.KEEP}
    for name in ("checkpoint-all", "chen-sqrt", "chen-greedy"):
        r = solve(p, 1.0, name)
        assert p.node_by_name("dropout").id not in r.schedule.recomputed_nodes()
        simulate(p, r.schedule, r.budget_bytes)


def test_options_and_unknown_candidates():
    p, _ = layered_chain()
    r = solve(p, 1.0, "chen-sqrt", candidates="all")
    assert r.extras["checkpoints"] == [2, 5, 8]
    with pytest.raises(ValueError, match="articulation"):
        solve(p, 1.0, "chen-sqrt", candidates="every")
    assert get_solver("chen-greedy", num_thresholds=4).thresholds(p)[0] == 0.0
    assert len(get_solver("chen-greedy", num_thresholds=4).thresholds(p)) == 4


def single_phase_with_a_costly_chain():
    """Single-phase DAG: y = g(x) (100), a = f1(y) (100), b, c small, e reads
    c and a.  No-remat peak 200 (y and a while f1 runs).  Evicting a over its
    gap (2, 4) recomputes it at 4 from y, which must be recomputed too:
    c + y + a = 210, above keeping everything."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (y,) = b.op("g", [x], [("y", 100)], time_s=1)
    (a,) = b.op("f1", [y], [("a", 100)], time_s=1)
    (bb,) = b.op("f2", [a], [("b", 10)], time_s=1)
    (c,) = b.op("f3", [bb], [("c", 10)], time_s=1)
    (e,) = b.op("f4", [c, a], [("e", 10)], time_s=1)
    return b.build(outputs=[e]), dict(a=a)


@pytest.mark.parametrize("name", ["checkpoint-all", "chen-sqrt", "chen-greedy"])
def test_checkpointing_baselines_plan_the_no_remat_peak_on_a_single_phase_graph(name):
    p, t = single_phase_with_a_costly_chain()
    assert p.boundary == p.num_nodes and default_windows(p) == {t["a"]: (2, 4)}
    assert simulate(p).peak_bytes == 200
    assert simulate(p, lower(p, evictions_for(p, {t["a"]: Policy.RECOMPUTE}))).peak_bytes == 210
    r = solve(p, 1.0, name)
    assert r.peak_bytes <= 200
    simulate(p, r.schedule, 200)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(p, 199, name)
    assert info.value.min_feasible_bytes <= 210


def test_checkpointing_baselines_plan_the_no_remat_peak_on_a_random_layered_graph():
    """On random layered graphs of 100 nodes (single phase, as
    random_layered_n100) every checkpointing baseline plans 1.0x the no-remat
    peak: where its own plan peaks above keeping everything it keeps
    everything (``extras["fallback"]``)."""
    from libra_opt.frontend.generators import random_layered_graph

    fell_back = set()
    for seed in range(4):
        p = random_layered_graph(100, seed=seed)
        for name in ("checkpoint-all", "chen-sqrt", "chen-greedy"):
            r = solve(p, 1.0, name)
            assert r.success
            sim = simulate(p, r.schedule, r.budget_bytes)
            assert sim.peak_bytes <= r.budget_bytes
            if r.extras.get("fallback") == "keep-all":
                fell_back.add(name)
    assert fell_back, "no generated graph exercised the keep-all fallback"


def _bound_problems():
    from libra_opt import generators as G
    return [layered_chain()[0], G.random_layered_graph(40, seed=1), G.large_beside_small_graph(16, seed=3),
            G.unet_graph()]


@pytest.mark.parametrize("name", ["checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all"])
def test_candidates_bound_the_simulated_added_time_and_are_the_plans(name):
    """Each candidate's ``added_s_bound`` (the recompute time of the producers it recomputes) is at most
    its plan's simulated added time, and the candidates build exactly the plans ``plans()`` returns."""
    from libra_opt.solvers.baselines import recompute_bound_s
    for p in _bound_problems():
        cands = list(solver_class(name)().candidates(p))
        plans = list(solver_class(name)().plans(p))
        assert len(cands) == len(plans) >= 1
        for c, plan in zip(cands, plans):
            built = c.plan()
            assert built is c.plan()   # built once
            assert built.schedule.instructions == plan.schedule.instructions
            assert c.added_s_bound <= built.simulation.added_s * (1 + 1e-9) + 1e-12
            if name != "swap-all":
                assert (c.added_s_bound > 0) == (built.simulation.recompute_s > 0)
    assert recompute_bound_s(p, {}) == 0.0


def test_swap_all_copy_bound_holds_and_counts_every_copy_where_copies_dominate():
    """``copy_bound_s`` (the device-to-host queue's busy time from the first swapped producer on, less the
    compute time) is at most swap-all's simulated added time at every link speed, 0 where the copies hide
    behind compute, and at least the copy time less the compute time where copying takes 20x the compute
    (every saved storage is copied out once, one copy after another)."""
    from libra_opt.solvers.baselines import copy_bound_s
    for p in _bound_problems():
        total = sum(int(p.tensors[s].nbytes) for s in default_windows(p))
        for ratio in (0.01, 1.0, 20.0):   # copying every saved storage once takes ratio x the compute time
            bw = total / (ratio * p.total_compute_s)
            q = p.with_device(d2h_bytes_per_s=bw, h2d_bytes_per_s=bw)
            for c in solver_class("swap-all")().candidates(q):
                added = c.plan().simulation.added_s
                assert c.added_s_bound <= added * (1 + 1e-9) + 1e-12
                if ratio == 0.01:
                    assert c.added_s_bound == 0.0
                if ratio == 20.0:
                    assert c.added_s_bound >= (ratio - 1) * q.total_compute_s * (1 - 1e-9)
            assert copy_bound_s(q, {s: Policy.RECOMPUTE for s in default_windows(q)}) == 0.0


def test_libra_pool_builds_only_plans_that_can_win():
    """``libra``'s baseline pool with ``below`` returns the same cheapest plan as without it wherever that
    plan is cheaper than ``below``, and builds no plan whose bound is above ``below``."""
    from libra_opt.simulator import no_remat_peak
    from libra_opt.solvers.libra.solver import RECOMPUTE_BASELINES, _BaselinePool
    for p in _bound_problems():
        peak = no_remat_peak(p)
        full = _BaselinePool(p)
        for budget in (peak, int(0.8 * peak), int(0.6 * peak)):
            best = full.best(RECOMPUTE_BASELINES, budget)
            if best is None:
                continue
            for below in (best[1].simulation.added_s * 1.01 + 1e-9, best[1].simulation.added_s / 2):
                p.tables.memo("libra.baseline_plans", dict).clear()   # a pool built afresh
                pool = _BaselinePool(p)
                hit = pool.best(RECOMPUTE_BASELINES, budget, below)
                if best[1].simulation.added_s < below:
                    assert hit is not None and hit[0] == best[0]
                    assert hit[1].schedule.instructions == best[1].schedule.instructions
                built = [c for n in RECOMPUTE_BASELINES for c in pool.candidates(n) if c._plan is not None]
                assert all(c.added_s_bound <= below * (1 + 1e-6) for c in built)
        p.tables.memo("libra.baseline_plans", dict).clear()   # a pool built afresh



def test_libra_pool_min_peak_is_the_least_peak_of_every_plan():
    """``_BaselinePool.min_peak`` lowers each plan only until its peak reaches the least found so far,
    and answers the least of ``under`` and every plan's peak (each plan built whole, afresh)."""
    from libra_opt.simulator import no_remat_peak
    from libra_opt.solvers.libra.solver import RECOMPUTE_BASELINES, REACH_BASELINES, _BaselinePool
    checked = 0
    for p in _bound_problems():
        peak = no_remat_peak(p)
        for names in (RECOMPUTE_BASELINES, REACH_BASELINES):
            p.tables.memo("libra.baseline_plans", dict).clear()
            peaks = [c.plan_within(None).simulation.peak_bytes for n in names
                     for c in _BaselinePool(p).candidates(n)]
            for under in (peak, int(0.8 * peak), min(peaks) + 1):
                p.tables.memo("libra.baseline_plans", dict).clear()   # a pool built afresh
                assert _BaselinePool(p).min_peak(names, under) == min([under, *peaks]), (p.name, names, under)
                checked += 1
        p.tables.memo("libra.baseline_plans", dict).clear()
    assert checked == 3 * 2 * len(_bound_problems())

def _plain_safe_decisions(problem, evict, windows):
    """safe_recompute_decisions' rule walked plainly, as a reference: every activation input followed
    (no tainted-tensor filter), every walk from scratch (no work shared between walks)."""
    from libra_opt.ir.problem import ACTIVATION

    tensors, outputs, last = problem.tensors, problem.output_set, problem.tables.t_last
    dec = {s: Policy.RECOMPUTE for s in dict.fromkeys(evict) if s in windows}

    def resident(v, before):
        t = tensors[v]
        return (dec.get(t.storage, Policy.KEEP) == Policy.KEEP and t.producer < before
                and (v in outputs or last[v] >= before))

    def walk_ok(seeds, before):
        stack, seen = list(seeds), set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            node = problem.nodes[tensors[u].producer]
            if not node.recomputable:
                return False
            stack += [v for v in node.inputs if tensors[v].kind == ACTIVATION and not resident(v, before)]
        return True

    for s in list(dec):
        before, views = windows[s][1], problem.storage_views[s]
        later = [[c for c in tensors[u].consumers if c > before] for u in views]
        if not (walk_ok(views, before) and all(walk_ok([u], cs[0]) for u, cs in zip(views, later) if cs)):
            dec[s] = Policy.KEEP
    return dec


def test_safe_recompute_decisions_match_a_plain_walk_on_random_problems():
    """The decisions (and their order) equal the plain reference walk's on seeded random problems with
    non-recomputable ops, over default windows and over Chen's segment windows (where the evicted
    storages of a segment share one window end, and the walks share their work)."""
    from libra_opt.fuzz import random_problem
    from libra_opt.solvers.baselines import _candidates

    kept = 0
    for seed in range(120):
        p = random_problem(seed, max_forward=(6, 12, 25)[seed % 3])
        w = default_windows(p)
        cases = [(list(w), w), (list(w)[::2], w)]
        cand = _candidates(p, "articulation")
        for ckpt in (chen_sqrt_checkpoints(cand), cand[:1], cand[::2]):
            kept_storages = {p.tensors[t].storage for v in ckpt for t in p.nodes[v].outputs}
            ev = [s for s in w if s not in kept_storages]
            cases.append((ev, segment_windows(p, ckpt, w, ev)))
        for ev, win in cases:
            got = safe_recompute_decisions(p, ev, win)
            want = _plain_safe_decisions(p, ev, win)
            assert list(got.items()) == list(want.items()), (seed, ev)
            kept += sum(d == Policy.KEEP for d in got.values())
    assert kept > 100   # the problems do exercise the rule


def _checkpoint_all_decisions(p):
    windows = default_windows(p)
    return safe_recompute_decisions(p, windows, windows), windows


@pytest.mark.parametrize("chunk", [1, None])
def test_a_limit_stops_the_lowering_only_of_a_plan_over_it(chunk, monkeypatch):
    """``_evaluate(limit=L)`` returns ``None`` exactly where the whole plan's simulated peak is over ``L``,
    having lowered only a prefix of it; under ``L`` it returns the schedule and simulation that lowering then
    simulating give.  A plan found over a limit is not lowered again for a limit at most that one, and is
    for a higher one or none.  With the simulator run after every node, some plans stop before their end."""
    from libra_opt import generators as G
    from libra_opt.passes.peak_bound import PeakProver
    from libra_opt.solvers import baselines as Bm

    # the plan's peak prover off: it would prove most of these plans over the limit before any lowering
    # (tests/test_peak_bound.py)
    monkeypatch.setattr(PeakProver, "over", lambda self, limit: False)
    emitted = []   # per lowering: the longest prefix the simulator was shown

    def spy_lower(problem, evictions, *, prefetch="auto", watch=None):
        emitted.append(0)

        def w(out):
            emitted[-1] = len(out)
            watch(out)
        return lower(problem, evictions, prefetch=prefetch, watch=None if watch is None else w)

    monkeypatch.setattr(Bm, "lower", spy_lower)
    if chunk is not None:   # the simulator runs after every node (by default: every _WALK_CHUNK instructions)
        monkeypatch.setattr(Bm, "_WALK_CHUNK", chunk)
    stopped = 0
    for p in _bound_problems() + [G.random_layered_graph(60, seed=2)]:
        dec, windows = _checkpoint_all_decisions(p)
        sched = lower(p, evictions_for(p, dec, windows))
        full = simulate(p, sched)
        for limit in (full.peak_bytes, full.peak_bytes - 1, full.peak_bytes // 2):
            fresh = p.replace()   # a cold memo
            emitted.clear()
            got = Bm._evaluate(fresh, dec, windows, limit=limit)
            assert len(emitted) == 1
            if full.peak_bytes > limit:
                assert got is None
                with pytest.raises(BudgetExceededError) as over:   # the first instruction over the limit
                    simulate(p, sched, limit)
                assert over.value.index < emitted[0] <= len(sched.instructions)
                stopped += emitted[0] < len(sched.instructions)
                assert Bm._evaluate(fresh, dec, windows, limit=limit - 1) is None and len(emitted) == 1
                again = Bm._evaluate(fresh, dec, windows, limit=full.peak_bytes)
                assert len(emitted) == 2 and again is not None
            else:
                s, sim = got
                assert s.instructions == sched.instructions and s.meta == sched.meta
                assert (sim.peak_bytes, sim.peak_index, sim.time_s, sim.added_s) == \
                       (full.peak_bytes, full.peak_index, full.time_s, full.added_s)
                assert (sim.timeline_t == full.timeline_t).all() and (sim.timeline_bytes == full.timeline_bytes).all()
                assert Bm._evaluate(fresh, dec, windows) is got and len(emitted) == 1   # the memo: not lowered again
    assert stopped or chunk is None, "no plan was stopped before its end"


@pytest.mark.parametrize("name", ["checkpoint-all", "chen-sqrt", "chen-greedy"])
def test_stopping_a_plan_at_the_no_remat_peak_changes_no_answer(name, monkeypatch, stopped_lowerings):
    """Under the no-remat peak the checkpointing baselines lower a plan only until its peak reaches it
    (``_stop_limit``): every solve gives the status, plan, stated minimum and message of building every plan
    in whole, at budgets under, at and over the no-remat peak, on graphs where the baselines' plans peak
    over it (random layered) and under it."""
    from libra_opt import generators as G
    from libra_opt.solvers import baselines as Bm

    def answer(p, frac):
        r = solve(p.replace(), int(frac * simulate(p).peak_bytes), name, raise_on_infeasible=False)
        return r.status, r.message, r.min_feasible_bytes, r.schedule.instructions if r.schedule else None

    problems = [G.random_layered_graph(80, seed=s) for s in range(3)] + _bound_problems()
    budgets = (0.3, 0.5, 0.7, 0.9, 0.999, 1.0, 1.2)
    stopped = [answer(p, b) for p in problems for b in budgets]
    assert any(stopped_lowerings), "no plan was stopped"
    monkeypatch.setattr(Bm, "_stop_limit", lambda problem, budget_bytes: None)
    whole = [answer(p, b) for p in problems for b in budgets]
    assert stopped == whole
    assert any(s == "infeasible" for s, *_ in whole) and any(s != "infeasible" for s, *_ in whole)


def test_a_candidate_over_a_limit_is_not_built_again_for_a_limit_at_most_that_one():
    """``BaselineCandidate.plan_within``: a plan found over a limit answers ``None`` for any lower limit
    without building again; a higher limit builds it, and once built it is returned whatever the limit."""
    from libra_opt import generators as G
    from libra_opt.solvers.baselines import BaselineCandidate

    p = G.random_layered_graph(60, seed=2)
    peak = next(CheckpointAllSolver().candidates(p.replace())).plan().simulation.peak_bytes
    first = next(CheckpointAllSolver().candidates(p))
    build, calls = first._build, []
    c = BaselineCandidate(lambda limit: calls.append(limit) or build(limit), first.added_s_bound)
    assert c.plan_within(peak - 1) is None and c.plan_within(peak // 2) is None and calls == [peak - 1]
    got = c.plan_within(peak)
    assert got is not None and got.simulation.peak_bytes == peak and calls == [peak - 1, peak]
    assert c.plan_within(0) is got and c.plan() is got and len(calls) == 2


def test_a_candidate_shown_over_a_limit_is_not_built_and_builds_later():
    """``BaselineCandidate.surely_over``: a plan its prover shows over a limit is left unbuilt (no
    lowering kept for the problem), a later ``plan_within`` still builds it in whole, and once built
    it answers from the simulated peak itself."""
    from libra_opt import generators as G

    p = G.random_layered_graph(60, seed=2)
    peak = next(CheckpointAllSolver().candidates(p.replace())).plan().simulation.peak_bytes
    c = next(CheckpointAllSolver().candidates(p))
    assert c.surely_over(peak // 2) and c._plan is None
    assert not p.tables.memo("baselines.lowered", dict)   # nothing lowered to show it
    asked = []
    c._prove = lambda limit: asked.append(limit)   # the proof is kept: a lower limit asks nothing again
    assert c.surely_over(peak // 4) and c.surely_over(peak // 2) and asked == []
    c._prove = next(CheckpointAllSolver().candidates(p))._prove
    assert not c.surely_over(peak)   # (not shown: the prover proves only what it finds)
    got = c.plan_within(None)
    assert got.simulation.peak_bytes == peak
    assert c.surely_over(peak - 1) and not c.surely_over(peak) and c.plan_within(0) is got


def test_plans_shown_over_the_budget_are_skipped_with_the_same_answers(monkeypatch):
    """``libra``'s baseline pool and ``chen-greedy`` skip the plans shown over the budget without lowering
    them (``BaselineCandidate.surely_over``): the pool's cheapest plan within each budget, ``chen-greedy``'s
    plans and its infeasibility errors (their smallest peak) are the same as where nothing is shown, and
    at the tight budgets some plans are left unbuilt."""
    from libra_opt import generators as G
    from libra_opt.simulator import no_remat_peak
    from libra_opt.solvers.baselines import BaselineCandidate
    from libra_opt.solvers.libra.solver import PORTFOLIO_BASELINES, _BaselinePool

    def answers(p):
        out, unbuilt = [], 0
        for frac in (0.9, 0.6, 0.45, 0.3):
            budget = int(frac * no_remat_peak(p))
            q = p.replace()
            pool = _BaselinePool(q)
            hit = pool.best(PORTFOLIO_BASELINES, budget)
            unbuilt += sum(c._plan is None and c._over == budget   # proven over the budget itself: never lowered
                           for n in PORTFOLIO_BASELINES for c in pool.candidates(n))
            r = solve(p.replace(), budget, "chen-greedy", raise_on_infeasible=False)
            out.append((hit and (hit[0], hit[1].schedule.instructions), r.status, r.message, r.min_feasible_bytes,
                        r.schedule.instructions if r.schedule else None))
        return out, unbuilt

    problems = [G.random_layered_graph(60, seed=2), G.large_beside_small_graph(40, seed=1), G.unet_graph()]
    shown = [answers(p) for p in problems]
    assert sum(u for _, u in shown) > 0, "no plan was left unbuilt"
    monkeypatch.setattr(BaselineCandidate, "surely_over", lambda self, limit: False)
    assert [a for a, _ in shown] == [answers(p)[0] for p in problems]
    assert any(s == "infeasible" for a, _ in shown for _, s, *_ in a)
    assert any(s != "infeasible" for a, _ in shown for _, s, *_ in a)
