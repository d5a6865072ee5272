"""The comparison harness (libra_opt.apps.compare) and ``libra-opt compare``."""
from __future__ import annotations

import argparse
import csv
import os

import pytest

from libra_opt.cli import main
from libra_opt.cli.common import budget_list_arg
from libra_opt.apps.compare import ERROR, UNAVAILABLE, compare, format_table, rows_to_csv, time_limit_options
from libra_opt.errors import SolverNotFoundError
from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.ir.problem_io import save_problem
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.solvers import RawSolution, Solver, register_solver
from libra_opt.solvers import registry

PNG = b"\x89PNG\r\n\x1a\n"


def layered_chain(n=9, size=10):
    """The chain of tests/test_baselines.py: no-remat peak 91 B; checkpoint-all 31 B (+36 s),
    chen-sqrt 51 B (+6 s), swap-all 41 B (+0 s); 19 nodes of 1 s."""
    b = ProblemBuilder()
    acts = [b.input("x", 4)]
    for i in range(1, n + 1):
        acts += b.op(f"f{i}", [acts[-1]], [(f"a{i}", size)], time_s=1.0)
    (L,) = b.op("loss", [acts[-1]], [("L", 1)], time_s=1.0)
    grad = L
    for i in range(n, 0, -1):
        out = ("gw", 1) if i == 1 else (f"e{i - 1}", size)
        (grad,) = b.op(f"g{i}", [grad, acts[i - 1]], [out], time_s=1.0, phase=BACKWARD)
    return b.build(outputs=[L, grad], name="chain9")


@pytest.fixture
def isolated_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    return registry


# ------------------------------------------------------------------ library
def test_compare_rows():
    p = layered_chain()
    rows = compare(p, [1.0, 60, "40%"], ["none", "chen-sqrt", "swap-all"], progress=False)
    assert [(r.budget_bytes, r.solver) for r in rows] == [
        (91, "none"), (91, "chen-sqrt"), (91, "swap-all"),
        (60, "none"), (60, "chen-sqrt"), (60, "swap-all"),
        (36, "none"), (36, "chen-sqrt"), (36, "swap-all")]
    by = {(r.budget_bytes, r.solver): r for r in rows}
    assert by[91, "none"].status == "optimal" and by[91, "none"].added_s == 0
    assert by[91, "none"].budget_fraction == 1.0
    assert by[60, "none"].status == "infeasible" and by[60, "none"].min_feasible_bytes == 91
    assert by[60, "chen-sqrt"].added_s == pytest.approx(6.0) and by[60, "chen-sqrt"].peak_bytes == 51
    assert by[36, "chen-sqrt"].status == "infeasible" and by[36, "chen-sqrt"].min_feasible_bytes == 51
    assert by[36, "swap-all"].status == "feasible"  # 41 B with auto prefetch is over; the late plan is 31 B
    for r in rows:
        assert r.base_s == 19.0 and r.problem == "chain9"
        if r.success:
            assert r.peak_bytes <= r.budget_bytes
            assert r.time_s == pytest.approx(19.0 + r.added_s)


def test_gap_to_best_lower_bound():
    p = layered_chain()
    rows = compare(p, [1.0, 60], ["none", "chen-sqrt"], progress=False)
    by = {(r.budget_bytes, r.solver): r for r in rows}
    # at 100 % 'none' proves the bound 19 s (every node once); chen-sqrt's 25 s is 6/19 above it
    assert by[91, "none"].best_lower_bound_s == 19.0 and by[91, "none"].gap == 0.0
    assert by[91, "chen-sqrt"].gap == pytest.approx(6.0 / 19.0)
    # at 60 B no solver reports a bound: the cut bounds do (every plan), at or below the plan
    r = by[60, "chen-sqrt"]
    assert r.bound_source.startswith(("cut bound", "compute floor")) and 19.0 <= r.best_lower_bound_s <= r.time_s
    rows = compare(p, [60], ["chen-sqrt"], progress=False, cut_bounds=False)
    assert rows[0].best_lower_bound_s is None and rows[0].gap is None


def test_compare_unknown_solver_fails_first():
    with pytest.raises(SolverNotFoundError, match="chen-sqrt"):
        compare(layered_chain(), [1.0], ["none", "no-such-solver"], progress=False)


def test_compare_records_unavailable_and_errors(isolated_registry):
    @register_solver("test-no-backend")
    class NoBackend(Solver):
        requires = ("no_such_backend_module_xyz",)

    @register_solver("test-over-budget")
    class OverBudget(Solver):
        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem))

    rows = compare(layered_chain(), [0.5], ["test-no-backend", "test-over-budget", "none"], progress=False)
    assert [r.status for r in rows] == [UNAVAILABLE, ERROR, "infeasible"]
    assert "no_such_backend_module_xyz" in rows[0].message
    assert "over the budget" in rows[1].message


def test_time_limit_options(isolated_registry):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Opts:
        time_limit_s: float = 10.0

    @register_solver("test-timed")
    class Timed(Solver):
        Options = Opts

        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem), message=f"limit {self.options.time_limit_s}")

    assert time_limit_options(["test-timed", "none", "chen-sqrt"], 5) == {"test-timed": {"time_limit_s": 5.0}}
    assert time_limit_options(["test-timed"], None) == {}
    rows = compare(layered_chain(), [1.0], ["test-timed"], solver_options={"test-timed": {"time_limit_s": 1.5}},
                   progress=False)
    assert rows[0].message == "limit 1.5"


def test_csv_and_table(tmp_path):
    rows = compare(layered_chain(), [1.0, 60], ["none", "chen-sqrt"], progress=False, cut_bounds=False)
    path = rows_to_csv(rows, tmp_path / "rows.csv")
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert len(got) == 4
    assert got[0]["solver"] == "none" and got[0]["status"] == "optimal" and got[0]["budget_bytes"] == "91"
    assert got[2]["status"] == "infeasible" and got[2]["added_s"] == "" and got[2]["min_feasible_bytes"] == "91"
    assert float(got[3]["added_pct"]) == pytest.approx(100 * 6 / 19)
    table = format_table(rows).splitlines()
    assert table[0].startswith("| budget | solver | status")
    assert len([line for line in table if line.startswith("|")]) == 2 + 4
    assert "needs >= 91 B" in table[4]
    assert "bound unknown *" in table[5] and table[-1].startswith("* bound unknown")  # chen-sqrt at 60 B


def test_budget_list_arg():
    assert budget_list_arg("0.9, 80%,12GiB,1000000B,1.0,1") == [0.9, "80%", "12GiB", "1000000B", 1.0, 1.0]
    with pytest.raises(argparse.ArgumentTypeError, match="empty budget"):
        budget_list_arg("0.9,,0.7")
    with pytest.raises(argparse.ArgumentTypeError, match="did you mean 1000000% or 1000000MiB"):
        budget_list_arg("0.9,1000000")


# ---------------------------------------------------------------------- CLI
@pytest.fixture
def problem_file(tmp_path):
    return str(save_problem(layered_chain(), tmp_path / "chain.json"))


def test_cli_compare_table_csv_plot(problem_file, tmp_path, capsys):
    out_csv, out_png = tmp_path / "out.csv", tmp_path / "out.png"
    rc = main(["compare", problem_file, "--budgets", "1.0,60B,40%", "--solvers", "none,chen-sqrt,swap-all",
               "--csv", str(out_csv), "--plot", str(out_png), "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "no-remat peak 91 B (91 bytes)" in out
    assert "| 100% (91 B) | none | optimal |" in out
    assert "| 66% (60 B) | chen-sqrt | feasible | 6.000 s |" in out
    with open(out_csv) as f:
        assert len(list(csv.DictReader(f))) == 9
    assert out_png.read_bytes()[:8] == PNG


def test_cli_compare_time_limit_and_remat_graph(checkmate_graph_file, capsys):
    rc = main(["compare", checkmate_graph_file, "--budgets", "0.9", "--solvers", "none,chen-greedy",
               "--time-limit", "5", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "mirror_train (21 nodes)" in out and "relative cost units" in out
    assert "| chen-greedy | feasible |" in out and "| none | infeasible |" in out


def test_cli_compare_bad_input(problem_file, tmp_path, capsys):
    assert main(["compare", problem_file, "--budgets", "lots", "--no-progress"]) == 2
    assert "--budgets" in capsys.readouterr().err
    assert main(["compare", problem_file, "--solvers", "no-such-solver", "--no-progress"]) == 2
    assert "unknown solver 'no-such-solver'" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing.json"), "--no-progress"]) == 2
    assert "cannot read" in capsys.readouterr().err
