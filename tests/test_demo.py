"""``libra-opt demo`` (issue 6.1): the pipeline on a tiny GPT-2 on the CPU
trains like eager PyTorch within the budget, and the report and the command
say what they must."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from libra_opt.apps.demo import DemoConfig, MemoryBreakdown, memory_breakdown, run_demo
from libra_opt.errors import LibraOptError
from libra_opt.passes.lowering import default_windows
from libra_opt.ir.problem import BACKWARD, FORWARD, ProblemBuilder
from libra_opt.ir.schedule import no_remat_schedule

TABLE_FIELDS = ("no-remat peak", "budget", "planned peak", "measured peak", "step-time overhead", "solve time",
                "loss check")


@pytest.fixture(scope="module")
def report():
    stages = []
    rep = run_demo(DemoConfig(model="gpt2-tiny", batch=4, seq=32, steps=2, device="cpu"),
                   progress=lambda stage, msg: stages.append(stage))
    rep.stages_seen = stages
    return rep


def test_demo_trains_like_eager_within_the_budget(report):
    assert report.loss_ok
    assert len(report.losses_eager) == len(report.losses_planned) == 2
    for a, b in zip(report.losses_eager, report.losses_planned):
        assert b == pytest.approx(a, rel=1e-5)
    # the second step's loss differs from the first: AdamW really updated the weights
    assert report.losses_planned[1] != report.losses_planned[0]
    assert report.budget_bytes == int(0.5 * report.no_remat_peak_bytes)
    assert report.planned_peak_bytes <= report.budget_bytes
    # measured on the CPU by the runtime's storage tracker: the plan holds, eager does not
    assert report.measured_peak_bytes is not None
    assert report.measured_peak_bytes <= 1.05 * report.budget_bytes
    assert report.eager_measured_peak_bytes > report.budget_bytes
    assert report.eager_step_s > 0 and report.planned_step_s > 0 and report.solve_s > 0


def test_demo_reports_every_field_and_stage(report):
    text = report.text()
    for name in TABLE_FIELDS:
        assert name in text
    assert [k for k, _ in report.rows()] == list(TABLE_FIELDS)
    for word in ("recomputed", "swapped", "kept"):
        assert word in text
    assert {"build", "profile", "solve", "train"} <= set(report.stages_seen)
    assert report.stages_seen.index("build") < report.stages_seen.index("profile") < \
        report.stages_seen.index("solve") < report.stages_seen.index("train")


def test_demo_breakdown_covers_the_saved_activations(report):
    b = report.breakdown
    # halving the peak needs evictions; every saved activation is counted once
    assert b.recomputed_bytes + b.swapped_bytes > 0
    assert b.recomputed_count + b.swapped_count + b.kept_count >= 1


# ---------------------------------------------------------------- breakdown by hand
def _toy():
    """x -> a (100 B) -> b (200 B) -> loss (4 B); backward reads a, b and a 50 B c."""
    pb = ProblemBuilder()
    x = pb.input("x", 8)
    (a,) = pb.op("fa", [x], [("a", 100)], time_s=1.0)
    (b,) = pb.op("fb", [a], [("b", 200)], time_s=2.0)
    (c,) = pb.op("fc", [b], [("c", 50)], time_s=1.0)
    (loss,) = pb.op("floss", [c], [("loss", 4)], time_s=1.0)
    (g1,) = pb.op("g1", [loss, c], [("g1", 8)], time_s=1.0, phase=BACKWARD)
    (g2,) = pb.op("g2", [g1, b], [("g2", 8)], time_s=1.0, phase=BACKWARD)
    (g3,) = pb.op("g3", [g2, a], [("g3", 8)], time_s=1.0, phase=BACKWARD)
    return pb.build(outputs=[loss, g3]), a, b, c


def test_memory_breakdown_from_eviction_decisions_by_hand():
    p, a, b, c = _toy()
    assert set(default_windows(p)) == {a, b}      # c is used right before backward: no window
    sched = no_remat_schedule(p)
    sched.meta["evictions"] = [[a, 1, 6, "recompute"], [b, 2, 5, "swap"]]
    got = memory_breakdown(p, sched)
    assert got == MemoryBreakdown(recomputed_bytes=100, recomputed_count=1, swapped_bytes=200, swapped_count=1,
                                  kept_bytes=0, kept_count=0)
    sched.meta["evictions"] = [[b, 2, 5, "swap"]]
    got = memory_breakdown(p, sched)
    assert (got.swapped_bytes, got.recomputed_bytes, got.kept_bytes, got.kept_count) == (200, 0, 100, 1)
    assert any("kept" in line and "100 B" in line for line in got.lines())


def test_memory_breakdown_without_meta_reads_the_schedule():
    from libra_opt.ir.schedule import Compute, Free, Schedule

    p, a, b, c = _toy()
    base = no_remat_schedule(p).instructions
    # recompute a: free it after fb, compute fa again before g3
    out = []
    for ins in base:
        if ins == Compute(6):
            out.append(Compute(0))
        out.append(ins)
        if ins == Compute(1):
            out.append(Free(a))
    got = memory_breakdown(p, Schedule(out))
    assert (got.recomputed_bytes, got.recomputed_count, got.swapped_bytes, got.kept_bytes) == (100, 1, 0, 200)


# ---------------------------------------------------------------- config and command
def test_config_defaults_and_bad_options():
    cfg = DemoConfig(device="cpu").resolved()
    assert (cfg.model, cfg.batch, cfg.seq) == ("gpt2-cpu", 8, 128)
    assert DemoConfig(device="cpu", model="bert-tiny").resolved().batch == 4
    with pytest.raises(LibraOptError, match="--steps"):
        DemoConfig(device="cpu", steps=1).resolved()
    if not torch.cuda.is_available():
        with pytest.raises(LibraOptError, match="CUDA is not available"):
            DemoConfig(device="cuda").resolved()


def test_cli_demo_prints_the_table_and_fails_on_a_loss_mismatch(report, monkeypatch, capsys):
    import libra_opt.apps.demo
    from libra_opt.cli import main

    seen = {}

    def fake_run_demo(cfg, progress=None):
        seen["cfg"] = cfg
        progress("build", "fake")
        return report

    monkeypatch.setattr(libra_opt.apps.demo, "run_demo", fake_run_demo)
    assert main(["demo", "--model", "gpt2-tiny", "--budget", "40%", "--solver", "libra", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "[1/4] build: fake" in out
    for name in TABLE_FIELDS:
        assert name in out
    assert seen["cfg"].budget == "40%" and seen["cfg"].model == "gpt2-tiny" and seen["cfg"].steps == 2

    bad = dataclasses.replace(report, loss_ok=False, loss_max_rel_diff=0.5)
    monkeypatch.setattr(libra_opt.apps.demo, "run_demo", lambda cfg, progress=None: bad)
    assert main(["demo", "--model", "gpt2-tiny"]) == 1
    assert "does not match eager" in capsys.readouterr().err


def test_demo_infeasible_budget_names_the_smallest_feasible_one():
    from libra_opt.errors import InfeasibleBudgetError

    with pytest.raises(InfeasibleBudgetError, match="smallest feasible budget|raise the budget"):
        run_demo(DemoConfig(model="gpt2-tiny", batch=1, seq=8, steps=2, device="cpu", budget=64))
