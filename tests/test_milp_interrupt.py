"""Ctrl-C during ``checkmate-milp`` (issue 13): SIGINT to a running MILP solve
stops it with ``KeyboardInterrupt``: a non-zero exit, no "feasible" report, no
plan written, no temporary file and no CBC process left behind.  Each MILP
would run until its time limit (5 s or more); the signal comes 1 s after
the native solve starts."""
from __future__ import annotations

import os
import sys

import pytest
from _interrupt import PROBLEM, interrupt, interrupt_native_solve, processes_mentioning

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find CBC processes")]

BUDGET = "75%"        # the MILP finds plans here but does not prove one optimal within a minute


def test_ctrl_c_stops_the_ortools_milp_command_without_a_plan(tmp_path):
    """``libra-opt solve --solver checkmate-milp -o plan.json`` (OR-Tools with SCIP)."""
    plan = tmp_path / "plan.json"
    driver = """
        from libra_opt.cli import main

        sys.exit(main(sys.argv[1:]))
    """
    r = interrupt_native_solve(driver, ["solve", PROBLEM, "--budget", BUDGET, "--solver", "checkmate-milp",
                                        "--time-limit", "10", "-o", str(plan)], tmp_path)
    assert r.returncode != 0, r.stdout
    assert "KeyboardInterrupt" in r.stderr
    assert "result:" not in r.stdout and "feasible" not in r.stdout and "time_limit" not in r.stdout
    assert not plan.exists()
    assert os.listdir(tmp_path / "tmp") == []


def test_ctrl_c_kills_pulps_cbc_and_removes_its_files(tmp_path):
    """``solve(..., backend="pulp")``: the CBC child dies with the solve and
    PuLP's ``.mps`` / ``.mst`` / ``.sol`` files are removed."""
    plan = tmp_path / "plan.json"
    driver = """
        import sys
        from libra_opt.ir.problem_io import load_problem
        from libra_opt.solvers import solve

        r = solve(load_problem(sys.argv[1]), sys.argv[2], "checkmate-milp", backend="pulp", time_limit_s=60)
        r.schedule.save(sys.argv[3])
        print("solved:", r.status)
    """

    def cbc_running(proc, tmpdir):
        return bool(processes_mentioning(tmpdir, but=proc.pid))

    r = interrupt(driver, [PROBLEM, BUDGET, str(plan)], tmp_path, cbc_running)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, (r.stdout, r.stderr)
    assert "solved:" not in r.stdout and not plan.exists()
    assert os.listdir(tmp_path / "tmp") == []
    assert processes_mentioning(str(tmp_path / "tmp")) == []
