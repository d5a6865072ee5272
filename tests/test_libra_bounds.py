"""The swap-only lower bound (``solvers/libra/bounds.py``) and the hybrid
portfolio's use of it: a bound below every plan the swap-only descent
finishes, and a skip that never changes a result."""
from pathlib import Path

import numpy as np
import pytest

from libra_opt import load_problem
from libra_opt.frontend.generators import random_layered_graph
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import get_solver
from libra_opt.solvers.libra.bounds import swap_only_lower_bounds
from libra_opt.solvers.libra.refine import Refiner
from libra_opt.solvers.libra.solver import LibraSolver

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"
FRACTIONS = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)


def copies_as_slow_as(n, seed, ratio):
    """A random layered graph whose copies move the no-remat peak in ``ratio`` no-remat steps."""
    p = random_layered_graph(n, seed=seed)
    step = simulate(p, no_remat_schedule(p)).time_s
    return random_layered_graph(n, seed=seed, bandwidth_bytes_per_s=no_remat_peak(p) / (ratio * step))


def swap_descent(problem):
    """The hybrid portfolio's swap-only descent."""
    return next(r for r in LibraSolver()._refiners(problem) if type(r) is Refiner and r.opts.policy == "swap")


@pytest.mark.parametrize("make", [lambda: copies_as_slow_as(80, 1, 1.0), lambda: copies_as_slow_as(80, 2, 4.0),
                                  lambda: copies_as_slow_as(120, 0, 0.25),
                                  lambda: load_problem(PROBLEMS / "h100_resnet50_b128.json.gz")])
def test_the_bound_is_under_every_swap_only_plan(make):
    """At every budget the swap-only descent's finished plan meets, its simulated added time is at
    least the bound; where the bound is infinite the descent meets no plan; at the no-remat peak
    the bound is 0; and the bound does not decrease as the budget does."""
    p = make()
    peak = no_remat_peak(p)
    ref = swap_descent(p)
    budgets = [int(f * peak) for f in FRACTIONS]
    bounds = swap_only_lower_bounds(ref.tl, budgets + [peak])
    assert bounds[peak] == 0.0
    assert all(bounds[a] <= bounds[b] for a, b in zip(budgets, budgets[1:]))
    snaps = ref.descend(budgets)
    met = 0
    for b in budgets:
        plan = ref.finish(snaps[b], b) if b in snaps else None
        if plan is None:
            continue
        met += 1
        assert np.isfinite(bounds[b]) and plan.simulation.added_s >= bounds[b] - 1e-12 * p.total_compute_s, b / peak
    assert met >= 1


def test_the_bound_counts_the_copy_queue():
    """a (4 bytes) and c (4 bytes) stay alive over node e, whose workspace makes it the peak; the
    copy queue moves 1 byte/s, from the end of each producer (a at 1 s, c at 2 s), one copy at a
    time: 4 bytes are on the host at 5 s and 8 at 9 s, while e starts at 3 s."""
    from libra_opt.ir.problem import BACKWARD, DeviceProfile, ProblemBuilder

    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 4)], time_s=1.0)
    (c,) = b.op("fc", [a], [("c", 4)], time_s=1.0)
    (d,) = b.op("fd", [c], [("d", 1)], time_s=1.0)
    (e,) = b.op("fe", [d], [("e", 1)], time_s=1.0, workspace_bytes=100)
    (loss,) = b.op("loss", [e], [("L", 1)], time_s=1.0)
    (gc,) = b.op("gc", [loss, c], [("gc", 1)], time_s=1.0, phase=BACKWARD)
    (ga,) = b.op("ga", [gc, a], [("ga", 1)], time_s=1.0, phase=BACKWARD)
    p = b.build(outputs=[ga], device=DeviceProfile(h2d_bytes_per_s=1.0, d2h_bytes_per_s=1.0,
                                                     copies_overlap_compute=True))
    ref = swap_descent(p)
    top = int(p.tables.C0.max())
    assert int(np.argmax(p.tables.C0)) == 3 and sorted(p.tables.C0)[-2] < top - 9
    got = swap_only_lower_bounds(ref.tl, [top - 4, top - 8, top - 9, top])
    assert got == {top - 4: pytest.approx(2.0), top - 8: pytest.approx(6.0), top - 9: np.inf, top: 0.0}


@pytest.mark.parametrize("frac", [0.7, 0.5])
def test_a_skipped_swap_only_descent_changes_no_plan(frac, monkeypatch, descend_calls):
    """Where the bound skips the swap-only descent (hybrid's plan on ResNet-50 b128 costs a fraction
    of it), the plan is the one the portfolio returns without skipping; and where the plan found
    does not cost less than the bound, the skipped descent runs after all (here forced: every plan
    is taken to cost too much) and the plan is again the same."""
    p = load_problem(PROBLEMS / "h100_resnet50_b128.json.gz")
    budget = int(frac * no_remat_peak(p))
    skipped = []
    real = LibraSolver._skipped

    def spy(self, ref, first, budgets):
        out = real(self, ref, first, budgets)
        skipped.extend(out)
        return out

    monkeypatch.setattr(LibraSolver, "_skipped", spy)
    with_skip = get_solver("libra").solve(p, budget)
    assert skipped == [budget]
    monkeypatch.setattr(LibraSolver, "SKIP_RATIO", np.inf)
    without = get_solver("libra").solve(p, budget)
    assert with_skip.schedule.instructions == without.schedule.instructions
    monkeypatch.setattr(LibraSolver, "SKIP_RATIO", 2.0)
    monkeypatch.setattr(LibraSolver, "_added_s", staticmethod(lambda problem, raw: np.inf))
    descend_calls.clear()
    redone = get_solver("libra").solve(p, budget)
    assert ("swap", (budget,)) in descend_calls[3:]
    assert redone.schedule.instructions == without.schedule.instructions
