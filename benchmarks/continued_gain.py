"""What the hybrid descent continued from the recompute-only end buys (issue 16).

Under the least memory recomputation alone reaches, ``libra``'s hybrid
portfolio also runs a hybrid descent that starts where the recompute-only
descents ended (``LibraOptions.continue_recompute``,
``solvers/libra/continued.py``).  For each instance, copy ratio and budget
this script solves the hybrid twice, with ``continue_recompute`` on and
off, and reports both step times (the simulated time, in the instance's
units), the descent the plan came from and the CPU seconds of each solve.

Instances: random layered graphs of 100 nodes (seeds 0-5) and 250 nodes
(seeds 0-1), issue 16's pattern graphs at 100 nodes, the VGG segmentation
CNN and the U-Net (:mod:`libra_opt.generators`), four CPU-profiled
``problems/`` (ResNet-tiny, GPT-2 tiny, BERT-base, GPT-2), and with ``GRAPHS`` the shared Checkmate
graphs ``vgg16_b256_train``, ``mobilenet_b512_train`` and
``random_layered_n250`` (read from their folder, GPL-3.0).  Bandwidths as in
``hybrid_optimality.py``: copying the no-remat peak takes ``f`` no-remat
steps (``--ratios``), copies overlapping compute.  Budgets: fractions
(``--fractions``) of the instance's recompute-only reach, the smallest budget
``policy="recompute"`` plans (its stated minimum), where the continued
descent runs.

Usage::

    python benchmarks/continued_gain.py GRAPHS            # about 4 minutes on 2 cores
    python benchmarks/continued_gain.py --only random_layered_s0 --ratios 4

Writes ``results/continued_gain.csv`` (``--out``) and prints a markdown
summary: cells cheaper / costlier / equal with the continued descent, and
the cheaper ones.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GRAPH_NAMES = ("vgg16_b256_train", "mobilenet_b512_train", "random_layered_n250")
FIELDS = ["instance", "nodes", "copy_ratio", "reach_fraction", "budget_fraction", "budget_bytes",
          "time_off", "time_on", "descent_on", "cpu_off_s", "cpu_on_s"]


def instances(graphs: str | None) -> list[tuple[str, object]]:
    """``(name, thunk)`` per instance (see the module docstring); a thunk builds the problem."""
    from libra_opt import generators as g
    from libra_opt.importers import load_problem_any

    out = [(f"random_layered_s{s}", lambda s=s: g.random_layered_graph(100, seed=s)) for s in range(6)]
    out += [(f"random_layered_n250_s{s}", lambda s=s: g.random_layered_graph(250, seed=s)) for s in range(2)]
    out += [("large_beside_small_n100", lambda: g.large_beside_small_graph(100, seed=0)),
            ("early_regeneration_n100", lambda: g.early_regeneration_graph(100, seed=0)),
            ("vgg_segmentation", g.vgg_segmentation_graph), ("unet", g.unet_graph)]
    for name in ("resnet-tiny-b8-s32-cpu", "gpt2-tiny-b2-s32-cpu", "bert-base-b2-s128-cpu", "gpt2-b2-s128-cpu"):
        out.append((name, lambda name=name: load_problem_any(ROOT / "problems" / f"{name}.json.gz")))
    if graphs:
        d = Path(graphs)
        if not d.is_dir():
            raise SystemExit(f"{graphs}: not a folder; pass the folder of the remat graphs (*.json)")
        out += [(n, lambda n=n: load_problem_any(d / f"{n}.json")) for n in GRAPH_NAMES if (d / f"{n}.json").exists()]
    return out


def _solve(problem, budget: int, on: bool) -> tuple[float | None, str, float]:
    """(step time or None where infeasible, descent, CPU s) of one hybrid ``libra`` solve."""
    from libra_opt.solvers import solve

    t0 = time.process_time()
    r = solve(problem.replace(), budget, "libra", raise_on_infeasible=False, continue_recompute=on)
    cpu = time.process_time() - t0
    return (r.time_s, str(r.extras.get("descent", "")), cpu) if r.success else (None, "", cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="?", help="folder of the shared remat graphs (optional)")
    ap.add_argument("--ratios", default="0.25,1,4", help="copy ratios: no-remat steps to copy the peak once")
    ap.add_argument("--fractions", default="0.995,0.98,0.95,0.9,0.85",
                    help="budgets as fractions of the recompute-only reach")
    ap.add_argument("--only", nargs="*", help="instance names to keep")
    ap.add_argument("--out", default=str(RESULTS / "continued_gain.csv"))
    args = ap.parse_args(argv)
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import solve

    ratios = [float(x) for x in args.ratios.split(",")]
    fractions = [float(x) for x in args.fractions.split(",")]
    insts = [(n, t) for n, t in instances(args.graphs) if not args.only or n in args.only]
    rows = []
    t_start = time.perf_counter()
    for k, (name, thunk) in enumerate(insts, 1):
        base = thunk()
        peak, step = no_remat_peak(base), base.total_compute_s
        stated = solve(base.replace(), 1, "libra", policy="recompute", raise_on_infeasible=False).min_feasible_bytes
        reach = (stated or peak) / peak
        for ratio in ratios:
            rate = peak / (ratio * step)
            p = base.with_device(h2d_bytes_per_s=rate, d2h_bytes_per_s=rate, copies_overlap_compute=True)
            for f in fractions:
                budget = int(f * reach * peak)
                off, _, cpu_off = _solve(p, budget, False)
                on, descent, cpu_on = _solve(p, budget, True)
                rows.append(dict(instance=name, nodes=p.num_nodes, copy_ratio=ratio, reach_fraction=round(reach, 4),
                                 budget_fraction=round(budget / peak, 4), budget_bytes=budget,
                                 time_off="" if off is None else off, time_on="" if on is None else on,
                                 descent_on=descent, cpu_off_s=round(cpu_off, 3), cpu_on_s=round(cpu_on, 3)))
        print(f"[{k}/{len(insts)} {time.perf_counter() - t_start:5.0f}s] {name}: recompute-only reach "
              f"{reach:.4f} of the peak", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(summary(rows))
    return 0


def summary(rows: list[dict]) -> str:
    """The markdown summary of ``rows`` (see the module docstring)."""
    def t(x):
        return None if x in ("", None) else float(x)

    better = [r for r in rows if t(r["time_on"]) is not None
              and (t(r["time_off"]) is None or t(r["time_on"]) < t(r["time_off"]) * (1 - 1e-9))]
    worse = [r for r in rows if t(r["time_off"]) is not None
             and (t(r["time_on"]) is None or t(r["time_on"]) > t(r["time_off"]) * (1 + 1e-9))]
    cpu_off = sum(float(r["cpu_off_s"]) for r in rows)
    cpu_on = sum(float(r["cpu_on_s"]) for r in rows)
    out = [f"{len(rows)} cells: {len(better)} cheaper with the continued descent, {len(worse)} costlier, "
           f"{len(rows) - len(better) - len(worse)} the same; CPU {cpu_off:.1f} s without it, {cpu_on:.1f} s with it.",
           "", "| instance | copy / step | budget (of the peak) | recompute-only reach | without | with | descent |",
           "|---|---|---|---|---|---|---|"]
    for r in better + worse:
        off = "infeasible" if t(r["time_off"]) is None else f"{t(r['time_off']):.6g}"
        on = "infeasible" if t(r["time_on"]) is None else f"{t(r['time_on']):.6g}"
        out.append(f"| {r['instance']} | {r['copy_ratio']} | {r['budget_fraction']} | {r['reach_fraction']} | "
                   f"{off} | {on} | {r['descent_on']} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
