"""benchmarks/headline.py and benchmarks/gpu_check.py: the CPU-runnable parts
(results accumulation, table rendering, keyword handling, target evaluation,
the command lines) on a tiny model."""
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from libra_opt.errors import LibraOptError

from _benchmark_scripts import BENCH, load_benchmark


hl = load_benchmark("headline")
gc_ = load_benchmark("gpu_check")   # (it imports headline by that name)


def test_headline_lists_every_method_of_issues_10_and_11():
    names = set(hl.METHODS)
    assert {"eager", "checkpoint", "save-on-cpu"} <= names
    assert {f"compile-amb-{a:g}" for a in (1.0, 0.8, 0.5, 0.3, 0.1)} <= names
    assert {f"libra-{p}-{e}" for p in ("hybrid", "recompute", "swap") for e in ("eager", "inductor")} <= names
    assert hl.METHODS["libra-swap-inductor"].options == (("policy", "swap"),)


def test_merge_results_accumulates_per_key():
    store = {}
    hl.merge_results(store, {"maxbatch": {"eager": {"batch": 4}},
                             "common": {"4": {"eager": {"samples_per_s": 50.0}}},
                             "sweep": {"8": {"eager": {"step_s": 1.0, "peak_bytes": 100},
                                             "rows": {hl.row_key("libra-hybrid-eager", "0.5"): {"step_s": 1.2}}}}})
    # a later call: another method, another budget, the same budget again, another batch
    hl.merge_results(store, {"maxbatch": {"checkpoint": {"batch": 15}},
                             "common": {"4": {"checkpoint": {"samples_per_s": 46.0}}, "15": {"eager": {"oom": True}}},
                             "sweep": {"8": {"rows": {hl.row_key("libra-hybrid-eager", "0.3"): {"step_s": 1.5},
                                                      hl.row_key("libra-hybrid-eager", "0.5"): {"step_s": 1.1}}}}})
    assert store["maxbatch"] == {"eager": {"batch": 4}, "checkpoint": {"batch": 15}}
    assert set(store["common"]["4"]) == {"eager", "checkpoint"} and store["common"]["15"] == {"eager": {"oom": True}}
    rows = store["sweep"]["8"]["rows"]
    assert rows == {"libra-hybrid-eager|0.5": {"step_s": 1.1}, "libra-hybrid-eager|0.3": {"step_s": 1.5}}
    assert store["sweep"]["8"]["eager"] == {"step_s": 1.0, "peak_bytes": 100}   # the reference stays


def test_store_merges_across_calls_and_refuses_another_cap(tmp_path):
    meta = {"model": "m", "cap_bytes": 10, "smoke": True}
    s = hl.Store(tmp_path / "r.json", meta)
    s.add({"maxbatch": {"eager": {"batch": 3}}})
    s2 = hl.Store(tmp_path / "r.json", meta)
    s2.add({"maxbatch": {"checkpoint": {"batch": 6}}})
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data["maxbatch"]) == {"eager", "checkpoint"}
    with pytest.raises(LibraOptError, match="--fresh"):
        hl.Store(tmp_path / "r.json", {**meta, "cap_bytes": 20})
    assert hl.Store(tmp_path / "r.json", {**meta, "cap_bytes": 20}, fresh=True).data.get("maxbatch") is None


def test_render_writes_the_max_batch_table_sweep_and_plot(tmp_path):
    data = {"meta": {"model": "gpt2-medium", "cap_bytes": 16 << 30, "device": "H100"},
            "maxbatch": {"eager": {"batch": 4, "samples_per_s": 50.0},
                         "checkpoint": {"batch": 15, "samples_per_s": 46.0},
                         "libra-hybrid-eager": {"batch": 19, "samples_per_s": 40.0, "planned_peak_bytes": 15 << 30,
                                                "reserved_bytes": 15.5 * 2**30, "limit": "memory floor"}},
            "common": {"4": {"eager": {"samples_per_s": 50.0}, "libra-hybrid-eager": {"samples_per_s": 45.0}}},
            "sweep": {"8": {"eager": {"step_s": 0.1, "peak_bytes": 1000},
                            "rows": {"compile-amb-0.5|amb=0.5": {"family": "compile", "method": "compile-amb-0.5",
                                                                 "setting": "amb=0.5", "step_s": 0.09,
                                                                 "peak_bytes": 600, "budget_fraction": 0.6,
                                                                 "added_pct": -10.0, "amb": 0.5},
                                     "libra-hybrid-eager|0.5": {"family": "libra-hybrid-eager",
                                                                "method": "libra-hybrid-eager", "setting": "0.5",
                                                                "step_s": 0.12, "peak_bytes": 500,
                                                                "budget_fraction": 0.5, "added_pct": 20.0,
                                                                "simulated_step_s": 0.1, "graph_s": 0.105,
                                                                "sim_ratio": 0.952}}}}}
    written = hl.render(data, tmp_path, "h")
    assert [p.name for p in written] == ["h.md", "h.csv", "h_sweep.png"]
    md = (tmp_path / "h.md").read_text()
    # libra: 19 / best PyTorch 15; samples/s at eager's max batch 45 / 50; planned and measured side by side
    assert "| libra-hybrid-eager | eager | 19 | 1.27 | 40.00 | 45.00 | 0.90 | 15.00 GiB | 15.50 GiB |" in md
    assert "memory floor" in md and "| libra-hybrid-eager | 0.5 |" in md and "0.952" in md
    rows = (tmp_path / "h.csv").read_text().splitlines()
    assert rows[0].startswith("part,batch,method,setting") and any(r.startswith("sweep,8,compile-amb-0.5") for r in rows)
    assert (tmp_path / "h_sweep.png").stat().st_size > 0


def test_libra_keywords_pass_what_the_build_takes():
    def new(model, *, executor="inductor", calibrate=False):
        return None

    def old(model):
        return None

    assert hl.libra_keywords(new, executor="eager", calibrate=True) == ({"executor": "eager", "calibrate": True}, [])
    kw, notes = hl.libra_keywords(old, executor="eager", calibrate=True)
    assert kw == {} and "calibrate" in notes[0]          # eager is all an old build runs; the missing loop is noted
    with pytest.raises(LibraOptError, match="inductor executor cannot run"):
        hl.libra_keywords(old, executor="inductor", calibrate=None)
    assert hl.libra_keywords(old, executor=None, calibrate=None) == ({}, [])


def test_headline_cpu_sweep_accumulates_across_calls(tmp_path):
    argv = ["--device", "cpu", "--model", "gpt2-tiny", "--parts", "sweep", "--common-batch", "2", "--repeats", "1",
            "--memory", "8MiB", "--out", str(tmp_path)]
    assert hl.main(argv + ["--methods", "checkpoint"]) == 0
    assert hl.main(argv + ["--methods", "save-on-cpu"]) == 0
    data = json.loads((tmp_path / "headline_gpt2-tiny.json").read_text())
    rows = data["sweep"]["2"]["rows"]
    assert set(rows) == {"checkpoint|-", "save-on-cpu|-"}
    assert all(r["step_s"] > 0 and r["peak_bytes"] > 0 for r in rows.values())
    assert "| save-on-cpu | - |" in (tmp_path / "headline_gpt2-tiny.md").read_text()


def test_gpu_check_help_runs_on_cpu():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--parts" in out.stdout and "--models" in out.stdout
    if not torch.cuda.is_available():
        assert gc_.main([]) == 2          # the GPU targets need a GPU: a message, not a traceback


def test_compile_curve_interpolation_and_oom_probes():
    curve = [(1.0, 0.10), (0.6, 0.12), (0.4, 0.16)]
    assert gc_.interpolate_curve(curve, 0.5) == pytest.approx(0.14)
    assert gc_.interpolate_curve(curve, 1.2) == 0.10          # more memory than any point: the fastest there
    assert gc_.interpolate_curve(curve, 0.3) is None          # compile's curve does not reach this low
    probes = [[4, True, ""], [8, False, "out of memory: CUDA"], [6, False, "no plan: budget"]]
    assert gc_.oom_probes(probes) == [[8, False, "out of memory: CUDA"]]
    a = [torch.tensor([1.0, -2.0]), None]
    assert gc_.max_rel_grad_diff(a, [torch.tensor([1.0, -1.9]), torch.ones(1)]) == pytest.approx(0.05)


def test_gpu_check_cpu_run_records_skips_and_renders(tmp_path):
    out = tmp_path / "gc.json"
    assert gc_.main(["--device", "cpu", "--parts", "maxbatch", "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert {c["status"] for c in checks.values()} == {"SKIP"} and "gpt2-tiny|no-oom" in checks
    assert "| gpt2-tiny | no-oom | SKIP |" in out.with_suffix(".md").read_text()


def test_max_batch_entries_keep_planned_and_measured_peaks(monkeypatch):
    """headline's libra max batch goes through libra_opt.max_batch.max_batch,
    passing executor= / calibrate= where it takes them and keeping whatever
    fields its result has (a fake stands in for the GPU search here)."""
    import dataclasses as dc

    import libra_opt.apps.max_batch as mb
    from libra_opt.apps.batch_search import SearchResult, Trial

    @dc.dataclass
    class Result(mb.MaxBatchResult):
        planned_reserved_bytes: int | None = None
        measured_reserved_bytes: int | None = None
        limit: str = ""

    seen = {}

    def fake(model, memory, method="libra", *, executor=None, calibrate=True, **kw):
        seen.update(model=model, memory=memory, method=method, executor=executor, calibrate=calibrate, **kw)
        search = SearchResult(20, (Trial(16, True), Trial(24, False, "out of memory: x"), Trial(20, True)), False)
        return Result(model, method, memory, 20, 41.0, 20 / 41.0, False, search, ["n"], 15 << 30,
                      planned_reserved_bytes=15 << 30, measured_reserved_bytes=(15 << 30) + 1, limit="time")

    monkeypatch.setattr(mb, "max_batch", fake)
    env = hl.Env(device=torch.device("cuda"), cap=16 << 30, smoke=False, autocast=torch.bfloat16, reserve=0.05)
    entry = hl.maxbatch_via_library(hl.METHODS["libra-recompute-inductor"], "gpt2-medium", 1024, env, 4, None)
    assert seen["executor"] == "inductor" and seen["calibrate"] is True and seen["start"] == 4
    assert seen["solver_options"] == {"policy": "recompute"}
    assert entry["batch"] == 20 and entry["samples_per_s"] == 41.0 and entry["limit"] == "time"
    assert entry["planned_reserved_bytes"] == 15 << 30 and entry["measured_reserved_bytes"] == (15 << 30) + 1
    assert gc_.oom_probes(entry["probes"]) == [[24, False, "out of memory: x"]]
    row = hl.maxbatch_rows({"maxbatch": {"libra-recompute-inductor": entry}})[0]
    assert (row["planned_peak_bytes"], row["reserved_bytes"], row["limit"]) == (15 << 30, (15 << 30) + 1, "time")


def test_optimality_table_marks_hybrid_n_a_without_hybrid_milp_and_gaps_are_valid(tmp_path, capsys):
    from libra_opt.frontend.generators import random_layered_graph_dict

    opt = load_benchmark("optimality")
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "tiny.json").write_text(json.dumps(random_layered_graph_dict(14, seed=0)))
    out = tmp_path / "rows.csv"
    assert opt.main([str(tmp_path / "g"), "--budgets", "0.9,0.2", "--time-limit", "5", "--no-progress",
                     "--out", str(out), "--solvers", "checkmate-milp,no-such-hybrid",
                     "--markdown", str(tmp_path / "t.md")]) == 0
    table = capsys.readouterr().out
    assert "| recompute: libra / checkmate-milp | hybrid: libra / no-such-hybrid |" in table
    lines = [ln for ln in table.splitlines() if ln.startswith("| tiny |")]
    assert len(lines) == 2 and all("/ n/a" in ln for ln in lines)   # the hybrid exact solver is not registered
    assert "infeasible (proven: below the memory floor)" in lines[1]   # 0.2 of the peak
    import csv

    rows = list(csv.DictReader(open(out)))
    assert {r["mode"] for r in rows} == {"recompute", "hybrid"} and len(rows) == 4
    for r in rows:
        if r["greedy_gap"]:
            assert float(r["greedy_gap"]) >= 0 and r["bound_kind"] in ("recompute", "hybrid")
    assert (tmp_path / "t.md").read_text().strip() == "\n".join(table.split("\n\nCells")[0].splitlines()[-4:])
    assert opt.main(["--table-from", str(out)]) == 0                # the CSV re-renders the same table
    assert capsys.readouterr().out.strip() == (tmp_path / "t.md").read_text().strip()


def test_solve_rate_writes_a_row_per_solver_and_budget(tmp_path, capsys):
    """benchmarks/solve_rate.py on one tiny generated instance: every non-exact solver (libra once per
    policy) x budget has a row with positive times in the CSV, and the summary names every solver."""
    import csv

    sr = load_benchmark("solve_rate")
    rows = sr.solver_rows()
    labels = {r.label for r in rows}
    assert {"libra-hybrid", "libra-recompute", "libra-swap", "none", "checkpoint-all", "chen-sqrt", "chen-greedy",
            "swap-all"} <= labels
    assert not labels & set(sr.EXACT_SOLVERS) and "libra" not in labels
    assert sr.main(["--no-problems", "--patterns", "random_layered", "--sizes", "24", "--budgets", "0.9,0.4",
                    "--no-warmup", "--out", str(tmp_path)]) == 0
    recs = list(csv.DictReader(open(tmp_path / "solve_rate.csv")))
    assert sorted((r["solver"], float(r["budget"])) for r in recs) == sorted(
        (lab, b) for lab in labels for b in (0.9, 0.4))
    for r in recs:
        assert r["instance"] == "random_layered_gen_n24" and int(r["nodes"]) == 24
        assert r["outcome"] in ("planned", "infeasible"), r
        assert float(r["cpu_s"]) > 0 and float(r["wall_s"]) > 0 and float(r["s_per_1k_ops"]) > 0
        assert float(r["s_per_1k_ops"]) == pytest.approx(float(r["cpu_s"]) / 24 * 1000, rel=1e-3, abs=1e-3)
    md = (tmp_path / "solve_rate.md").read_text()
    for lab in labels:
        assert f"| {lab} | 2 |" in md   # its summary row: two rows (one per budget)


@pytest.mark.parametrize("given, option", [(dict(exchange_effort="thorough"), dict(exchange_effort="thorough")),
                                           (dict(added_gap_tol=0.0), dict(added_gap_tol=0.0))])
def test_solve_rate_libra_options_go_to_the_libra_rows_only(given, option):
    """``solve_rate.py --exchange-effort thorough`` / ``--added-gap-tol 0``: libra's rows solve with that
    option, the other solvers' rows are as without it."""
    sr = load_benchmark("solve_rate")
    plain = {r.label: r.options for r in sr.solver_rows()}
    rows = {r.label: r.options for r in sr.solver_rows(**given)}
    assert plain.keys() == rows.keys()
    for label, opts in rows.items():
        if label.startswith("libra-"):
            assert opts == {**plain[label], **option}
        else:
            assert opts == plain[label]


def test_solve_rate_breakdown_splits_libra_rows_and_restores_the_solver(tmp_path):
    """``--breakdown``: every libra row's phases (descents, exchange, finish, baselines, other) are
    non-negative and add up to its CPU seconds, descents take some of them, an infeasible budget's
    row counts its tightening (within the row's seconds), other solvers' rows have none; and the
    wrapped entry points are libra's own again after each row."""
    import csv

    from libra_opt.solvers.libra.refine import Refiner
    from libra_opt.solvers.libra.solver import LibraSolver

    sr = load_benchmark("solve_rate")
    descend, tightened = Refiner.__dict__["descend"], LibraSolver.__dict__["_tightened"]
    assert sr.main(["--no-problems", "--patterns", "random_layered", "--sizes", "40", "--budgets", "0.8,0.2",
                    "--solvers", "libra,checkpoint-all", "--no-warmup", "--breakdown", "--out", str(tmp_path)]) == 0
    assert Refiner.__dict__["descend"] is descend and LibraSolver.__dict__["_tightened"] is tightened
    recs = list(csv.DictReader(open(tmp_path / "solve_rate.csv")))
    phases = ("descents_s", "exchange_s", "finish_s", "baselines_s", "other_s")
    libra = [r for r in recs if r["solver"].startswith("libra")]
    assert len(libra) == 6
    for r in libra:
        parts = [float(r[f]) for f in phases]
        assert min(parts) >= 0 and float(r["descents_s"]) > 0
        assert sum(parts) == pytest.approx(float(r["cpu_s"]), rel=1e-6, abs=1e-5)   # (6 decimals each)
        tight = float(r["tightening_s"])
        assert 0 <= tight <= float(r["cpu_s"]) + 1e-9
        if r["outcome"] == "infeasible":
            assert tight > 0
    assert any(r["outcome"] == "infeasible" for r in libra)
    assert all(r["descents_s"] == "" for r in recs if r["solver"] == "checkpoint-all")


def test_cut_bound_gaps_rows_are_valid_gaps_and_the_milp_rows_are_recounted(tmp_path):
    """benchmarks/cut_bound_gaps.py on the U-Net at one budget and copy ratio: a row per libra policy,
    each plan at or above its bound; a hybrid_optimality.py row re-counted with the cut bound keeps a
    gap of at least 0 and at most its recorded one."""
    import csv

    from libra_opt.frontend.generators import large_beside_small_graph
    from libra_opt.passes.simulator import no_remat_peak

    cbg = load_benchmark("cut_bound_gaps")
    out = tmp_path / "rows.csv"
    assert cbg.main(["--max-nodes", "0", "--only", "unet", "--budgets", "0.8", "--ratios", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [(r["instance"], r["policy"]) for r in rows] == [("unet", "hybrid"), ("unet", "recompute")]
    for r in rows:
        assert r["status"] in ("feasible", "optimal") and float(r["time_s"]) >= float(r["bound"]) * (1 - 1e-9)
        assert 0 <= float(r["gap"]) <= float(r["floor_gap"]) + 1e-12
    milp = tmp_path / "milp.csv"
    budget = int(0.6 * no_remat_peak(large_beside_small_graph(24, seed=0)))
    with open(milp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["instance", "bandwidth_x_step", "budget_fraction", "budget_bytes", "status",
                                          "time_s", "lower_bound_s", "gap"])
        w.writeheader()
        w.writerow(dict(instance="large_beside_small_n24", bandwidth_x_step=1, budget_fraction=0.6,
                        budget_bytes=budget, status="feasible", time_s=1e9, lower_bound_s=1.0, gap=1e9 - 1))
    (rec,) = cbg.recount([str(milp)])
    assert rec["cut_bound"] > 1.0 and 0 <= rec["gap"] < rec["recorded_gap"] and not rec["met"]


def test_continued_gain_compares_the_hybrid_with_and_without_the_continued_descent(tmp_path, capsys):
    """benchmarks/continued_gain.py on a random layered graph of 100 nodes with copies 4x slower than
    compute, 0.5% under its recompute-only reach: one row, the plan with the continued descent at most
    the one without (finished apart: never costlier), and the summary counts it."""
    import csv

    cg = load_benchmark("continued_gain")
    out = tmp_path / "rows.csv"
    assert cg.main(["--only", "random_layered_s0", "--ratios", "4", "--fractions", "0.995", "--out", str(out)]) == 0
    (row,) = list(csv.DictReader(open(out)))
    assert row["instance"] == "random_layered_s0" and float(row["budget_fraction"]) < float(row["reach_fraction"])
    assert float(row["time_on"]) <= float(row["time_off"])
    text = capsys.readouterr().out
    cheaper = float(row["time_on"]) < float(row["time_off"])
    assert text.startswith(f"1 cells: {int(cheaper)} cheaper with the continued descent, 0 costlier")
