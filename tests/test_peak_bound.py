"""PeakProver: a recompute-only plan's peak proven over a limit from a few of its chains, never
above the simulated peak (libra_opt.passes.peak_bound)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from libra_opt import generators as g
from libra_opt.apps.fuzz import random_problem
from libra_opt.passes.lowering import Policy, all_windows, default_windows
from libra_opt.passes.peak_bound import PeakProver
from libra_opt.solvers import baselines as B
from libra_opt.solvers import solve

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"


def _every_chain(prover: PeakProver) -> int:
    """The most memory the prover can find: every node's own run and every chain it can replay, bytes."""
    prover.over(10 ** 18)   # (proves nothing: builds the bytes before each node, counts each node's own run)
    chains = (prover.chain_bytes(i) for i in range(prover.problem.num_nodes))
    return max([prover.known_bytes, *(c for c in chains if c is not None)])


def _random_plan(p, rng: random.Random) -> tuple[dict, dict]:
    """Recompute decisions over random windows: any gap between two uses, some cut to end at a node that
    does not read the storage (as Chen's segment windows do)."""
    gaps: dict[int, list] = {}
    for s, a, b in all_windows(p):
        gaps.setdefault(s, []).append((a, b))
    dec, win = {}, {}
    for s, ws in gaps.items():
        if rng.random() < 0.6:
            a, b = rng.choice(ws)
            if b - a >= 3 and rng.random() < 0.3:
                b = rng.randint(a + 2, b)
            dec[s], win[s] = Policy.RECOMPUTE, (a, b)
    return dec, win


@pytest.mark.parametrize("seed", range(24))
def test_the_prover_is_never_above_the_simulated_peak(seed):
    """Over random recompute plans on graphs without views, the most memory the prover finds at an
    instant is at most the simulated peak of the lowered plan, and every limit it proves is under it."""
    rng = random.Random(seed)
    make = (lambda: g.random_layered_graph(rng.randint(10, 90), seed=seed),
            lambda: g.large_beside_small_graph(rng.randint(10, 90), seed=seed),
            lambda: g.early_regeneration_graph(rng.randint(10, 50)))[seed % 3]
    p = make()
    for _ in range(4):
        dec, win = _random_plan(p, rng)
        prover = PeakProver(p, dec, win)
        assert prover.applicable
        peak = B._evaluate(p, dec, win)[1].peak_bytes
        assert not PeakProver(p, dec, win).over(peak)
        found = _every_chain(prover)
        assert 0 < found <= peak
        # the bound the chains are ordered by (and skipped under a limit by) holds for each
        assert all(c is None or c <= prover._upper[i] for i, c in
                   ((i, prover.chain_bytes(i)) for i in range(p.num_nodes)))


@pytest.mark.parametrize("n, seed", [(30, 0), (60, 1), (100, 2)])
def test_the_prover_finds_checkpoint_all_s_peak_on_random_layered_graphs(n, seed):
    """Where every window ends at a read of its storage (checkpoint-all's plan), each chain it replays
    is the lowering's: the most it finds is the simulated peak itself, and it proves the plan over any
    limit under it."""
    p = g.random_layered_graph(n, seed=seed)
    w = default_windows(p)
    dec = B.safe_recompute_decisions(p, w, w)
    peak = B._evaluate(p, dec, w)[1].peak_bytes
    assert _every_chain(PeakProver(p, dec, w)) == peak
    assert PeakProver(p, dec, w).over(peak - 1)


@pytest.mark.parametrize("name", ["gpt2-tiny-b2-s32-cpu", "resnet-tiny-b8-s32-cpu"])
def test_the_prover_is_never_above_the_simulated_peak_where_storages_hold_views(name):
    """Profiled models (views of activations, graph inputs viewed, dropout that cannot run again): over
    random recompute plans the lowering accepts, the most the prover finds is at most the simulated peak."""
    from libra_opt.importers import load_problem_any

    p = load_problem_any(PROBLEMS / f"{name}.json.gz")
    assert any(t.storage != t.id for t in p.tensors if t.kind == "activation")
    rng = random.Random(0)
    for _ in range(4):
        _, win = _random_plan(p, rng)
        dec = B.safe_recompute_decisions(p, list(win), win)
        peak = B._evaluate(p, dec, win)[1].peak_bytes
        found = _every_chain(PeakProver(p, dec, win))
        assert 0 < found <= peak


def test_fuzz_problems_with_views():
    """The fuzzer's problems with views, random recompute plans the lowering accepts: never above the
    simulated peak."""
    rng = random.Random(1)
    checked = 0
    for k in range(60):
        p = random_problem(k)
        if not any(t.storage != t.id for t in p.tensors if t.kind == "activation"):
            continue
        _, win = _random_plan(p, rng)
        dec = B.safe_recompute_decisions(p, list(win), win)
        peak = B._evaluate(p, dec, win)[1].peak_bytes
        assert _every_chain(PeakProver(p, dec, win)) <= peak
        checked += 1
    assert checked >= 10


def test_the_prover_says_nothing_about_a_plan_that_swaps():
    """A swap decision: not applicable, nothing proven."""
    p = g.random_layered_graph(30, seed=0)
    w = default_windows(p)
    dec = {s: Policy.SWAP for s in w}
    prover = PeakProver(p, dec, w)
    assert not prover.applicable and not prover.over(0)


def test_a_proven_baseline_plan_is_not_lowered_and_the_stated_minimum_is_unchanged(monkeypatch):
    """libra's recompute-only mode under its reach on a random layered graph compares the recompute
    baselines' peaks with the least it found: the prover shows each over it, so none is lowered, and the
    stated minimum is the one the lowering gives."""
    p = g.random_layered_graph(120, seed=0)
    lowered = []
    real = B._lower_within

    def counting(*a):
        lowered.append(a[-1])
        return real(*a)

    monkeypatch.setattr(B, "_lower_within", counting)
    r = solve(p.replace(), 0.3, "libra", policy="recompute", raise_on_infeasible=False)
    assert not r.success and not lowered
    monkeypatch.setattr(PeakProver, "over", lambda self, limit: False)
    r2 = solve(p.replace(), 0.3, "libra", policy="recompute", raise_on_infeasible=False)
    assert lowered   # without the proofs the plans are lowered ...
    assert r2.min_feasible_bytes == r.min_feasible_bytes   # ... to the same answer


@pytest.mark.parametrize("policy", ["recompute", "hybrid"])
def test_libra_and_the_baselines_answer_the_same_with_the_prover(policy, monkeypatch):
    """Planned and infeasible budgets on random layered graphs (where the checkpointing baselines' plans
    peak over the no-remat peak): libra's plan, status, message and stated minimum, and each recompute
    baseline's answer, are those of lowering the plans, the prover off."""
    from libra_opt.solvers import get_solver

    def answers():
        out = []
        for p in (g.random_layered_graph(60, seed=s) for s in (0, 3)):
            for frac in (0.9, 0.72, 0.695, 0.6, 0.3):
                r = get_solver("libra", policy=policy).solve(p.replace(), frac, raise_on_infeasible=False)
                out.append((r.status, r.message, r.min_feasible_bytes,
                            r.schedule.instructions if r.schedule else None))
                for name in ("checkpoint-all", "chen-sqrt", "chen-greedy"):
                    b = get_solver(name).solve(p.replace(), frac, raise_on_infeasible=False)
                    out.append((name, b.status, b.message, b.min_feasible_bytes))
        return out

    real, proofs = PeakProver.over, []

    def counted(self, limit):
        proofs.append(real(self, limit))
        return proofs[-1]

    monkeypatch.setattr(PeakProver, "over", counted)
    proven = answers()
    assert any(proofs)
    monkeypatch.setattr(PeakProver, "over", lambda self, limit: False)
    assert proven == answers()


def test_evaluate_answers_a_proven_limit_without_lowering_and_the_plan_peaks_over_it(monkeypatch):
    """``baselines._evaluate`` under a limit the prover shows the plan over: ``None`` and no lowering
    (one prover per plan, so a second ask replays nothing); built in whole, the plan peaks over that
    limit; under a limit at or over its peak it is built."""
    p = g.random_layered_graph(80, seed=1)
    w = default_windows(p)
    dec = B.safe_recompute_decisions(p, w, w)
    peak = B._evaluate(p.replace(), dec, w)[1].peak_bytes
    q = p.replace()   # a cold memo
    lowered, replays = [], []
    real_lower, real_chain = B._lower_within, PeakProver.chain_bytes
    monkeypatch.setattr(B, "_lower_within", lambda *a: lowered.append(a[-1]) or real_lower(*a))
    monkeypatch.setattr(PeakProver, "chain_bytes", lambda self, i: replays.append(i) or real_chain(self, i))
    limit = peak // 2
    assert B._evaluate(q, dec, w, limit=limit) is None and not lowered
    n = len(replays)
    assert B._evaluate(q, dec, w, limit=limit - 1) is None and len(replays) == n and not lowered
    built = B._evaluate(q, dec, w, limit=peak)
    assert built is not None and built[1].peak_bytes == peak > limit and lowered == [peak]
