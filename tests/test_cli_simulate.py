"""``libra-opt simulate`` through :func:`libra_opt.cli.main`, and the plots it
(and the benchmarks) make with :mod:`libra_opt.plots`."""
from __future__ import annotations

import json
import os

import pytest

from libra_opt.cli import main
from libra_opt.apps.plots import PlotError, plot_budget_curve, plot_memory_timeline
from libra_opt.ir.problem import BACKWARD, DeviceProfile, FixedMemory, ProblemBuilder
from libra_opt.ir.problem_io import save_problem
from libra_opt.ir.schedule import Compute, Free, Schedule, no_remat_schedule
from libra_opt.passes.simulator import simulate

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def problem_file(tmp_path, tiny_problem):
    return str(save_problem(tiny_problem, tmp_path / "tiny.json"))


def test_simulate_prints_the_no_remat_numbers(problem_file, capsys):
    assert main(["simulate", problem_file]) == 0
    out = capsys.readouterr().out
    # no remat: f 100 | g 200 | h 300 | ... -> peak 300 B; with the 1000 B of parameters 1300 B
    assert "(300 bytes) graph memory" in out and "(1300 bytes) with fixed memory" in out
    assert "step 4.000 s" in out               # 4 nodes of 1 s
    assert "recompute 0.0 us, stalls 0.0 us" in out
    assert "0 B out, 0 B in" in out


def test_simulate_a_plan_with_budget_and_plot(problem_file, tmp_path, capsys, tiny_recompute_plan):
    plan = tmp_path / "plan.json"
    tiny_recompute_plan.save(plan)
    png = tmp_path / "timeline.png"
    code = main(["simulate", problem_file, "--plan", str(plan), "--budget", "210B", "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "(210 bytes) graph memory" in out   # k holds gb + a + ga = 210 B
    assert "step 5.000 s" in out and "recompute 1.000 s" in out
    assert "within" in out
    assert png.read_bytes()[:8] == PNG


def test_simulate_over_budget_exits_1_naming_the_instruction(problem_file, capsys):
    assert main(["simulate", problem_file, "--budget", "299B"]) == 1
    captured = capsys.readouterr()
    assert "OVER by" in captured.out
    # the first instruction over 299 B is Compute(h) (index 2 of the no-remat plan: a + b + gb = 300 B)
    assert "instruction 2 (Compute(h))" in captured.err


def test_simulate_relative_budget(problem_file, capsys):
    # 70% of the no-remat peak (300 B) = 210 B: the no-remat plan is over it
    assert main(["simulate", problem_file, "--budget", "70%"]) == 1
    assert "(210 bytes)" in capsys.readouterr().out
    assert main(["simulate", problem_file, "--budget", "1.0"]) == 0


def test_simulate_a_remat_graph(checkmate_graph_file, capsys):
    assert main(["simulate", checkmate_graph_file]) == 0
    out = capsys.readouterr().out
    assert "mirror_train (21 nodes" in out and "relative cost units" in out


def test_simulate_reports_a_bad_file(tmp_path, capsys, problem_file):
    bad = tmp_path / "bad.json"
    d = json.loads(open(problem_file).read())
    d["nodes"][2]["time_s"] = "slow"
    bad.write_text(json.dumps(d))
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "nodes[2].time_s" in err and str(bad) in err
    assert main(["simulate", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_simulate_reports_an_invalid_plan(problem_file, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    Schedule([Compute(1)]).save(plan)
    assert main(["simulate", problem_file, "--plan", str(plan)]) == 2
    assert "instruction 0 (Compute(g))" in capsys.readouterr().err


# ------------------------------------------------------------------ plots
def test_plot_memory_timeline_of_two_plans(tmp_path, tiny_problem, tiny_recompute_plan):
    p = tiny_problem
    plans = {"no remat": (no_remat_schedule(p), simulate(p)),
             "recompute a": (tiny_recompute_plan, simulate(p, tiny_recompute_plan))}
    out = plot_memory_timeline(p, plans, tmp_path / "t.png", budget_bytes=250)
    assert out.read_bytes()[:8] == PNG
    # a list and a bare result are accepted too
    assert plot_memory_timeline(p, [simulate(p)], tmp_path / "u.png").exists()
    with pytest.raises(PlotError, match="no plans"):
        plot_memory_timeline(p, {}, tmp_path / "v.png")
    with pytest.raises(PlotError, match="expected"):
        plot_memory_timeline(p, {"x": 3}, tmp_path / "v.png")


def test_plot_budget_curve(tmp_path):
    rows = [
        {"method": "libra", "budget_fraction": 0.9, "added_s": 0.1, "time_s": 1.1},
        {"method": "libra", "budget_fraction": 0.7, "added_pct": 25.0},
        {"method": "chen-sqrt", "budget_fraction": 0.7, "added_s": 0.3, "base_s": 1.0},
        {"method": "chen-sqrt", "budget_fraction": 0.5, "added_s": None},  # infeasible: skipped
    ]
    out = plot_budget_curve(rows, tmp_path / "c.png", title="tiny")
    assert out.read_bytes()[:8] == PNG
    # bytes on x when there is no fraction
    assert plot_budget_curve([{"solver": "none", "budget_bytes": 2**30, "added_pct": 0.0}], tmp_path / "d.png")
    with pytest.raises(PlotError, match="nothing to plot"):
        plot_budget_curve([{"method": "x", "budget_fraction": 0.5}], tmp_path / "e.png")
    with pytest.raises(PlotError, match="no 'method'"):
        plot_budget_curve([{"budget_fraction": 0.5, "added_pct": 1.0}], tmp_path / "e.png")
