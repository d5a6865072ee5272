"""Property tests: on random training-like DAGs (a forward half and a mirrored
backward half) and random budgets, every solver either returns a plan the
simulator accepts within the budget or raises InfeasibleBudgetError; none
returns an over-budget plan (the base class would turn that into SolverError,
which fails these tests)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra_opt.passes.bounds import memory_lower_bound
from libra_opt.apps.compare import time_limit_options
from libra_opt.errors import InfeasibleBudgetError
from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import BUILTIN_SOLVERS, get_solver, solver_class

BASELINES = {"none", "checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all"}
MILP_TIME_LIMIT_S = 2.0


@st.composite
def training_dags(draw):
    """A forward of 2..7 ops (each reads 1-2 earlier values; some make a view, some two outputs,
    some are not recomputable), a loss, and a backward that visits the forward ops in reverse,
    each reading the running gradient and the forward op's inputs (the saved activations)."""
    n = draw(st.integers(2, 7))
    b = ProblemBuilder()
    x = b.input("x", draw(st.integers(1, 64)))
    values = [x]
    fwd = []  # (inputs, outputs) per forward op
    for i in range(n):
        k = draw(st.integers(1, min(2, len(values))))
        ins = draw(st.lists(st.sampled_from(values), min_size=1, max_size=k, unique=True))
        if values[-1] not in ins:
            ins.append(values[-1])  # keep the chain connected
        shape = draw(st.sampled_from(["plain", "plain", "view", "two"]))
        size = draw(st.integers(1, 100))
        recomputable = draw(st.booleans()) or draw(st.booleans())  # 3 in 4 recomputable
        t = draw(st.floats(0.1, 5.0))
        if shape == "two":
            outs = b.op(f"f{i}", ins, [(f"a{i}", size), (f"b{i}", draw(st.integers(1, 50)))], time_s=t,
                        recomputable=recomputable, workspace_bytes=draw(st.integers(0, 20)))
        else:
            outs = b.op(f"f{i}", ins, [(f"a{i}", size)], time_s=t, recomputable=recomputable)
            if shape == "view" and b._tensors[outs[0]]["kind"] == "activation":
                outs += b.op(f"v{i}", [outs[0]], [(f"a{i}v", 0, outs[0])], time_s=0.0)
        fwd.append((ins, outs))
        values.extend(outs)
    (L,) = b.op("loss", [values[-1]], [("L", draw(st.integers(1, 8)))], time_s=0.5)
    grad = L
    grads = []
    for i in reversed(range(n)):
        ins, outs = fwd[i]
        saved = list(dict.fromkeys(ins + ([outs[0]] if draw(st.booleans()) else [])))
        (grad,) = b.op(f"g{i}", [grad] + saved, [(f"d{i}", draw(st.integers(1, 100)))],
                       time_s=draw(st.floats(0.1, 5.0)), phase=BACKWARD)
        if draw(st.booleans()):
            (pg,) = b.op(f"pg{i}", [grad], [(f"w{i}.grad", draw(st.integers(1, 16)))], time_s=0.1,
                         phase=BACKWARD)
            grads.append(pg)
    return b.build(outputs=[L, grad] + grads)


def _importable(name):
    try:
        solver_class(name)
    except ImportError:
        return False
    return True


def _solver(name):
    if not _importable(name):
        pytest.skip(f"solver {name!r} is not importable yet")
    return get_solver(name, **time_limit_options([name], MILP_TIME_LIMIT_S).get(name, {}))


def check_solver(solver, problem, frac):
    peak = no_remat_peak(problem)
    budget = max(1, int(frac * peak))
    try:
        r = solver.solve(problem, budget)
    except InfeasibleBudgetError as e:
        assert e.budget_bytes == budget
        if e.min_feasible_bytes is not None:
            assert e.min_feasible_bytes > budget
            assert e.min_feasible_bytes >= memory_lower_bound(problem)
        return None, e
    assert r.schedule is not None and r.peak_bytes <= budget
    sim = simulate(problem, r.schedule, budget)  # raises if invalid or over budget
    assert sim.peak_bytes == r.peak_bytes
    assert r.added_s == pytest.approx(sim.added_s, abs=1e-9)
    assert r.added_s >= -1e-9  # nothing beats computing every node once
    assert budget >= memory_lower_bound(problem)
    return r, None


@pytest.mark.parametrize("name", list(BUILTIN_SOLVERS))
def test_plan_within_budget_or_infeasible(name):
    solver = _solver(name)
    examples = 40 if name in BASELINES else 15

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problem=training_dags(), frac=st.floats(0.2, 1.2))
    def prop(problem, frac):
        check_solver(solver, problem, frac)

    prop()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_stated_minimum_is_feasible(name):
    """A deterministic baseline's smallest feasible budget is met when asked for."""
    solver = _solver(name)

    @settings(max_examples=30, deadline=None)
    @given(problem=training_dags(), frac=st.floats(0.05, 0.9))
    def prop(problem, frac):
        _, err = check_solver(solver, problem, frac)
        if err is not None and err.min_feasible_bytes is not None:
            r = solver.solve(problem, err.min_feasible_bytes)
            assert r.peak_bytes <= err.min_feasible_bytes

    prop()


def test_no_remat_budget_is_always_feasible_for_none():
    @settings(max_examples=30, deadline=None)
    @given(problem=training_dags())
    def prop(problem):
        r = get_solver("none").solve(problem, 1.0)
        assert r.added_s == pytest.approx(0, abs=1e-9) and r.peak_bytes == no_remat_peak(problem)

    prop()
