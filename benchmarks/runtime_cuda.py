"""Issue 5 on a GPU: does the runtime do what the simulator predicts?

For GPT-2 small and ResNet-50 (random weights, built from ``transformers``
configs) the script captures and profiles one training step, then measures on
the device, side by side in one run:

- eager PyTorch: step time and peak;
- the no-eviction plan (``none``) through the runtime: its overhead over eager;
- the ``libra`` plan at 70% and 40% of the no-remat peak (calibrated, each
  run under ``torch.cuda.set_per_process_memory_fraction`` set to what is
  reserved before the step plus the budget, so going over is an OOM);
- ``swap-all``: how much of its copy time hides behind compute.

For every plan: measured peak (``torch.cuda.max_memory_allocated`` over what
is resident before the step) against the simulated (planned) peak, the
measured reserved peak (``torch.cuda.max_memory_reserved`` over the same)
against the budget (budget plans are calibrated: ``optimize(calibrate=True)``,
and run under a cap of what is reserved before the step plus the budget), and measured step
time (CUDA events, warm-up, median of repeats) against the simulated step
time.  Prints a table; ``--out`` also writes the rows as JSON.

Usage::

    python benchmarks/runtime_cuda.py
    python benchmarks/runtime_cuda.py --models gpt2 --budgets 0.7 0.4 --repeats 20 --out runtime.json

Without a CUDA GPU it prints a message and exits with status 0.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

#: model -> (zoo name, batch, seq or image side)
MODELS = {"gpt2": ("gpt2", 8, 512), "resnet50": ("resnet50", 64, 224)}


def _zero_grads(model):
    for p in model.parameters():
        p.grad = None


def _step_fn(call, model, zm, stream=None):
    """One training step (forward, loss, backward) with gradients reset first."""

    def step():
        _zero_grads(model)
        out = call(*zm.args, **zm.kwargs)
        loss = out if zm.loss_fn is None or call is not model else zm.loss_fn(out)
        loss.backward()
        if stream is not None:                         # trailing offloads belong to the step
            torch.cuda.current_stream().wait_stream(stream)
        return loss

    return step


def _time(step, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _peak(step) -> tuple[int, int]:
    """(peak allocated, peak reserved) of one step above what is allocated before it, bytes."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    reserved = torch.cuda.max_memory_reserved() - base
    del loss
    return peak, reserved


class _Fraction:
    """``set_per_process_memory_fraction`` for a budget run: what is reserved
    (after ``empty_cache``) plus the budget; restored after."""

    def __init__(self, budget_bytes: int | None):
        self.budget = budget_bytes

    def __enter__(self):
        if self.budget is not None:
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + self.budget) / total))

    def __exit__(self, *exc):
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
        return False


def run_model(key: str, budgets, warmup: int, repeats: int, log) -> list[dict]:
    from libra_opt.frontend.capture import capture
    from libra_opt.errors import InfeasibleBudgetError
    from libra_opt.optimize import optimize, problem_of
    from libra_opt.runtime.module import OptimizedModule
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import solve
    from libra_opt.apps.zoo import build_model

    name, batch, seq = MODELS[key]
    zm = build_model(name, batch, seq, device="cuda", seed=0)
    model = zm.model
    t0 = time.perf_counter()
    step = capture(model, zm.args, zm.kwargs, loss_fn=zm.loss_fn)
    problem = problem_of(step, profile=True)
    log(f"{key}: captured and profiled {len(problem.nodes)} ops in {time.perf_counter() - t0:.0f} s; "
        f"no-remat peak {no_remat_peak(problem) / 2**30:.2f} GiB")
    peak0 = no_remat_peak(problem)
    rows = []

    eager = _step_fn(model, model, zm)
    eager_t = _time(eager, warmup, repeats)
    eager_peak, eager_reserved = _peak(eager)
    rows.append(dict(model=key, plan="eager", budget=None, sim_peak=peak0, peak=eager_peak, reserved=eager_reserved,
                     sim_time=None, time=eager_t, note=""))

    def measure(solver, frac):
        # a budget plan: calibrated by the closed loop (one measured step, re-planned while its reserved peak
        # is over), then run under a hard cap of what is reserved before the step plus the budget
        budget = None if solver == "none" else int(frac * peak0)
        try:
            if budget is None:
                om = OptimizedModule(model, problem, solve(problem, frac, solver), example_shapes=step.example_shapes,
                                     loss_fn=zm.loss_fn, device="cuda")
            else:
                om = optimize(model, zm.args, budget, solver=solver, example_kwargs=zm.kwargs, loss_fn=zm.loss_fn,
                              calibrate=True, problem_builder=lambda s: problem)
        except InfeasibleBudgetError as e:
            rows.append(dict(model=key, plan=solver, budget=frac, sim_peak=None, peak=None, sim_time=None,
                             time=None, note=f"infeasible (min {e.min_feasible_bytes})"))
            return None
        res = om.plan
        fn = _step_fn(om, model, zm, stream=om.swap.stream)
        note = "" if budget is None else f"{len(om.calibration)} plan(s)"
        try:
            with _Fraction(budget):
                t = _time(fn, warmup, repeats)
                pk, rsv = _peak(fn)
        except torch.cuda.OutOfMemoryError:
            t, pk, rsv, note = None, None, None, "OOM under the budget's memory fraction"
        if budget is not None and rsv is not None and rsv > budget:
            note += f"; reserved over the budget {_fmt_bytes(budget)}"
        row = dict(model=key, plan=solver, budget=frac, sim_peak=res.peak_bytes, peak=pk, reserved=rsv,
                   budget_bytes=budget, sim_time=res.time_s,
                   time=t, note=note, recomputed=len(om.lowered.recomputed) if om.lowered else 0,
                   swapped=len(om.lowered.swapped) if om.lowered else 0,
                   d2h_bytes=res.simulation.d2h_bytes if res.simulation else 0,
                   h2d_bytes=res.simulation.h2d_bytes if res.simulation else 0)
        rows.append(row)
        del om, fn
        torch.cuda.empty_cache()
        return row

    none = measure("none", 1.0)
    if none and none["time"]:
        none["note"] = f"overhead vs eager {100 * (none['time'] / eager_t - 1):+.1f}%"
    for frac in budgets:
        measure("libra", frac)
    sw = measure("swap-all", min(budgets))
    if sw and sw["time"] and none and none["time"]:
        dev = problem.device
        copy_s = sw["d2h_bytes"] / dev.d2h_bytes_per_s + sw["h2d_bytes"] / dev.h2d_bytes_per_s
        extra = max(0.0, sw["time"] - none["time"])
        hidden = 1.0 - min(1.0, extra / copy_s) if copy_s > 0 else 1.0
        sw["note"] = f"copies {copy_s * 1e3:.1f} ms, {100 * hidden:.0f}% hidden behind compute"
    return rows


def _fmt_bytes(b):
    return "-" if b is None else f"{b / 2**30:.3f}G"


def _fmt_s(s):
    return "-" if s is None else f"{s * 1e3:.1f}"


def _ratio(a, b):
    return "-" if a is None or b in (None, 0) else f"{a / b:.3f}"


def print_table(rows) -> None:
    head = ("model", "plan", "budget", "sim peak", "peak", "reserved", "peak/sim", "reserved/budget", "sim ms",
            "ms", "ms/sim", "note")
    lines = [head]
    for r in rows:
        lines.append((r["model"], r["plan"], "-" if r["budget"] is None else f"{r['budget']:.0%}",
                      _fmt_bytes(r["sim_peak"]), _fmt_bytes(r["peak"]), _fmt_bytes(r.get("reserved")),
                      _ratio(r["peak"], r["sim_peak"]), _ratio(r.get("reserved"), r.get("budget_bytes")),
                      _fmt_s(r["sim_time"]), _fmt_s(r["time"]), _ratio(r["time"], r["sim_time"]), r["note"]))
    widths = [max(len(str(x[i])) for x in lines) for i in range(len(head))]
    for k, ln in enumerate(lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(ln, widths)))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.7, 0.4],
                    help="budgets as fractions of the no-remat peak (default 0.7 0.4)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/runtime_cuda.py needs a CUDA GPU; none is available here, nothing to measure.")
        return 0
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for key in args.models:
        rows += run_model(key, args.budgets, args.warmup, args.repeats, lambda m: print(m, file=sys.stderr))
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print_table(rows)
    if args.out:
        from libra_opt.atomic import atomic_write

        with atomic_write(args.out) as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
