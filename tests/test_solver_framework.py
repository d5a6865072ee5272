"""The solver framework: registry, budgets, options, infeasibility, validation
of every plan by the simulator (solvers/base.py, registry.py, __init__.py)."""
import dataclasses
import warnings

import pytest

from libra_opt.errors import (InfeasibleBudgetError, SolverError, SolverNotFoundError, SolverUnavailableError)
from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.ir.schedule import Schedule, no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import (BUILTIN_SOLVERS, FEASIBLE, INFEASIBLE, STATUSES, RawSolution, Solver,
                               UnknownOptionWarning, available_solvers, get_solver, register_solver, solve,
                               solve_many, solver_class)
from libra_opt.solvers import registry
from libra_opt.solvers.baselines import ChenSqrtSolver, NoRematSolver
from libra_opt.ir.units import format_bytes

BASELINES = ["none", "checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all"]


def chain(n=6, size=100):
    b = ProblemBuilder()
    acts = [b.input("x", 8)]
    for i in range(1, n + 1):
        acts += b.op(f"f{i}", [acts[-1]], [(f"a{i}", size)], time_s=1.0)
    (L,) = b.op("loss", [acts[-1]], [("L", 4)], time_s=1.0)
    grad = L
    for i in range(n, 0, -1):
        (grad,) = b.op(f"g{i}", [grad, acts[i - 1]], [(f"d{i}", size if i > 1 else 4)], time_s=1.0,
                       phase=BACKWARD)
    return b.build(outputs=[L, grad])


@pytest.fixture
def isolated_registry(monkeypatch):
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    return registry


# ---------------------------------------------------------------- registry
def test_unknown_name_lists_known_ones():
    with pytest.raises(SolverNotFoundError) as e:
        solver_class("no-such-solver")
    for name in ("libra", "checkmate-milp", "chen-sqrt", "swap-all"):
        assert name in str(e.value)
    with pytest.raises(SolverNotFoundError):
        solve(chain(), 1.0, "no-such-solver")


def test_builtins_listed_first():
    names = available_solvers()
    assert names[:len(BUILTIN_SOLVERS)] == list(BUILTIN_SOLVERS)
    assert set(BASELINES) <= set(names)


def test_register_solver_adds_one(isolated_registry):
    @register_solver("test-keep-everything")
    class KeepEverything(Solver):
        """Test plug-in: the no-remat plan.  Source: this test."""
        citation = "test"

        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem))

    assert KeepEverything.name == "test-keep-everything"
    assert "test-keep-everything" in available_solvers()
    assert solver_class("test-keep-everything") is KeepEverything
    r = solve(chain(), 1.0, "test-keep-everything")
    assert r.solver == "test-keep-everything" and r.status == FEASIBLE
    assert r.added_s == 0


def test_plugin_cannot_shadow_builtin(isolated_registry):
    with pytest.raises(SolverError, match="built-in"):
        @register_solver("chen-sqrt")
        class Impostor(Solver):
            def _solve(self, problem, budget_bytes):  # pragma: no cover
                raise AssertionError
    assert solver_class("chen-sqrt") is ChenSqrtSolver


def test_name_taken_by_another_plugin(isolated_registry):
    @register_solver("test-twice")
    class A(Solver):
        pass

    with pytest.raises(SolverError, match="already registered"):
        @register_solver("test-twice")
        class B(Solver):
            pass


def test_register_needs_a_solver_class(isolated_registry):
    with pytest.raises(TypeError, match="Solver subclass"):
        register_solver("test-not-a-solver")(object)


def test_solver_instance_and_class_accepted():
    p = chain()
    assert solve(p, 1.0, NoRematSolver).schedule == no_remat_schedule(p)
    inst = NoRematSolver()
    assert solve(p, 1.0, inst).schedule == no_remat_schedule(p)
    assert get_solver(inst) is inst
    with pytest.raises(TypeError, match="instance"):
        get_solver(inst, foo=1)
    with pytest.raises(TypeError, match="name, a Solver class or instance"):
        get_solver(42)


def test_missing_backend_is_unavailable(isolated_registry):
    @register_solver("test-needs-backend")
    class NeedsBackend(Solver):
        requires = ("no_such_backend_module_xyz",)

        def _solve(self, problem, budget_bytes):  # pragma: no cover
            raise AssertionError

    assert not NeedsBackend.is_available()
    assert NeedsBackend.missing_modules() == ["no_such_backend_module_xyz"]
    with pytest.raises(SolverUnavailableError, match="pip install no_such_backend_module_xyz"):
        solve(chain(), 1.0, "test-needs-backend")


# ----------------------------------------------------------------- budgets
@pytest.mark.parametrize("budget, expected", [
    (400, 400),
    ("1KiB", 1024),
    ("60%", None),   # 60 % of the no-remat peak
    (0.6, None),
])
def test_budget_forms(budget, expected):
    p = chain()
    peak = no_remat_peak(p)
    # no remat: after f6 a1..a6 = 600, the loss adds 4: 604
    assert peak == 604
    expected = int(0.6 * peak) if expected is None else expected
    r = solve(p, budget, "checkpoint-all", raise_on_infeasible=False)
    assert r.budget_bytes == expected


def test_bad_budget():
    with pytest.raises(ValueError):
        solve(chain(), "lots", "none")
    with pytest.raises(ValueError):
        solve(chain(), 0, "none")


# ----------------------------------------------------------------- options
def test_unknown_option_warns():
    with pytest.warns(UnknownOptionWarning, match="no_such_option"):
        s = get_solver("chen-sqrt", no_such_option=3)
    assert s.options == ChenSqrtSolver.Options()


def test_known_option_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = get_solver("chen-sqrt", candidates="all")
    assert s.options.candidates == "all"
    assert dataclasses.is_dataclass(s.options)


# ----------------------------------------------------------- infeasibility
def test_infeasible_error_states_smallest_budget():
    p = chain()
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(p, 500, "none")
    err = e.value
    assert err.min_feasible_bytes == 604 and err.budget_bytes == 500 and err.solver == "none"
    assert format_bytes(604) in str(err) and "raise the budget" in str(err)


def test_raise_on_infeasible_false_gives_status():
    p = chain()
    r = solve(p, 500, "none", raise_on_infeasible=False)
    assert r.status == INFEASIBLE and r.schedule is None and not r.success
    assert r.min_feasible_bytes == 604
    assert "604" in r.message


def test_solve_many_keeps_order_and_reports_infeasible():
    p = chain()
    rs = solve_many(p, [1.0, 500, 0.99], "none")
    assert [r.status for r in rs] == ["optimal", INFEASIBLE, INFEASIBLE]
    assert [r.budget_bytes for r in rs] == [604, 500, int(0.99 * 604)]


def test_over_budget_plan_is_a_solver_bug(isolated_registry):
    @register_solver("test-liar")
    class Liar(Solver):
        """Claims the no-remat plan fits any budget."""

        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem))

    with pytest.raises(SolverError, match="simulator rejects.*over the budget"):
        solve(chain(), 0.5, "test-liar")


def test_invalid_plan_is_a_solver_bug(isolated_registry):
    @register_solver("test-broken")
    class Broken(Solver):
        def _solve(self, problem, budget_bytes):
            return RawSolution(Schedule(no_remat_schedule(problem).instructions[1:]))

    with pytest.raises(SolverError, match="before it is computed"):
        solve(chain(), 1.0, "test-broken")


# ------------------------------------------------- every plan is validated
@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("budget", [1.0, 0.8, 0.5, 0.3, 250])
def test_every_plan_passes_the_simulator(name, budget):
    p = chain()
    r = solve(p, budget, name, raise_on_infeasible=False)
    assert r.status in STATUSES
    if r.schedule is None:
        assert r.status == INFEASIBLE and r.min_feasible_bytes > r.budget_bytes
        return
    sim = simulate(p, r.schedule, r.budget_bytes)  # raises if over budget or invalid
    assert sim.peak_bytes == r.peak_bytes <= r.budget_bytes
    assert r.time_s == pytest.approx(sim.time_s) and r.added_s == pytest.approx(sim.added_s)
    assert r.schedule.meta["solver"] == name and r.schedule.meta["budget_bytes"] == r.budget_bytes
    assert r.solve_s >= 0
