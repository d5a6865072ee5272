"""Ctrl-C during ``checkmate-milp`` (issue 13): SIGINT to a running MILP solve
stops it with ``KeyboardInterrupt``: a non-zero exit, no "feasible" report, no
plan written, no temporary file and no CBC process left behind.  Each MILP
would run until its time limit (5 s or more); the signal comes 1 s after
the native solve starts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find CBC processes")]

PROBLEM = str(Path(__file__).resolve().parents[1] / "problems" / "resnet-tiny-b8-s32-cpu.json.gz")
BUDGET = "75%"        # the MILP finds plans here but does not prove one optimal within a minute


def _processes_mentioning(text: str, but: int | None = None) -> list[str]:
    """Command lines of the running processes, other than ``but``, that mention ``text``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in (os.getpid(), but):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(f"{pid}: {cmd}")
    return out


def _interrupt(code: str, argv: list[str], tmp_path: Path, started) -> subprocess.CompletedProcess:
    """Run ``python -c code *argv`` with its own TMPDIR, wait until
    ``started(proc, tmpdir)`` is true, send SIGINT, and return its result."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.monotonic()
        while not started(proc, str(tmpdir)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 90, "the MILP solve did not start"
            time.sleep(0.05)
        time.sleep(1.0)                                  # well inside the native solve
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _marker_seen(proc, tmpdir) -> bool:
    line = proc.stderr.readline()
    return "MILP-START" in line


def test_ctrl_c_stops_the_ortools_milp_command_without_a_plan(tmp_path):
    """``libra-opt solve --solver checkmate-milp -o plan.json`` (OR-Tools with SCIP)."""
    plan = tmp_path / "plan.json"
    driver = """
        import sys
        from ortools.linear_solver.python import model_builder_helper
        from libra_opt.cli import main

        solve = model_builder_helper.ModelSolverHelper.solve

        def announced(*args, **kwargs):
            print("MILP-START", file=sys.stderr, flush=True)
            return solve(*args, **kwargs)

        model_builder_helper.ModelSolverHelper.solve = announced
        sys.exit(main(sys.argv[1:]))
    """
    r = _interrupt(driver, ["solve", PROBLEM, "--budget", BUDGET, "--solver", "checkmate-milp", "--time-limit", "10",
                            "-o", str(plan)], tmp_path, _marker_seen)
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
        from libra_opt.problem_io import load_problem
        from libra_opt.solvers import solve

        r = solve(load_problem(sys.argv[1]), sys.argv[2], "checkmate-milp", backend="pulp", time_limit_s=60)
        r.schedule.save(sys.argv[3])
        print("solved:", r.status)
    """

    def cbc_running(proc, tmpdir):
        return bool(_processes_mentioning(tmpdir, but=proc.pid))

    r = _interrupt(driver, [PROBLEM, BUDGET, str(plan)], tmp_path, cbc_running)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, (r.stdout, r.stderr)
    assert "solved:" not in r.stdout and not plan.exists()
    assert os.listdir(tmp_path / "tmp") == []
    assert _processes_mentioning(str(tmp_path / "tmp")) == []
