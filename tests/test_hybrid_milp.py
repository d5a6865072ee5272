"""Tests of ``hybrid-milp`` (issue 16): keep / recompute / swap plans from a MILP.

Small training graphs (5-15 nodes) with host<->device bandwidths set so that
copying the no-remat peak once takes a fixed share of one no-remat step.
Every plan is checked by the simulator against the budget; the optimum is
compared with libra's hybrid plan, Checkmate's recompute-only optimum and an
exhaustive enumeration of the model's plans.
"""
from __future__ import annotations

import importlib.util
import itertools
import os

import numpy as np
import pytest

from libra_opt.errors import InfeasibleBudgetError, ScheduleError, SolverError, SolverOptionError
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import solve
from libra_opt.solvers.checkmate.model import CheckmateGraph
from libra_opt.solvers.checkmate.plan import s_mask, schedule_from_rs, solve_r_opt
from libra_opt.solvers.checkmate.hybrid_model import HybridModel, swappable_values
from _benchmark_scripts import load_benchmark
from _devices import with_bandwidth
from test_checkmate import diamond, linear_network, unet

REL = 1e-6


def check_plan(problem, r):
    """The simulator accepts the plan within the budget, and the result agrees with it."""
    sim = simulate(problem, r.schedule, r.budget_bytes)
    assert r.peak_bytes == sim.peak_bytes <= r.budget_bytes
    assert r.time_s == pytest.approx(sim.time_s)
    if r.lower_bound_s is not None:
        assert r.lower_bound_s <= r.time_s * (1 + REL)
        assert r.gap is not None and r.gap >= 0
    return sim


CASES = [(lambda: linear_network(4), 0.25, 0.6), (lambda: linear_network(4), 1.0, 0.6),
         (diamond, 1.0, 0.95), (unet, 0.25, 0.95)]


@pytest.mark.parametrize("make, copy_steps, frac", CASES)
def test_plans_fit_and_beat_libra_and_checkmate(make, copy_steps, frac):
    """A plan the simulator accepts within budget, no slower than libra's hybrid plan or
    Checkmate's recompute-only optimum at the same budget; its bound lies below both."""
    p = with_bandwidth(make(), copy_steps)
    budget = int(frac * no_remat_peak(p))
    r = solve(p, budget, "hybrid-milp", time_limit_s=30)
    check_plan(p, r)
    assert r.status == "optimal"
    # a hybrid certificate of the optimum, gap 0: the MILP's bound covers its own plan (a point of the
    # model), or the returned plan runs at the compute floor
    assert r.bound_kind == "hybrid" and r.gap <= 1e-9, (r.bound_source, r.gap)
    assert "MILP bound" in r.bound_source or "compute floor" in r.bound_source
    others = [solve(p, budget, "libra", policy="hybrid", raise_on_infeasible=False),
              solve(p, budget, "checkmate-milp", time_limit_s=30, raise_on_infeasible=False)]
    assert any(o.success for o in others)
    for other in (o for o in others if o.success):
        check_plan(p, other)
        assert r.time_s <= other.time_s * (1 + REL)
        assert r.lower_bound_s <= other.time_s * (1 + REL) or other.schedule.swapped_tensors()


def test_swapping_beats_recomputation_when_copies_hide_behind_compute():
    """On Checkmate's chain with fast copies, swapping saved activations beats the recompute-only
    optimum, and the hybrid bound proves it."""
    p = with_bandwidth(linear_network(4), 0.25)
    budget = int(0.6 * no_remat_peak(p))
    r = solve(p, budget, "hybrid-milp", time_limit_s=30)
    cm = solve(p, budget, "checkmate-milp", time_limit_s=30)
    assert r.schedule.swapped_tensors() and r.time_s < cm.time_s
    assert r.status == "optimal" and r.lower_bound_s < cm.time_s


def enumerate_model_plans(problem, budget_bytes: int) -> float:
    """Exhaustive search over the hybrid model's plans: per checkpoint cell, kept (``S``),
    swapped in at the stage's start (``B``) or neither; at every stage ``u`` after which a
    value becomes a checkpoint without being one, a recompute or a swap-in waited for at the end
    of ``u`` and issued at any stage ``k <= u`` since the value was last resident; ``R`` the least
    for them.  The best simulated time within budget (inf if none fits)."""
    g = CheckmateGraph.from_problem(problem)
    cells = list(zip(*np.nonzero(s_mask(g))))
    swappable = swappable_values(g)
    best = np.inf
    for states in itertools.product("-SB", repeat=len(cells)):
        S = np.zeros((g.n, g.nv), dtype=bool)
        B = np.zeros_like(S)
        if any(st == "B" and not swappable[v] for (t, v), st in zip(cells, states)):
            continue
        for (t, v), st in zip(cells, states):
            S[t, v] = st == "S"
            B[t, v] = st == "B"
        options = []
        for u in range(g.n - 1):
            for v in np.flatnonzero(swappable & S[u + 1] & ~S[u] & ~B[u]):
                if u > g.value_node[v]:
                    starts = [None]  # recompute
                    k = u
                    while k > g.value_node[v] and not S[k, v] and not B[k, v]:
                        starts.append(k)
                        k -= 1
                    options.append([(u, v, k) for k in starts])
        for choice in itertools.product(*options):
            IN = np.zeros_like(S)
            A = np.zeros_like(S)
            for u, v, k in choice:
                if k is not None:
                    IN[k, v] = A[u, v] = True
            R = solve_r_opt(g, S, arrived=A, present=B)
            if (R & ~g.recomputable[None, :] & ~np.eye(g.n, dtype=bool)).any():
                continue
            try:
                sched = schedule_from_rs(g, R, S, swap_in=IN, arrive=A, swap_now=B, swap_out=(IN | B).any(axis=0))
                best = min(best, simulate(problem, sched, budget_bytes).time_s)
            except (ScheduleError, SolverError):
                continue
    return best


@pytest.mark.parametrize("copy_steps, overlap", [(0.25, True), (0.5, True), (1.0, True), (0.25, False)])
@pytest.mark.parametrize("budget", [210, 250])
def test_optimum_equals_exhaustive_search(tiny_problem, copy_steps, overlap, budget):
    """On a 4-node graph (``a = f(x)``, ``b = g(a)``, ``gb = h(b)``, ``ga = k(gb, a)``; peak 300 B),
    the MILP's plan is the best of every plan of its model, and its bound is at or below it (a
    swap-in of ``a`` before ``k`` when its stall costs less than recomputing ``a``), also where
    copies occupy the compute stream (a CPU)."""
    p = with_bandwidth(tiny_problem, copy_steps, overlap)
    best = enumerate_model_plans(p, budget)
    r = solve(p, budget, "hybrid-milp", time_limit_s=30, libra_hint=False)
    check_plan(p, r)
    assert r.status == "optimal"
    assert r.time_s == pytest.approx(best, rel=REL)
    assert r.lower_bound_s <= best * (1 + REL)


HAVE_HIGHSPY = importlib.util.find_spec("highspy") is not None


@pytest.mark.skipif(not HAVE_HIGHSPY, reason="highspy (the 'highs' extra) is not installed")
@pytest.mark.parametrize("copy_steps, overlap", [(0.25, True), (1.0, True), (0.25, False)])
def test_highs_backend_gives_the_exhaustive_optimum(tiny_problem, copy_steps, overlap):
    """``backend="highs"`` (HiGHS through highspy) proves the same optimum as the exhaustive
    search over the model's plans and as SCIP, with a bound at or below it."""
    p = with_bandwidth(tiny_problem, copy_steps, overlap)
    best = enumerate_model_plans(p, 210)
    r = solve(p, 210, "hybrid-milp", time_limit_s=30, libra_hint=False, backend="highs")
    check_plan(p, r)
    assert r.extras["engine"] == "highs" and r.status == "optimal"
    assert r.time_s == pytest.approx(best, rel=REL)
    assert r.lower_bound_s <= best * (1 + REL)
    scip = solve(p, 210, "hybrid-milp", time_limit_s=30, libra_hint=False)
    assert r.time_s == pytest.approx(scip.time_s, rel=REL)


@pytest.mark.skipif(not HAVE_HIGHSPY, reason="highspy (the 'highs' extra) is not installed")
def test_highs_backend_takes_libra_plan_as_incumbent_and_proves_the_optimum():
    """On the U-net with copies as slow as a step, HiGHS starts from a plan of the model
    (``extras["warm_start"]``), ends no slower than libra's hybrid plan and SCIP's optimum, and its
    bound lies at or below SCIP's plan."""
    p = with_bandwidth(unet(), 1.0)
    budget = int(0.95 * no_remat_peak(p))
    r = solve(p, budget, "hybrid-milp", time_limit_s=30, backend="highs")
    check_plan(p, r)
    assert r.extras.get("warm_start") and r.status == "optimal"
    scip = solve(p, budget, "hybrid-milp", time_limit_s=30)
    libra = solve(p, budget, "libra", policy="hybrid")
    assert r.time_s <= libra.time_s * (1 + REL)
    assert r.time_s == pytest.approx(scip.time_s, rel=1e-4)
    assert r.extras["best_bound_s"] <= scip.time_s * (1 + REL)


def test_a_missing_highspy_is_a_clear_error(monkeypatch):
    """Without highspy, ``backend="highs"`` raises SolverUnavailableError naming the extra to
    install and the default backend, before any work."""
    from libra_opt.errors import SolverUnavailableError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "highspy" else real(name, *a))
    with pytest.raises(SolverUnavailableError, match=r"libra-opt\[highs\].*backend='ortools'"):
        solve(with_bandwidth(linear_network(3), 1.0), 0.7, "hybrid-milp", backend="highs")


def test_infeasible_budget_names_a_feasible_one():
    """Below what one stage needs, InfeasibleBudgetError; the budget it names is solvable."""
    p = with_bandwidth(unet(), 1.0)
    g = CheckmateGraph.from_problem(p)
    low = g.min_stage_bytes() - 1
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, low, "hybrid-milp", time_limit_s=30)
    need = e.value.min_feasible_bytes
    assert need is not None and need > low
    check_plan(p, solve(p, need, "hybrid-milp", time_limit_s=30))


def test_model_memory_never_below_the_simulator():
    """For the MILP's own plans at several budgets, the simulated peak fits the budget the model
    was built for (the model never under-counts a storage, an in-flight copy included)."""
    p = with_bandwidth(unet(), 4.0)
    peak = no_remat_peak(p)
    for frac in (0.97, 0.93):
        r = solve(p, int(frac * peak), "hybrid-milp", time_limit_s=30, libra_hint=False)
        check_plan(p, r)


def test_time_limit_returns_a_plan_with_its_status():
    """With a 2 s limit on 60 random layered nodes, a plan no slower than libra's, status
    time_limit or feasible (or optimal if proven in time)."""
    from libra_opt.frontend.generators import random_layered_graph

    p = with_bandwidth(random_layered_graph(60, seed=1), 1.0)
    budget = int(0.9 * no_remat_peak(p))
    libra = solve(p, budget, "libra", policy="hybrid")
    r = solve(p, budget, "hybrid-milp", time_limit_s=2.0)
    check_plan(p, r)
    assert r.status in ("optimal", "time_limit", "feasible")
    assert r.time_s <= libra.time_s * (1 + REL)


def test_time_limit_without_any_plan_is_a_solver_error():
    """No starting plan (libra's and the warm start left out; no remat and recompute-forward are
    over the budget) and the MILP finds none in 1 s on a 77-node profiled graph: SolverError,
    never a plan."""
    from libra_opt.ir.problem_io import load_problem
    from _interrupt import PROBLEM

    p = load_problem(PROBLEM).with_device(copies_overlap_compute=True)
    with pytest.raises(SolverError, match="no plan within"):
        solve(p, "85%", "hybrid-milp", time_limit_s=1.0, libra_hint=False, warm_start=False)


def test_bad_options_and_too_large_problems_are_rejected():
    p = linear_network(2)
    for bad in (dict(time_limit_s=0), dict(mip_gap=1.5), dict(backend="gurobi"), dict(values="op"),
                dict(max_nodes=3), dict(lns_share=1.0)):
        with pytest.raises(SolverOptionError):
            solve(p, 0.7, "hybrid-milp", **bad)


def test_model_has_swap_variables_only_for_swappable_values():
    p = with_bandwidth(unet(), 1.0)
    g = CheckmateGraph.from_problem(p)
    m = HybridModel(g, int(0.9 * no_remat_peak(p)))
    sw = swappable_values(g)
    assert ((m.off_idx >= 0) <= sw).all() and (m.off_idx >= 0).any()
    assert ((m.in_idx >= 0).any(axis=0) <= (m.off_idx >= 0)).all()


@pytest.mark.slow
def test_ctrl_c_stops_the_milp_without_a_plan(tmp_path):
    """SIGINT during the native solve (OR-Tools SCIP): KeyboardInterrupt, a non-zero exit, no plan
    written, no temporary file left (as for checkmate-milp, ``tests/test_milp_interrupt.py``)."""
    from _interrupt import PROBLEM, interrupt_native_solve

    plan = tmp_path / "plan.json"
    driver = """
        from libra_opt.ir.problem_io import load_problem
        from libra_opt.solvers import solve

        p = load_problem(sys.argv[1]).with_device(copies_overlap_compute=True)
        r = solve(p, sys.argv[2], "hybrid-milp", time_limit_s=60, libra_hint=False)
        r.schedule.save(sys.argv[3])
        print("solved:", r.status)
    """
    r = interrupt_native_solve(driver, [PROBLEM, "85%", str(plan)], tmp_path)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, (r.stdout, r.stderr)
    assert "solved:" not in r.stdout and not plan.exists()
    assert os.listdir(tmp_path / "tmp") == []


def test_benchmark_script_writes_one_row_per_solve(tmp_path):
    """``benchmarks/hybrid_optimality.py`` on a generated 10-node graph: one CSV row per
    (bandwidth, budget), each with a status, and the bound below the time where there is a plan."""
    import csv

    mod = load_benchmark("hybrid_optimality")
    out = tmp_path / "rows.csv"
    assert mod.main(["--generate", "10", "--only", "gen", "--budgets", "0.8", "--bandwidths", "1,4",
                     "--time-limit", "10", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and all(r["status"] for r in rows)
    for r in rows:
        if r["time_s"]:
            assert float(r["lower_bound_s"]) <= float(r["time_s"]) * (1 + REL)
    met, missed = mod.summarize(rows)
    assert len(met) + len(missed) == sum(r["status"] != "infeasible" for r in rows)
    assert all(r["status"] == "optimal" or float(r["gap"]) <= mod.TARGET_GAP for r in met)
    assert mod.main(["--summary", str(out)]) == 0
    # --seeds: one instance per seed, seed 0 under its old name
    names = [name for name, _ in mod.instances(mod.parse_args(["--generate", "10", "--seeds", "0,2", "--only", "gen"]))]
    assert names == ["random_layered_gen_n10", "random_layered_gen_n10_s2"]


def test_benchmark_libra_only_grid_and_its_comparison(tmp_path, capsys):
    """``hybrid_optimality.py --libra-only``: one CSV row per (bandwidth, budget, policy) with libra's
    simulated time (or its stated minimum where infeasible), equal to a solve of that cell; ``--compare``
    against the same file finds every cell the same, and against one with a cell made dearer lists that
    cell as cheaper now."""
    import csv

    from libra_opt.frontend.generators import random_layered_graph

    mod = load_benchmark("hybrid_optimality")
    out, old = tmp_path / "grid.csv", tmp_path / "old.csv"
    argv = ["--generate", "20", "--only", "gen", "--budgets", "0.9,0.6", "--bandwidths", "1,4", "--libra-only"]
    assert mod.main(argv + ["--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8 and {r["policy"] for r in rows} == {"hybrid", "swap"}

    def as_solved(rows, **options):
        """Each row's time (or stated minimum) is a solve of its cell with ``options``."""
        for r in rows:
            p = mod._copy_bound(random_layered_graph(20, seed=0), float(r["bandwidth_x_step"]))
            got = solve(p, int(r["budget_bytes"]), "libra", policy=r["policy"], raise_on_infeasible=False, **options)
            if r["time_s"]:
                assert float(r["time_s"]) == pytest.approx(got.time_s, rel=1e-12)
            else:
                assert int(r["min_feasible_bytes"]) == got.min_feasible_bytes

    as_solved(rows)
    capsys.readouterr()
    assert mod.main(argv + ["--out", str(tmp_path / "again.csv"), "--compare", str(out)]) == 0
    assert "0 cheaper, 0 costlier, 8 the same" in capsys.readouterr().out
    planned = next(i for i, r in enumerate(rows) if r["time_s"])
    rows[planned]["time_s"] = str(2 * float(rows[planned]["time_s"]))
    with old.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert mod.main(argv + ["--out", str(tmp_path / "third.csv"), "--compare", str(old)]) == 0
    text = capsys.readouterr().out
    assert "1 cheaper, 0 costlier, 7 the same" in text and "(-50.00%)" in text
    with pytest.raises(SystemExit):   # --compare without --libra-only: an error, not ignored
        mod.parse_args(["--compare", str(old)])
    assert "needs --libra-only" in capsys.readouterr().err
    with pytest.raises(SystemExit):   # as --exchange-effort without it
        mod.parse_args(["--exchange-effort", "thorough"])
    assert "needs --libra-only" in capsys.readouterr().err
    # --exchange-effort thorough: each cell a solve with that option
    assert mod.main(argv + ["--out", str(tmp_path / "thorough.csv"), "--exchange-effort", "thorough"]) == 0
    as_solved(list(csv.DictReader((tmp_path / "thorough.csv").open())), exchange_effort="thorough")


def test_benchmark_summary_counts_the_target():
    """The summary of ``hybrid_optimality.py``: a proven row or one within the target gap is met, a
    larger gap or no plan is missed, an infeasible budget is neither."""
    mod = load_benchmark("hybrid_optimality")
    rows = [dict(status="optimal", gap="0.0"), dict(status="time_limit", gap="0.049"),
            dict(status="time_limit", gap="0.051"), dict(status="time_limit", gap=""),
            dict(status="infeasible", gap="")]
    met, missed = mod.summarize(rows)
    assert met == rows[:2] and missed == rows[2:4]
    met, missed = mod.summarize(rows, target_gap=0.06)
    assert met == rows[:3] and missed == [rows[3]]


def profiled_problem():
    """The 77-node profiled ResNet (views, multi-output ops) from ``problems/``."""
    from libra_opt.ir.problem_io import load_problem
    from _interrupt import PROBLEM

    return load_problem(PROBLEM)


@pytest.mark.parametrize("make, copy_steps, frac", [(lambda: linear_network(4), 0.25, 0.6),
                                                    (profiled_problem, 1.0, 0.9)])
def test_starting_plans_are_solutions_of_the_model(make, copy_steps, frac):
    """libra's hybrid plan (mapped onto the model) and the swap-on-demand plan satisfy every row
    of the model where they fit its budget, and their lowered plans simulate within it."""
    from libra_opt.solvers.checkmate.hybrid_model import hybrid_from_schedule, swap_on_demand

    p = with_bandwidth(make(), copy_steps)
    g = CheckmateGraph.from_problem(p)
    budget = int(frac * no_remat_peak(p))
    m = HybridModel(g, budget)
    lib = solve(p, budget, "libra", policy="hybrid")
    fitted = 0
    for S, IN, A, B, OFF in (hybrid_from_schedule(g, lib.schedule), swap_on_demand(g)):
        R = solve_r_opt(g, S, arrived=A, present=B)
        xv = m.hybrid_assignment(R, S, IN, A, B, OFF)
        if xv is None:
            continue
        fitted += 1
        assert m.satisfies(xv)
        sched = schedule_from_rs(g, R, S, swap_in=IN, arrive=A, swap_out=OFF, swap_now=B)
        simulate(p, sched, budget)
    assert fitted


def test_a_copy_in_charged_over_the_budget_is_issued_later():
    """libra's hybrid plan on the U-net at 0.9 with its copies in issued as early as possible (the
    model charges them from then on, over the budget): ``hybrid_assignment`` rejects it;
    ``fitted_assignment`` issues them later, and gives a point of the model whose lowered plan fits
    the budget in the simulator and simulates no faster than the model's objective."""
    from libra_opt.solvers.checkmate.hybrid_model import hybrid_from_schedule

    p = with_bandwidth(unet(), 1.0)
    g = CheckmateGraph.from_problem(p)
    budget = int(0.9 * no_remat_peak(p))
    m = HybridModel(g, budget)
    S, IN, A, B, OFF = hybrid_from_schedule(g, solve(p, budget, "libra", policy="hybrid").schedule)
    early = np.zeros_like(IN)
    for t, v in zip(*np.nonzero(IN)):
        k = t
        while (k - 1 > g.value_node[v] and not (S[k - 1, v] or B[k - 1, v] or A[k - 1, v])
               and m.in_idx[k - 1, v] >= 0):
            k -= 1
        early[k, v] = True
    assert (early != IN).any()
    R = solve_r_opt(g, S, arrived=A, present=B)
    assert m.hybrid_assignment(R, S, early, A, B, OFF) is None
    xv, (R2, S2, IN2, A2, B2) = m.fitted_assignment(R, S, early, A, B, OFF)
    assert m.satisfies(xv) and (IN2 != early).any()
    sched = schedule_from_rs(g, R2, S2, swap_in=IN2, arrive=A2, swap_out=OFF, swap_now=B2)
    sim = simulate(p, sched, budget)
    assert m.objective_seconds(float(m.obj @ xv)) <= sim.time_s * (1 + REL)


def fuzz_5308():
    """Fuzz case 5308 (``random_problem(5308)`` of :mod:`libra_opt.apps.fuzz`, times rounded to
    0.01 ms), the smallest that ended in ``SolverError`` (issue 12): ``t = mm(x)`` is read only by
    the last node; ``v`` views the input; copies occupy the compute stream.  Budget 4782 B."""
    from libra_opt.ir.problem import BACKWARD, DeviceProfile, ProblemBuilder

    b = ProblemBuilder()
    x = b.input("x", 750)
    (t,) = b.op("mm_1", [x], [("t", 399)], time_s=5.42e-4)
    (v,) = b.op("view_2", [x], [("v", 0, x)], workspace_bytes=4672)
    (v2,) = b.op("view_3", [v], [("v", 0, v)], time_s=1.68e-4)
    (t2,) = b.op("mm_4", [v], [("t", 1250)], time_s=7.28e-4, workspace_bytes=816)
    (loss,) = b.op("sum_5", [t2], [("loss", 4)], time_s=5.75e-4)
    (g,) = b.op("mm_backward_6", [v2], [("g", 234)], time_s=8.87e-4, phase=BACKWARD)
    (g2,) = b.op("mm_backward_7", [t, g], [("g", 755)], time_s=7.90e-4, phase=BACKWARD)
    dev = DeviceProfile(name="fuzz", h2d_bytes_per_s=55e9, d2h_bytes_per_s=31.6e9, copies_overlap_compute=False)
    return b.build([loss, g2], device=dev, name="fuzz-5308"), 4782


def test_a_swap_in_no_computation_of_its_stage_reads_is_freed_after_its_wait():
    """Issue 12: a point of the model swaps ``t`` in at the start of stages 2..6 (``B``) though
    only stage 6 reads it (a stall the model may choose, e.g. within the MILP gap).  Lowered, each
    copy no computation of its stage reads and no checkpoint of the next keeps is freed right after
    its ``Wait``, so the next stage's ``SwapIn`` finds its storage on the host (it stayed resident
    and the simulator rejected the plan: "swaps in 't', whose storage is still resident")."""
    p, budget = fuzz_5308()
    g = CheckmateGraph.from_problem(p)
    assert [tuple(int(x) for x in ts) for ts in g.value_tensors] == [(1,), (2,), (3,), (4,), (6,)]
    m = HybridModel(g, budget)
    S = np.zeros((g.n, g.nv), dtype=bool)
    for stage, vals in {2: [1], 3: [1, 2], 4: [1, 2, 3], 5: [2], 6: [4]}.items():
        S[stage, vals] = True
    B = np.zeros_like(S)
    B[2:7, 0] = True
    none = np.zeros_like(S)
    OFF = B.any(axis=0)
    R = solve_r_opt(g, S, arrived=none, present=B)
    xv = m.hybrid_assignment(R, S, none, none, B, OFF)
    assert xv is not None and m.satisfies(xv)   # a solution of the model
    sched = schedule_from_rs(g, R, S, swap_in=none, arrive=none, swap_out=OFF, swap_now=B)
    sim = simulate(p, sched, budget)
    assert sim.peak_bytes <= budget
    # the model's time (compute, each copy charged in full: no overlap) is what the simulator charges
    assert sim.time_s == pytest.approx(m.objective_seconds(float(m.obj @ xv)), rel=REL)


def test_smallest_failing_fuzz_case_plans_or_states_a_minimum():
    """Issue 12: fuzz case 5308 at 2 s ends in a plan the simulator accepts within the budget, or
    an infeasible budget with a larger smallest feasible one, never a ``SolverError``."""
    p, budget = fuzz_5308()
    try:
        r = solve(p, budget, "hybrid-milp", time_limit_s=2)
    except InfeasibleBudgetError as e:
        assert e.min_feasible_bytes is not None and e.min_feasible_bytes > budget
        return
    check_plan(p, r)


def test_libras_thorough_plan_is_a_starting_plan_too():
    """hybrid-milp starts from libra's hybrid plans with its default and its thorough exchange moves: on
    the large-beside-small pattern of 40 nodes (copies 4x slower than compute, 0.8 of its peak), where the
    thorough plan is the faster, ``extras["libra_time_s"]`` is that plan's time, and the result is a plan
    the simulator accepts within the budget and no slower than it."""
    from libra_opt.frontend.generators import large_beside_small_graph

    p = with_bandwidth(large_beside_small_graph(40, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    default = solve(p, budget, "libra", policy="hybrid")
    thorough = solve(p, budget, "libra", policy="hybrid", exchange_effort="thorough")
    assert thorough.time_s < default.time_s
    r = solve(p, budget, "hybrid-milp", time_limit_s=5)
    check_plan(p, r)
    assert r.extras["libra_time_s"] == pytest.approx(thorough.time_s, rel=REL)
    assert r.time_s <= thorough.time_s * (1 + REL)


def test_libras_thorough_start_runs_its_exchanges_near_the_cut_bound_too(monkeypatch):
    """The thorough plan that starts the MILP is solved with ``added_gap_tol=0`` (exchange moves even where
    the plan is near the cut bound: a reference plan); the default one with libra's default tolerance."""
    from libra_opt.frontend.generators import large_beside_small_graph
    from libra_opt.solvers import registry

    asked, get = [], registry.get_solver

    def spied(name, **options):
        asked.append((name, options))
        return get(name, **options)

    monkeypatch.setattr(registry, "get_solver", spied)
    p = with_bandwidth(large_beside_small_graph(40, seed=0), 4.0)
    check_plan(p, solve(p, int(0.8 * no_remat_peak(p)), "hybrid-milp", time_limit_s=5))
    hybrid = [o for n, o in asked if n == "libra" and o.get("policy") == "hybrid"]
    assert {o["exchange_effort"]: o.get("added_gap_tol") for o in hybrid} == {"default": None, "thorough": 0.0}
