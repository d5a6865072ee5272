"""The headline benchmark (issue 6.3): every memory-saving method side by side
on one GPU under a hard memory cap.

Models: ResNet-50 (224x224), ViT-B/16 (224x224), GPT-2 medium (sequence
1024); bf16 autocast, fp32 parameters, fused AdamW; cap 16 GiB
(``torch.cuda.set_per_process_memory_fraction``).  Methods:

==================  ==========================================================
eager               PyTorch, every activation kept
checkpoint          per-block ``torch.utils.checkpoint`` (use_reentrant=False)
save-on-cpu         ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
compile-amb-0.5     ``torch.compile`` with
                    ``torch._functorch.config.activation_memory_budget=0.5``
compile-amb-0.2     the same at 0.2
libra               libra-opt, solver ``libra`` (hybrid recompute + swap)
libra-recompute     libra-opt, ``libra`` with ``policy="recompute"``
libra-swap          libra-opt, ``libra`` with ``policy="swap"``
==================  ==========================================================

Parts (``--parts``, default all):

- ``maxbatch``: the largest batch each method trains under the cap (OOM-safe
  exponential + binary search, :func:`libra_opt.batch_search.search_max_batch`)
  and its samples/s at that batch;
- ``common``: samples/s of every method at one common batch (default: eager's
  max batch), as ratios to eager;
- ``sweep``: at the common batch, budget against step-time overhead: libra's
  three policies at several fractions of the no-remat peak, torch.compile at
  several ``activation_memory_budget`` values, checkpoint and save-on-cpu as
  single points; x = measured peak memory / eager's, y = step time / eager's
  - 1.

Results accumulate in ``benchmarks/results/headline_<model>.json`` (a run
with ``--methods`` / ``--parts`` updates only those entries) and are rendered
after every run to ``headline_<model>.md`` (tables), ``.csv`` (one row per
method and measurement) and ``_sweep.png`` (the budget sweep).

Usage (on a GPU; one model per call keeps each call under ~10 minutes; split
further with ``--methods`` / ``--parts``; see ``benchmarks/README.md``)::

    python benchmarks/headline.py --model gpt2-medium --parts maxbatch --methods eager,checkpoint,save-on-cpu
    python benchmarks/headline.py --model gpt2-medium --parts maxbatch --methods libra
    python benchmarks/headline.py --model resnet50
    python benchmarks/headline.py --smoke        # CPU, tiny model, tiny caps: exercises every code path

Without CUDA it exits with a message unless ``--smoke``: then it runs the
whole pipeline on a tiny GPT-2 on the CPU, with "caps" checked against
tracked / simulated memory (the runtime's storage tracker for eager methods
and inside torch.compile's graphs, the plan's simulated peak for libra); its
numbers exercise the code, they are not benchmarks.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import gc
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from libra_opt.atomic import atomic_write, write_text
from libra_opt.batch_search import free_device_memory, oom_safe, search_max_batch
from libra_opt.errors import LibraOptError
from libra_opt.max_batch import memory_cap
from libra_opt.train_methods import TrainStep, fixed_memory_bytes, make_train_step, solver_budget, time_steps
from libra_opt.units import format_bytes, parse_bytes
from libra_opt.zoo import build_model

log = logging.getLogger("headline")

RESULTS = Path(__file__).resolve().parent / "results"

#: model -> (sequence length / image side, common description)
MODELS = {
    "resnet50": (224, "ResNet-50, 224x224"),
    "vit-base": (224, "ViT-B/16, 224x224"),
    "gpt2-medium": (1024, "GPT-2 medium, sequence 1024"),
}
SMOKE_MODEL = ("gpt2-tiny", 16)


@dataclasses.dataclass(frozen=True)
class Method:
    """One method: ``kind`` is ``"reference"`` (a PyTorch method of
    :func:`libra_opt.train_methods.make_train_step`), ``"compile"`` (torch.compile
    with ``activation_memory_budget = amb``) or ``"solver"`` (libra-opt with
    ``solver`` and ``options``); ``family`` groups the budget sweep."""

    name: str
    kind: str
    family: str
    reference: str = ""
    amb: float | None = None
    solver: str = ""
    options: tuple = ()


METHODS = {m.name: m for m in [
    Method("eager", "reference", "eager", reference="none"),
    Method("checkpoint", "reference", "checkpoint", reference="checkpoint"),
    Method("save-on-cpu", "reference", "save-on-cpu", reference="save-on-cpu"),
    Method("compile-amb-0.5", "compile", "compile", amb=0.5),
    Method("compile-amb-0.2", "compile", "compile", amb=0.2),
    Method("libra", "solver", "libra", solver="libra", options=(("policy", "hybrid"),)),
    Method("libra-recompute", "solver", "libra-recompute", solver="libra", options=(("policy", "recompute"),)),
    Method("libra-swap", "solver", "libra-swap", solver="libra", options=(("policy", "swap"),)),
]}
PARTS = ("maxbatch", "common", "sweep")


# ====================================================================== env
@dataclasses.dataclass
class Env:
    """Where and how a run measures.

    On a GPU the cap is real (``memory_cap``) and peaks are
    ``torch.cuda.max_memory_allocated`` (bytes, fixed memory included).  In
    smoke mode (CPU) a step "runs out of memory" when its tracked / simulated
    peak plus its fixed memory exceeds the cap.
    """

    device: torch.device
    cap: int
    smoke: bool
    autocast: torch.dtype | None
    reserve: float
    steps: int = 2
    repeats: int = 3
    limit: int | None = None


class _Tracked:
    """Smoke mode only: torch.compile backend = AOTAutograd with the min-cut
    partitioner (which honours ``activation_memory_budget``), forward and
    backward graphs run eagerly under one storage tracker, so the peak of the
    compiled step is measured on the CPU (a ``TorchDispatchMode`` around the
    compiled call would make Dynamo skip the frame)."""

    def __init__(self):
        from libra_opt.runtime.executor import StorageTracker

        self.tracker = StorageTracker()

    def backend(self):
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        def wrap(gm, example_inputs):
            def run(args):
                with self.tracker:  # read at run time: a fresh tracker per measurement
                    return gm(*args)

            run._boxed_call = True
            return run

        return aot_autograd(fw_compiler=wrap, bw_compiler=wrap, partition_fn=min_cut_rematerialization_partition)


def compile_train_step(zm, amb: float, env: Env, tracked: _Tracked | None = None) -> TrainStep:
    """A training step of ``torch.compile(model)`` whose partitioner keeps at
    most ``amb`` of the activation memory
    (``torch._functorch.config.activation_memory_budget``; read when the
    backward graph is partitioned, so it is patched around every call).
    Inductor on a GPU; in smoke mode the tracked eager backend above."""
    import torch._functorch.config as fconfig

    backend = tracked.backend() if tracked is not None else "inductor"
    compiled = torch.compile(zm.model, backend=backend, fullgraph=False, dynamic=False)

    def forward():
        with fconfig.patch(activation_memory_budget=float(amb)):
            out = compiled(*zm.args, **zm.kwargs)
        return zm.loss_fn(out) if zm.loss_fn is not None else out.sum()

    return TrainStep(forward, zm.model.parameters(), env.device, autocast_dtype=env.autocast, module=compiled)


def make_step(method: Method, zm, env: Env, *, budget: Any = None) -> tuple[TrainStep, Any]:
    """``(train step, smoke measurer)`` for ``method`` on ``zm``; ``budget``
    overrides the solver budget (default cap - fixed - reserve)."""
    if method.kind == "reference":
        return make_train_step(method.reference, zm, autocast_dtype=env.autocast), None
    if method.kind == "compile":
        tracked = _Tracked() if env.smoke else None
        return compile_train_step(zm, method.amb, env, tracked), tracked
    if budget is None:
        fixed = fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"]
        budget = solver_budget(env.cap, fixed, env.reserve)
    return make_train_step(method.solver, zm, budget=budget, autocast_dtype=env.autocast,
                           solver_options=dict(method.options)), None


def _smoke_peak(method: Method, train: TrainStep, tracked: _Tracked | None, plan=None) -> int:
    """Smoke mode: graph-memory peak of one step, bytes (tracked or simulated)."""
    if method.kind == "solver":
        plan = plan if plan is not None else train.module.plan
        return int(plan.peak_bytes)  # simulated: the plan's peak
    if tracked is not None:
        from libra_opt.runtime.executor import StorageTracker

        tracked.tracker = StorageTracker()
        train()
        return int(tracked.tracker.peak_bytes)
    from libra_opt.runtime.executor import measure_step_peak

    return int(measure_step_peak(train).peak_bytes)


def run_step_under_cap(method: Method, model: str, seq: int, batch: int, env: Env, *, budget: Any = None,
                       time_it: bool = False) -> dict:
    """Build ``model`` at ``batch``, train ``env.steps`` steps by ``method``
    under the cap; optionally time ``env.repeats`` more.  Raises
    ``torch.OutOfMemoryError`` when it does not fit (real or smoke cap)."""
    torch._dynamo.reset()
    free_device_memory()
    zm = build_model(model, batch, seq, device=env.device)
    fixed = fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"]
    train, tracked = make_step(method, zm, env, budget=budget)
    out: dict = {"batch": batch, "fixed_bytes": fixed}
    if env.smoke:
        train()  # warm-up (compiles)
        peak = _smoke_peak(method, train, tracked) + fixed
        out["peak_bytes"] = peak
        out["peak_kind"] = "simulated" if method.kind == "solver" else "tracked"
        if peak > env.cap:
            raise torch.OutOfMemoryError(f"smoke cap: {format_bytes(peak)} > {format_bytes(env.cap)}")
        if time_it:
            out["step_s"], _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
        if method.kind == "solver":
            out["problem"] = train.module.problem
        return out
    with memory_cap(env.cap, env.device):
        torch.cuda.reset_peak_memory_stats(env.device)
        for _ in range(max(1, env.steps)):
            train()
        if time_it:
            out["step_s"], _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
        torch.cuda.synchronize(env.device)
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated(env.device))
        out["peak_kind"] = "max_memory_allocated"
    if method.kind == "solver":
        out["budget_bytes"] = int(train.module.plan.budget_bytes)
        out["planned_peak_bytes"] = int(train.module.plan.peak_bytes)
        out["problem"] = train.module.problem   # profiled here; for the max-batch prediction (not saved)
    del train, zm
    gc.collect()
    return out


# ================================================================== parts
def predicted_max_batch(m: Method, model: str, seq: int, env: Env, eager: int | None) -> tuple[int | None, list]:
    """A libra method's max batch predicted from two real probes at batches
    that eager PyTorch fits (``eager // 2`` and ``eager``): the problems they
    profiled on this device, extrapolated linearly in the batch
    (:func:`libra_opt.max_batch.predict_max_batch` with ``problems=``),
    planned and checked by the simulator.  ``(guess or None, probes)``."""
    from libra_opt.max_batch import predict_max_batch

    if m.kind != "solver" or not eager or eager < 3:
        return None, []
    b1, b2 = max(2, eager // 2), int(eager)
    probes, problems = [], []
    for b in (b1, b2):
        r = oom_safe(lambda x: run_step_under_cap(m, model, seq, x, env))(b)
        probes.append([b, r.fits, r.reason[:120]])
        if not r.fits:
            return None, probes
        problems.append(r.info.pop("problem"))
    p2 = problems[1]
    try:
        pred = predict_max_batch(model, env.cap, m.solver, problems=tuple(problems), profile_batches=(b1, b2),
                                 reserve=env.reserve, limit=env.limit,
                                 bandwidth_bytes_per_s=float(p2.device.h2d_bytes_per_s),
                                 solver_options=dict(m.options), progress=False)
    except Exception as e:  # noqa: BLE001 - a failed prediction only costs the guided search
        log.warning("%s %s: no prediction (%s: %s); searching from eager's max batch", model, m.name,
                    type(e).__name__, e)
        return None, probes
    return (pred.batch or None), probes


def part_maxbatch(methods, model: str, seq: int, env: Env, results: dict, start: int, guess: bool = False) -> None:
    """Max batch and samples/s at it, per method (OOM-safe search; with
    ``guess``, for libra methods, guided by :func:`predicted_max_batch`)."""
    for m in methods:
        t0 = time.perf_counter()
        s = start
        eager = results.get("maxbatch", {}).get("eager", {}).get("batch")
        if m.name != "eager" and eager:
            s = max(1, int(eager))  # every method saves memory: start where eager stopped
        predicted, pre = predicted_max_batch(m, model, seq, env, eager) if guess else (None, [])
        fits = oom_safe(lambda b, m=m: run_step_under_cap(m, model, seq, b, env))
        search = search_max_batch(fits, start=s, limit=env.limit, guess=predicted, progress=True,
                                  desc=f"{model} {m.name}")
        entry = {"batch": search.batch, "limit_reached": search.limit_reached, "predicted": predicted,
                 "prediction_probes": pre,
                 "probes": [[t.batch, t.fits, t.reason[:120]] for t in search.trials]}
        if search.batch > 0:
            r = oom_safe(lambda b, m=m: run_step_under_cap(m, model, seq, b, env, time_it=True))(search.batch)
            if r.fits:
                entry.update(step_s=r.info["step_s"], samples_per_s=search.batch / r.info["step_s"],
                             peak_bytes=r.info["peak_bytes"], peak_kind=r.info["peak_kind"])
            else:
                entry["note"] = f"timing run at the max batch failed: {r.reason}"
        entry["wall_s"] = time.perf_counter() - t0
        results.setdefault("maxbatch", {})[m.name] = entry
        print(f"  {m.name:16s} max batch {search.batch:5d}  "
              f"{entry.get('samples_per_s', float('nan')):9.2f} samples/s  ({entry['wall_s']:.0f} s)", flush=True)


def part_common(methods, model: str, seq: int, env: Env, results: dict, batch: int) -> None:
    """samples/s of each method at one batch (under the cap)."""
    common = results.setdefault("common", {})
    if common.get("batch") != batch:
        common.clear()
    common["batch"] = batch
    for m in methods:
        r = oom_safe(lambda b, m=m: run_step_under_cap(m, model, seq, b, env, time_it=True))(batch)
        if r.fits:
            common[m.name] = {"step_s": r.info["step_s"], "samples_per_s": batch / r.info["step_s"],
                              "peak_bytes": r.info["peak_bytes"], "peak_kind": r.info["peak_kind"]}
        else:
            common[m.name] = {"note": r.reason[:200]}
        print(f"  {m.name:16s} batch {batch}: {common[m.name].get('samples_per_s', float('nan')):9.2f} samples/s",
              flush=True)


def _timed_peak(train: TrainStep, env: Env, method: Method, tracked=None, plan=None) -> tuple[float, int]:
    """(median step seconds, peak bytes) of a step, without a cap."""
    if env.smoke:
        train()
        peak = _smoke_peak(method, train, tracked, plan)
        step_s, _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
        return step_s, peak
    train()
    torch.cuda.synchronize(env.device)
    torch.cuda.reset_peak_memory_stats(env.device)
    step_s, _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
    return step_s, int(torch.cuda.max_memory_allocated(env.device))


def part_sweep(families, model: str, seq: int, env: Env, results: dict, batch: int, budgets, ambs) -> None:
    """Budget against step-time overhead at ``batch`` (no cap: the budget is the constraint)."""
    from libra_opt.capture import build_problem, capture
    from libra_opt.profiling import device_profile, profile_step
    from libra_opt.runtime.module import OptimizedModule
    from libra_opt.simulator import no_remat_peak
    from libra_opt.solvers import solve

    rows = [r for r in results.get("sweep", {}).get("rows", []) if r["family"] not in families]
    sweep = results.setdefault("sweep", {})
    if sweep.get("batch") != batch:
        rows = []
    sweep["batch"] = batch

    def fresh():
        torch._dynamo.reset()
        free_device_memory()
        return build_model(model, batch, seq, device=env.device)

    zm = fresh()
    eager_s, eager_peak = _timed_peak(make_train_step("none", zm, autocast_dtype=env.autocast), env, METHODS["eager"])
    sweep["eager"] = {"step_s": eager_s, "peak_bytes": eager_peak}
    del zm

    def add(family, setting, step_s, peak, **extra):
        rows.append({"family": family, "method": family, "setting": setting, "step_s": step_s, "peak_bytes": peak,
                     "budget_fraction": peak / eager_peak if eager_peak else None,
                     "added_pct": 100.0 * (step_s / eager_s - 1.0), **extra})
        print(f"  {family:16s} {setting:>10}: peak {format_bytes(peak)} ({peak / eager_peak:.2f} of eager), "
              f"overhead {100.0 * (step_s / eager_s - 1.0):+.1f}%", flush=True)

    for fam in ("checkpoint", "save-on-cpu"):
        if fam in families:
            zm = fresh()
            s, p = _timed_peak(make_train_step(fam, zm, autocast_dtype=env.autocast), env, METHODS[fam])
            add(fam, "-", s, p)
    if "compile" in families:
        for amb in ambs:
            zm = fresh()
            tracked = _Tracked() if env.smoke else None
            train = compile_train_step(zm, amb, env, tracked)
            s, p = _timed_peak(train, env, METHODS["compile-amb-0.5"], tracked)
            add("compile", f"amb={amb:g}", s, p, amb=amb)
    libra_fams = [f for f in ("libra", "libra-recompute", "libra-swap") if f in families]
    if libra_fams:
        zm = fresh()
        step = capture(zm.model, zm.args, zm.kwargs, autocast_dtype=env.autocast, loss_fn=zm.loss_fn)
        measured = profile_step(step, progress=False)
        problem = build_problem(step, times=measured["times"], workspace=measured["workspace"],
                                device=device_profile(step.device), optimizer="adam")
        ref = no_remat_peak(problem)
        for fam in libra_fams:
            method = METHODS[fam]
            for frac in budgets:
                try:
                    plan = solve(problem, int(frac * ref), method.solver, **dict(method.options))
                except LibraOptError as e:
                    rows.append({"family": fam, "method": fam, "setting": f"{frac:g}", "note": str(e)[:200]})
                    print(f"  {fam:16s} {frac:>10g}: no plan ({str(e)[:80]})", flush=True)
                    continue
                torch._dynamo.reset()
                om = OptimizedModule(zm.model, problem, plan, example_shapes=step.example_shapes,
                                     autocast_dtype=env.autocast, loss_fn=zm.loss_fn, device=step.device)
                train = TrainStep(lambda om=om: om(*zm.args, **zm.kwargs), zm.model.parameters(), env.device)
                s, p = _timed_peak(train, env, method, plan=plan)
                add(fam, f"{frac:g}", s, p, planned_peak_bytes=int(plan.peak_bytes),
                    simulated_added_pct=100.0 * plan.added_s / problem.total_compute_s)
                del om, train
        del step, zm
    sweep["rows"] = rows


# ================================================================= output
def ratio(a, b):
    return a / b if a is not None and b else None


def _fmt(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def render(results: dict, out: Path, stem: str) -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>_sweep.png`` from ``results``."""
    written = []
    mb = results.get("maxbatch", {})
    common = results.get("common", {})
    e_mb = mb.get("eager", {})
    e_c = common.get("eager", {})
    names = [n for n in METHODS if n in mb or n in common]
    rows = []
    for n in names:
        a, c = mb.get(n, {}), common.get(n, {})
        rows.append({"method": n, "max_batch": a.get("batch"),
                     "max_batch_x_eager": ratio(a.get("batch"), e_mb.get("batch")),
                     "samples_per_s_at_max": a.get("samples_per_s"),
                     "samples_per_s_at_max_x_eager": ratio(a.get("samples_per_s"), e_mb.get("samples_per_s")),
                     "common_batch": common.get("batch"), "samples_per_s_at_common": c.get("samples_per_s"),
                     "samples_per_s_at_common_x_eager": ratio(c.get("samples_per_s"), e_c.get("samples_per_s")),
                     "peak_bytes_at_max": a.get("peak_bytes"), "peak_kind": a.get("peak_kind") or c.get("peak_kind"),
                     "note": a.get("note") or c.get("note") or ""})
    md = [f"# Headline: {results['model']} ({results.get('description', '')})", "",
          f"{results.get('device', '')}; cap {format_bytes(results['cap_bytes'])}; "
          f"{results.get('precision', '')}; torch {results.get('torch', '')}; {results.get('date', '')}", ""]
    if results.get("smoke"):
        md += ["**SMOKE RUN (CPU, tiny model, caps checked against tracked / simulated memory): these numbers "
               "exercise the code; they are not benchmarks.**", ""]
    md += ["| method | max batch | x eager | samples/s @ max | x eager | samples/s @ common | x eager | note |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r['method']} | {_fmt(r['max_batch'], 'd')} | {_fmt(r['max_batch_x_eager'])} | "
                  f"{_fmt(r['samples_per_s_at_max'])} | {_fmt(r['samples_per_s_at_max_x_eager'])} | "
                  f"{_fmt(r['samples_per_s_at_common'])} | {_fmt(r['samples_per_s_at_common_x_eager'])} | "
                  f"{r['note']} |")
    if common.get("batch"):
        md += ["", f"Common batch: {common['batch']}."]
    sweep = results.get("sweep", {})
    srows = [r for r in sweep.get("rows", []) if r.get("step_s") is not None]
    if srows:
        md += ["", f"## Budget sweep at batch {sweep.get('batch')} (no cap)", "",
               "| method | setting | peak | peak / eager | step-time overhead |", "|---|---|---:|---:|---:|"]
        for r in srows:
            md.append(f"| {r['family']} | {r['setting']} | {format_bytes(r['peak_bytes'])} | "
                      f"{_fmt(r['budget_fraction'])} | {r['added_pct']:+.1f}% |")
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{stem}.md"
    write_text(p, "\n".join(md) + "\n")
    written.append(p)
    p = out / f"{stem}.csv"
    with atomic_write(p, "w", newline="") as f:
        fields = ["part", "method", "setting", "batch", "value", "ratio_to_eager", "peak_bytes", "note"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({"part": "maxbatch", "method": r["method"], "setting": "max batch", "batch": r["max_batch"],
                        "value": r["max_batch"], "ratio_to_eager": r["max_batch_x_eager"],
                        "peak_bytes": r["peak_bytes_at_max"], "note": r["note"]})
            w.writerow({"part": "maxbatch", "method": r["method"], "setting": "samples/s at max batch",
                        "batch": r["max_batch"], "value": r["samples_per_s_at_max"],
                        "ratio_to_eager": r["samples_per_s_at_max_x_eager"], "peak_bytes": "", "note": ""})
            w.writerow({"part": "common", "method": r["method"], "setting": "samples/s at common batch",
                        "batch": r["common_batch"], "value": r["samples_per_s_at_common"],
                        "ratio_to_eager": r["samples_per_s_at_common_x_eager"], "peak_bytes": "", "note": ""})
        for r in sweep.get("rows", []):
            w.writerow({"part": "sweep", "method": r["family"], "setting": r["setting"], "batch": sweep.get("batch"),
                        "value": r.get("added_pct"), "ratio_to_eager": r.get("budget_fraction"),
                        "peak_bytes": r.get("peak_bytes"), "note": r.get("note", "")})
    written.append(p)
    if srows:
        from libra_opt.plots import plot_budget_curve

        p = out / f"{stem}_sweep.png"
        plot_budget_curve([{"method": r["family"], "budget_fraction": r["budget_fraction"],
                            "added_pct": r["added_pct"]} for r in srows], p,
                          title=f"{results['model']} batch {sweep.get('batch')}: peak memory (fraction of eager's) "
                                f"vs step-time overhead")
        written.append(p)
    return written


# =================================================================== main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), help="one model per call (required without --smoke)")
    parser.add_argument("--memory", default="16GiB", help="the hard cap (default 16GiB)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of: {', '.join(METHODS)} (default all)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {', '.join(PARTS)} (default all)")
    parser.add_argument("--common-batch", type=int, help="batch for 'common' and 'sweep' (default: eager's max)")
    parser.add_argument("--budgets", help="libra sweep: fractions of the no-remat peak (default 0.8,0.6,0.4,0.25; "
                                          "smoke 0.8,0.6)")
    parser.add_argument("--ambs", help="torch.compile sweep: activation_memory_budget values (default "
                                       "0.8,0.5,0.3,0.2,0.1; smoke 0.5,0.2)")
    parser.add_argument("--reserve", type=float, default=0.05, help="solver budget reserve, fraction of the cap")
    parser.add_argument("--start", type=int, default=1, help="first batch of eager's search (default 1)")
    parser.add_argument("--limit", type=int, help="never probe above this batch")
    parser.add_argument("--guess", action="store_true",
                        help="libra methods: search around the batch the simulator predicts from two probes at "
                             "eager's max batch and half of it, instead of from eager's max batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (median; default 3)")
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results; smoke: .../smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU: tiny GPT-2, tiny caps on tracked/simulated memory; exercises the pipeline")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [m for m in methods if m not in METHODS] + [p for p in parts if p not in PARTS]
    if bad:
        parser.error(f"unknown method or part: {', '.join(bad)}")
    if not args.smoke and not torch.cuda.is_available():
        print("headline.py: this benchmark measures under a hard GPU memory cap and needs a CUDA GPU; this machine "
              "has none. Run it on a GPU (see benchmarks/README.md), or pass --smoke to exercise the whole "
              "pipeline on the CPU with a tiny model.", file=sys.stderr)
        return 2
    if args.smoke:
        model, seq = SMOKE_MODEL
        description = "tiny GPT-2 (2 layers, 64 hidden), sequence 16"
        device = torch.device("cpu")
        autocast = None
        out = args.out or RESULTS / "smoke"
        # one intra-op thread: on a busy 2-core machine OpenMP's spinning threads make tiny ops erratic
        torch.set_num_threads(1)
        probe = build_model(model, 4, seq)
        from libra_opt.runtime.executor import measure_step_peak

        fixed4 = fixed_memory_bytes(probe.model, (probe.args, probe.kwargs))["total"]
        probe.step_loss().backward()  # warm-up: the first step of a process is slow
        graph4 = measure_step_peak(lambda: probe.step_loss().backward()).peak_bytes
        cap = int(fixed4 + 1.5 * graph4)   # eager fits a batch of about 6
        limit = args.limit or 24
        budgets, ambs = args.budgets or "0.8,0.6", args.ambs or "0.5,0.2"
        del probe
    else:
        if not args.model:
            parser.error("--model is required (one model per call)")
        model = args.model
        seq, description = MODELS[model]
        device = torch.device("cuda")
        autocast = torch.bfloat16
        out = args.out or RESULTS
        cap = parse_bytes(args.memory)
        limit = args.limit
        budgets, ambs = args.budgets or "0.8,0.6,0.4,0.25", args.ambs or "0.8,0.5,0.3,0.2,0.1"
        warm = build_model(model, 1, seq, device=device)  # warm-up: CUDA context, cuBLAS/cuDNN handles
        with torch.autocast("cuda", dtype=autocast):
            warm.step_loss().backward()
        del warm
        free_device_memory()
    env = Env(device=device, cap=cap, smoke=args.smoke, autocast=autocast, reserve=args.reserve,
              repeats=args.repeats, limit=limit)
    stem = f"headline_{model}"
    store = out / f"{stem}.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    if results.get("cap_bytes") not in (None, cap) or bool(results.get("smoke")) != args.smoke:
        results = {}  # another cap or mode: start over
    results.update(model=model, description=description, cap_bytes=cap, smoke=args.smoke,
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   precision="bf16 autocast, fp32 parameters, fused AdamW" if autocast else "fp32, fused AdamW",
                   torch=torch.__version__, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    print(f"headline: {model} on {results['device']}, cap {format_bytes(cap)}, methods {', '.join(methods)}, "
          f"parts {', '.join(parts)}", flush=True)
    sel = [METHODS[m] for m in methods]
    t0 = time.perf_counter()
    try:
        if "maxbatch" in parts:
            print("max batch under the cap:", flush=True)
            part_maxbatch(sel, model, seq, env, results, args.start, guess=args.guess)
            store.parent.mkdir(parents=True, exist_ok=True)
            write_text(store, json.dumps(results, indent=1))
        common_batch = args.common_batch or results.get("maxbatch", {}).get("eager", {}).get("batch")
        if ("common" in parts or "sweep" in parts) and not common_batch:
            print("headline.py: no common batch: run --parts maxbatch with eager first, or pass --common-batch",
                  file=sys.stderr)
            return 2
        if "common" in parts:
            print(f"samples/s at the common batch {common_batch}:", flush=True)
            part_common(sel, model, seq, env, results, int(common_batch))
            write_text(store, json.dumps(results, indent=1))
        if "sweep" in parts:
            print(f"budget sweep at batch {common_batch}:", flush=True)
            families = sorted({m.family for m in sel} - {"eager"})
            part_sweep(families, model, seq, env, results, int(common_batch),
                       [float(x) for x in budgets.split(",")], [float(x) for x in ambs.split(",")])
    finally:
        store.parent.mkdir(parents=True, exist_ok=True)
        write_text(store, json.dumps(results, indent=1))
        written = render(results, out, stem)
    print(f"done in {time.perf_counter() - t0:.0f} s; wrote " + ", ".join(str(p) for p in [store] + written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
