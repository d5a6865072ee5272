"""One budget contract for the API and every CLI command (DESIGN.md, "The budget contract"), and
the command line's usage errors, exit statuses, help texts and reports (issue 13)."""
from __future__ import annotations

import math

import pytest

from libra_opt.cli import main
from libra_opt.errors import BudgetError, LibraOptError
from libra_opt.ir.problem_io import save_problem
from libra_opt.ir.units import budget_from_text, check_budget, parse_budget, parse_bytes
from libra_opt.solvers import solve
from test_cli_compare import layered_chain  # no-remat peak 91 B; checkpoint-all 31 B; swap-all 41 B

GiB = 2**30


# ------------------------------------------------------------------ the contract (API)
@pytest.mark.parametrize("budget, hint", [
    ("80", "did you mean 80% or 80MiB"),          # a bare number string has no unit
    ("1.5", "did you mean 1.5% or 1.5MiB"),
    ("12XB", "unknown unit 'XB'"),
    ("abc", "not a memory budget"),
    ("", "empty"),
    ("0", "must be > 0"), (0, "must be > 0"), (-1, "must be > 0"), ("-5%", "must be > 0"),
    ("nan%", "NaN"), (math.nan, "nan"), ("inf%", "infinite"), ("1e400", "infinite"), (math.inf, "inf"),
    ("1e400GiB", "infinite"),
    (1.5, "fraction of the no-remat peak in \\(0, 1\\]"), (2.0, "fraction"),
    (None, "no memory budget"), (True, "bool"), ([1], "int, a float or a string"),
    ("0.1B", "less than one byte"),
])
def test_rejected_budgets_raise_one_error_type_with_a_hint(budget, hint):
    with pytest.raises(BudgetError, match=hint) as ei:
        parse_budget(budget, 1000)
    assert isinstance(ei.value, LibraOptError) and isinstance(ei.value, ValueError)
    with pytest.raises(BudgetError):
        check_budget(budget)  # the same verdict without a reference peak


@pytest.mark.parametrize("budget, nbytes", [
    (1024, 1024), ("12GiB", 12 * GiB), ("800MB", 800 * 10**6), ("512KiB", 512 * 1024), ("1000000B", 10**6),
    ("16G", 16 * GiB), ("60%", 600), (" 60 % ", 600), (0.6, 600), (1.0, 1000), ("150%", 1500),
])
def test_accepted_budgets(budget, nbytes):
    assert parse_budget(budget, 1000) == nbytes


def test_command_line_numbers_are_fractions_only_up_to_one():
    # "1" and "1.0" both mean the whole no-remat peak; "80" is no longer 80 bytes
    assert parse_budget(budget_from_text("1"), 1000) == parse_budget(budget_from_text("1.0"), 1000) == 1000
    assert parse_budget(budget_from_text("0.25"), 1000) == 250
    with pytest.raises(BudgetError, match="did you mean 80%"):
        parse_budget(budget_from_text("80"), 1000)
    with pytest.raises(BudgetError, match="less than one byte"):  # once 0 bytes
        parse_budget(budget_from_text("1e-300"), 1000)
    with pytest.raises(BudgetError, match="relative"):
        parse_budget(0.5)


def test_byte_sizes_follow_the_same_forms():
    assert parse_bytes("16GiB") == 16 * GiB and parse_bytes(2048) == 2048
    for bad in ("50%", 0, "-1G", "nanG", 0.5):
        with pytest.raises(BudgetError):
            parse_bytes(bad)
    with pytest.raises(BudgetError, match="did you mean 16GiB or 16MiB"):
        parse_bytes("16")


@pytest.mark.parametrize("budget", [0, -1, "abc", None, math.nan, "80"])
def test_optimize_checks_the_budget_before_capturing(monkeypatch, budget):
    import torch

    import libra_opt.optimize as opt

    def no_capture(*a, **k):
        raise AssertionError("captured before the budget was checked")

    monkeypatch.setattr(opt, "capture", no_capture)
    with pytest.raises(BudgetError):
        opt.optimize(torch.nn.Linear(2, 2), torch.randn(3, 2), budget=budget)


# ------------------------------------------------------------------ the CLI
@pytest.fixture
def chain_file(tmp_path):
    return str(save_problem(layered_chain(), tmp_path / "chain.json"))


def usage_error(capsys, argv, *words):
    """Run the CLI; assert exit status 2 and a one-line error containing ``words``."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("bad, word", [("80", "did you mean 80% or 80MiB"), ("12XB", "unknown unit"),
                                       ("abc", "not a memory budget"), ("0", "> 0"), ("-5%", "> 0"),
                                       ("nan%", "NaN"), ("", "empty"), ("inf%", "infinite"),
                                       ("1e400", "infinite"), ("1.5", "did you mean 1.5%")])
def test_every_command_rejects_a_bad_budget_as_a_usage_error(capsys, chain_file, bad, word):
    # --budget=VALUE: argparse reads a separate "-5%" as an option
    for argv in (["solve", chain_file, f"--budget={bad}"], ["sweep", chain_file, f"--budgets=0.9,{bad}"],
                 ["simulate", chain_file, f"--budget={bad}"], ["compare", chain_file, f"--budgets={bad}"],
                 ["demo", f"--budget={bad}"]):
        usage_error(capsys, argv, word)


@pytest.mark.parametrize("limit", ["-5", "nan", "0", "inf", "soon"])
def test_time_limit_must_be_a_positive_number(capsys, chain_file, limit):
    for cmd in (["solve", chain_file, "--budget", "0.9", "--solver", "checkmate-milp"],
                ["sweep", chain_file, "--budgets", "0.9"], ["compare", chain_file]):
        usage_error(capsys, cmd + [f"--time-limit={limit}"], "--time-limit")


@pytest.mark.parametrize("flag, value, shown, bad", [("--exchange-effort", "thorough", "exchange_effort='thorough'",
                                                      "fast"),
                                                     ("--added-gap-tol", "0", "added_gap_tol=0.0", "-1")])
def test_libras_own_flags_reach_libra_and_are_refused_for_other_solvers(capsys, chain_file, flag, value, shown, bad):
    """``--exchange-effort`` and ``--added-gap-tol`` (``solve``, ``sweep``) set ``LibraOptions.exchange_effort`` /
    ``added_gap_tol``; with another solver, or a bad value, each is a usage error that names the flag, as
    ``--policy`` is."""
    assert main(["solve", chain_file, "--budget", "0.5", flag, value]) == 0
    assert shown in capsys.readouterr().out
    assert main(["sweep", chain_file, "--budgets", "0.9,0.5", flag, value]) == 0
    assert shown in capsys.readouterr().out
    usage_error(capsys, ["solve", chain_file, "--budget", "0.9", "--solver", "checkpoint-all", flag, value],
                flag, "libra solver only")
    usage_error(capsys, ["solve", chain_file, "--budget", "0.9", flag, bad], flag)


def test_exit_status_1_for_infeasible_and_over_budget(capsys, chain_file):
    assert main(["solve", chain_file, "--budget", "20B"]) == 1   # below any plan: infeasible
    assert main(["simulate", chain_file, "--budget", "50%"]) == 1  # the no-remat plan is over it
    assert main(["solve", chain_file, "--budget", "60B"]) == 0
    assert main([]) == 2                                           # no command: usage


@pytest.mark.parametrize("args, word", [(["--batch", "0"], "--batch"), (["--batch=-3"], "--batch"),
                                        (["--seq", "0"], "--seq"), (["--steps", "1"], "--steps"),
                                        (["--lr", "nan"], "--lr"), (["--rtol=-1"], "--rtol"),
                                        (["--batch", "four"], "--batch")])
def test_bad_demo_arguments_are_usage_errors(capsys, args, word):
    usage_error(capsys, ["demo", *args], word)


def test_demo_config_rejects_a_zero_batch_before_building():
    from libra_opt.apps.demo import DemoConfig

    for bad in (dict(batch=0), dict(seq=-1), dict(budget="80"), dict(lr=math.nan)):
        with pytest.raises(LibraOptError):
            DemoConfig(**bad).resolved()


def test_csv_is_a_file_path_in_compare_and_sweep(capsys, chain_file, tmp_path):
    for cmd in ("compare", "sweep"):
        out = tmp_path / f"{cmd}.csv"
        assert main([cmd, chain_file, "--budgets", "0.9,60B", "--solvers" if cmd == "compare" else "--solver",
                     "chen-sqrt", "--csv", str(out)] + (["--no-progress"] if cmd == "compare" else [])) == 0
        assert f"csv:  {out}" in capsys.readouterr().out
        lines = out.read_text().splitlines()
        assert lines[0].startswith("budget") or "budget_bytes" in lines[0]
        assert len(lines) == 3
        usage_error(capsys, [cmd, chain_file, "--budgets", "0.9", "--csv"], "--csv")


@pytest.mark.parametrize("cmd", ["demo", "profile", "simulate", "solve", "sweep", "compare", "max-batch"])
def test_help_texts_have_no_restructuredtext_markup(capsys, cmd):
    assert main([cmd, "--help"]) == 0
    out = capsys.readouterr().out
    for markup in ("``", ":func:", ":class:", ":mod:", "**"):
        assert markup not in out


def test_solve_and_compare_list_the_solvers_from_the_registry(capsys, monkeypatch):
    from libra_opt.solvers import Solver, available_solvers, register_solver, registry

    monkeypatch.setattr(registry, "_registered", dict(registry._registered))

    @register_solver("my-usage-test-solver")
    class Mine(Solver):
        def _solve(self, problem, budget_bytes):  # pragma: no cover - never run
            raise NotImplementedError

    names = available_solvers()
    assert "my-usage-test-solver" in names
    for cmd in ("solve", "compare", "sweep", "demo"):
        assert main([cmd, "--help"]) == 0
        out = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # undo argparse's wrapping
        assert ", ".join(names) in out


def test_progress_bars_are_off_when_stderr_is_not_a_terminal(capsys):
    from libra_opt.apps.batch_search import _bar
    from libra_opt.apps.compare import compare

    compare(layered_chain(), [0.9], ["none", "chen-sqrt"], progress=True)
    assert capsys.readouterr().err == ""   # capsys's stderr is not a terminal
    bar = _bar(True, "probing")
    assert bar.disable
    bar.close()


def test_compare_shows_no_negative_gap(capsys):
    """A swap plan faster than the Checkmate LP's bound (a bound on recompute-only plans) gets no
    gap from it: its gap is to a hybrid bound (the cut bounds, which hold for every plan), never
    negative; without the cut bounds the table says "bound unknown" with a footnote instead."""
    from libra_opt.apps.compare import UNBOUNDED_NOTE, compare, format_table

    p = layered_chain()
    for cut in (True, False):
        rows = compare(p, [60], ["swap-all", "checkmate-lp"], progress=False, cut_bounds=cut)
        by = {r.solver: r for r in rows}
        lp_rec = [b for b in solve(p, 60, "checkmate-lp").bounds if b.kind == "recompute" and "LP" in b.source]
        assert lp_rec and by["swap-all"].time_s < lp_rec[0].value_s  # it does beat the recompute bound
        assert by["checkmate-lp"].gap is not None and by["checkmate-lp"].gap >= 0
        assert all(r.gap is None or r.gap >= 0 for r in rows)
        swap = by["swap-all"]
        # checkmate-lp reports the cut bounds too: a hybrid bound on the swap plan either way
        assert swap.bound_kind == "hybrid" and swap.best_lower_bound_s <= swap.time_s
        assert "-%" not in format_table(rows)
    rows = compare(p, [60], ["swap-all"], progress=False, cut_bounds=False)
    table = format_table(rows)
    assert rows[0].gap is None and "bound unknown *" in table and UNBOUNDED_NOTE in table


def _no_rounding(monkeypatch):
    """Make every LP rounding miss the budget, so checkmate-lp falls back to a heuristic plan."""
    from libra_opt.solvers.checkmate import lp as checkmate_lp

    real = checkmate_lp.round_lp

    def round_lp(*a, **k):
        rr = real(*a, **k)
        rr.best = None
        return rr

    monkeypatch.setattr(checkmate_lp, "round_lp", round_lp)


def test_checkmate_lp_fallback_reports_itself_and_the_bound(capsys, chain_file, monkeypatch):
    _no_rounding(monkeypatch)
    assert main(["solve", chain_file, "--budget", "60B", "--solver", "checkmate-lp"]) == 0
    out = capsys.readouterr().out
    assert "fell back to the" in out and "plan, which the simulator accepts" in out  # libra's or a heuristic's
    assert "fallback: the plan is the" in out
    assert "bound:    step time >=" in out and "LP lower bound" in out


def test_checkmate_lp_fallback_on_a_coarsened_graph_says_the_bound_is_for_the_coarse_graph(monkeypatch):
    from libra_opt.cli.solve import bound_text
    from libra_opt.solvers import solve

    _no_rounding(monkeypatch)
    p = layered_chain(n=30)
    r = solve(p, 0.7, solver="checkmate-lp", max_nodes=12)
    assert r.extras["coarsened"] and r.extras["heuristic"]
    assert r.bound_source.startswith(("cut bound", "compute floor"))   # not the coarse LP's value
    assert "coarsened graph only" in r.message and r.extras["coarse_bounds_s"]["LP value"] > 0
    assert "bounds the coarsened graph only" in bound_text(r)


@pytest.mark.parametrize("reserve, word", [("nan%", "percentage"), ("inf%", "percentage"), ("-5%", "percentage"),
                                           ("100%", "percentage"), ("12XB", "unknown unit"), ("abc", "")])
def test_max_batch_reserve_is_checked_as_a_usage_error(capsys, reserve, word):
    usage_error(capsys, ["max-batch", "--model", "gpt2-tiny", "--memory", "16GiB", f"--reserve={reserve}"],
                "--reserve", word)


def test_ctrl_c_in_a_command_is_one_line_and_status_130(capsys, chain_file, monkeypatch):
    import libra_opt.cli.solve as solve_cmd

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(solve_cmd, "run", interrupted)
    assert main(["solve", chain_file, "--budget", "50%"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "KeyboardInterrupt" in err[0]
