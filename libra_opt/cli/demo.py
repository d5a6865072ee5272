"""``libra-opt demo [--model NAME] [--budget 50%] [--solver libra] [--plot OUT.png]``

The whole pipeline on a real architecture with random weights (no download):
build, profile one training step, plan within the budget, train a few AdamW
steps with the plan and eagerly from the same weights, check that the losses
agree, and print the no-remat peak, budget, planned and measured peak,
step-time overhead, solve time and where the memory went (recomputed /
swapped / kept).

Defaults: on a GPU, GPT-2 small (the zoo's "gpt2": 12 layers, 768 hidden) at
batch 8, sequence 512; on a CPU, "gpt2-cpu": the GPT-2 architecture with 4
layers, 256 hidden, 4 heads, vocabulary 8192, at batch 8, sequence 128 (sized
so the demo finishes in well under two minutes on two cores).  The exit status
is 1 if the planned training diverges from eager PyTorch.
"""
from __future__ import annotations

import argparse
import sys
import time

from .common import (BUDGET_HELP, budget_arg, check_outputs, description, nonnegative_float, positive_float,
                     positive_int, solver_names_help)


#: the one-line help of the command in ``libra-opt --help``
HELP = ("end-to-end demo: GPT-2 (random weights) profiled, planned at 50%% and trained; checked against eager "
        "PyTorch")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``demo`` subcommand; returns its parser."""
    p = subparsers.add_parser(
        "demo", help=HELP,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="NAME",
                   help="zoo name (gpt2, gpt2-medium, bert-base, llama, vit-base, resnet50, *-tiny), 'gpt2-cpu' "
                        "or 'package.module:callable' (default: gpt2 on a GPU, gpt2-cpu on a CPU)")
    p.add_argument("--batch", type=positive_int, metavar="B",
                   help="batch size (default 8; 4 for a --model of your choice)")
    p.add_argument("--seq", type=positive_int, metavar="L",
                   help="sequence length / image side (default 512 on a GPU, 128 on a CPU)")
    p.add_argument("--budget", default="50%", metavar="B", type=budget_arg, help=BUDGET_HELP + " (default 50%%)")
    p.add_argument("--solver", default="libra", metavar="S", help=f"solver (default libra): {solver_names_help()}")
    p.add_argument("--steps", type=_steps, default=4, help="training steps, the first a warm-up (default 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    p.add_argument("--plot", metavar="OUT.png", help="write the memory timeline of the plan vs no-remat")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    p.add_argument("--rtol", type=nonnegative_float, default=1e-3,
                   help="relative tolerance of the loss check per step (default 1e-3)")
    return p


def _steps(text: str) -> int:
    n = positive_int(text)
    if n < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2 (one warm-up step, then timed steps), got {n}")
    return n


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt demo``; returns 0, or 1 if the loss check failed."""
    from libra_opt.apps.demo import DemoConfig, run_demo

    check_outputs(args.plot)
    start = time.perf_counter()
    stages = ["build", "profile", "solve", "train", "plot"]

    def progress(stage: str, message: str) -> None:
        n = stages.index(stage) + 1 if stage in stages else 0
        total = 5 if args.plot else 4
        print(f"[{time.perf_counter() - start:6.1f}s] [{n}/{total}] {stage}: {message}", flush=True)

    cfg = DemoConfig(model=args.model, batch=args.batch, seq=args.seq, budget=args.budget, solver=args.solver,
                     steps=args.steps, device=args.device, plot=args.plot, lr=args.lr, seed=args.seed,
                     rtol=args.rtol)
    report = run_demo(cfg, progress=progress)
    print()
    print(report.text())
    print(f"done in {time.perf_counter() - start:.1f} s")
    if not report.loss_ok:
        print("libra-opt demo: error: the planned training does not match eager PyTorch "
              f"(max relative loss difference {report.loss_max_rel_diff:.2e} > {cfg.rtol:g})", file=sys.stderr)
        return 1
    return 0
