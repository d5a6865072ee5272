"""The headline benchmark (issues 6.3, 10 and 11): every memory-saving method
side by side on one GPU, under a hard memory cap and along the budget curve.

Models: ResNet-50 (224x224), ViT-B/16 (224x224), GPT-2 medium (sequence
1024); bf16 autocast, fp32 parameters, fused AdamW; cap 16 GiB
(``torch.cuda.set_per_process_memory_fraction``).  Methods:

==========================  =====================================================
eager                       PyTorch, every activation kept
checkpoint                  per-block ``torch.utils.checkpoint`` (use_reentrant=False)
save-on-cpu                 ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
compile-amb-<x>             ``torch.compile`` with
                            ``torch._functorch.config.activation_memory_budget=x``,
                            x in 1.0 (torch.compile's default) / 0.8 / 0.5 / 0.3 / 0.1
libra-<policy>-<executor>   libra-opt, solver ``libra`` with ``policy`` hybrid /
                            recompute / swap, plans run by the ``eager`` or the
                            ``inductor`` executor (``optimize(executor=...)``)
==========================  =====================================================

Parts (``--parts``, default all):

- ``maxbatch``: the largest batch each method trains under the cap and its
  samples/s there (the issue-11 table).  Libra methods on a GPU go through
  :func:`libra_opt.max_batch.max_batch` (with ``calibrate=`` and
  ``executor=`` where this build has them); the others through an OOM-safe
  search here.  Planned and measured reserved peaks side by side.
- ``common``: samples/s of every method at one batch (default: eager's max
  batch, which gives the "samples/s at eager's max batch" column).
- ``sweep``: at the common batch without a cap, budget against step-time
  overhead: the libra methods at several fractions of the no-remat peak (plans
  priced for their executor, :func:`libra_opt.costs.for_executor`),
  torch.compile at every ``activation_memory_budget``, checkpoint and
  save-on-cpu as single points.  x = measured peak / eager's
  (``max_memory_reserved`` on a GPU), y = step time / eager's - 1.  Each libra
  row also holds the simulated step and the measured forward+backward time of
  its plan.

Results ACCUMULATE in ``<out>/headline_<model>.json``, merged per (part,
batch, method, setting): a call measures what ``--methods`` / ``--parts`` /
``--budgets`` / ``--ambs`` select and leaves every other entry as it was, and
the file is written after every measurement, so a call that is stopped keeps
what it measured.  ``--fresh`` starts the file over.  After every call the
script renders ``headline_<model>.md`` (tables), ``.csv`` (one row per entry)
and ``_sweep.png`` (budget vs overhead, one curve per method).

Usage (on a GPU; each call under 10 minutes; see ``benchmarks/README.md``)::

    python benchmarks/headline.py --model gpt2-medium --parts maxbatch --methods eager,checkpoint,save-on-cpu
    python benchmarks/headline.py --model gpt2-medium --parts maxbatch --methods libra-hybrid-inductor
    python benchmarks/headline.py --model gpt2-medium --parts sweep --methods compile-amb-0.5 --ambs 0.5,0.3
    python benchmarks/headline.py --device cpu --model gpt2-tiny   # CPU smoke run (tiny caps, not benchmarks)

On a CPU (``--device cpu``, or ``--smoke`` = ``--device cpu --model
gpt2-tiny``) the whole pipeline runs with "caps" checked against tracked /
simulated memory (the runtime's storage tracker for eager methods and inside
torch.compile's graphs, the plan's simulated peak for libra); its numbers
exercise the code, they are not benchmarks.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import gc
import inspect
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from libra_opt.atomic import atomic_write, write_text
from libra_opt.apps.batch_search import free_device_memory, oom_safe, search_max_batch
from libra_opt.errors import LibraOptError
from libra_opt.apps.max_batch import memory_cap
from libra_opt.apps.train_methods import TrainStep, fixed_memory_bytes, make_train_step, solver_budget, time_steps
from libra_opt.ir.units import format_bytes, parse_bytes
from libra_opt.apps.zoo import build_model

log = logging.getLogger("headline")

RESULTS = Path(__file__).resolve().parent / "results"

#: model -> (sequence length / image side, description) for GPU runs
MODELS = {
    "resnet50": (224, "ResNet-50, 224x224"),
    "vit-base": (224, "ViT-B/16, 224x224"),
    "gpt2-medium": (1024, "GPT-2 medium, sequence 1024"),
}
SMOKE_MODEL = ("gpt2-tiny", 16)
EXECUTORS = ("eager", "inductor")
POLICIES = ("hybrid", "recompute", "swap")
#: torch.compile activation_memory_budget values (1.0 is torch.compile's default)
AMBS = (1.0, 0.8, 0.5, 0.3, 0.1)
#: default libra budgets of the sweep: fractions of the no-remat peak (1.0 = nothing evicted)
BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25)
PARTS = ("maxbatch", "common", "sweep")
SCHEMA = "libra-opt/headline-results/2"


@dataclasses.dataclass(frozen=True)
class Method:
    """One method: ``kind`` is ``"reference"`` (a PyTorch method of
    :func:`libra_opt.train_methods.make_train_step`), ``"compile"``
    (torch.compile with ``activation_memory_budget = amb``) or ``"solver"``
    (libra-opt with ``solver``, ``options`` and ``executor``); ``family``
    names its curve in the budget sweep."""

    name: str
    kind: str
    family: str
    reference: str = ""
    amb: float | None = None
    solver: str = ""
    options: tuple = ()
    executor: str | None = None


def _methods() -> dict[str, Method]:
    ms = [Method("eager", "reference", "eager", reference="none"),
          Method("checkpoint", "reference", "checkpoint", reference="checkpoint"),
          Method("save-on-cpu", "reference", "save-on-cpu", reference="save-on-cpu")]
    ms += [Method(f"compile-amb-{a:g}", "compile", "compile", amb=a) for a in AMBS]
    ms += [Method(f"libra-{pol}-{ex}", "solver", f"libra-{pol}-{ex}", solver="libra", options=(("policy", pol),),
                  executor=ex) for pol in POLICIES for ex in EXECUTORS]
    return {m.name: m for m in ms}


METHODS = _methods()


# ============================================================ keywords
def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return False


def libra_keywords(fn: Callable, *, executor: str | None, calibrate: bool | None) -> tuple[dict, list[str]]:
    """The ``executor=`` / ``calibrate=`` keywords to pass to ``fn``
    (``optimize``, ``OptimizedModule`` or ``max_batch``) and notes on what
    this build could not honour.

    ``executor="eager"`` is passed where ``fn`` takes it (the default may be
    Inductor on CUDA) and left out where it does not (then eager is all there
    is); ``"inductor"`` where ``fn`` lacks the keyword raises
    :class:`LibraOptError`.  ``calibrate`` is passed where accepted, else
    noted.  ``None`` leaves either out."""
    kw, notes = {}, []
    if executor is not None:
        if _accepts(fn, "executor"):
            kw["executor"] = executor
        elif executor != "eager":
            raise LibraOptError(f"this build of libra-opt has no {getattr(fn, '__name__', fn)}(executor=...): "
                                f"the {executor} executor cannot run; measure the eager executor or update libra-opt")
    if calibrate is not None:
        if _accepts(fn, "calibrate"):
            kw["calibrate"] = bool(calibrate)
        elif calibrate:
            notes.append("calibrate=True asked for, but this build has no closed-loop calibration: planned "
                         "without it")
    return kw, notes


# ======================================================= results store
def merge_results(store: dict, new: dict) -> dict:
    """Merge ``new`` measurements into ``store`` (both in the layout of the
    results file) and return ``store``.

    Entries are replaced per key: ``maxbatch[method]``,
    ``common[batch][method]``, ``sweep[batch]["rows"][method|setting]``;
    ``sweep[batch]["eager"]`` (the sweep's reference) is kept once measured
    unless ``new`` brings one; top-level metadata is updated.  Nothing not in
    ``new`` is dropped."""
    for key, val in new.items():
        if key == "maxbatch":
            store.setdefault("maxbatch", {}).update(val)
        elif key == "common":
            for batch, entries in val.items():
                store.setdefault("common", {}).setdefault(str(batch), {}).update(entries)
        elif key == "sweep":
            for batch, sw in val.items():
                dst = store.setdefault("sweep", {}).setdefault(str(batch), {"rows": {}})
                if sw.get("eager") is not None:
                    dst["eager"] = sw["eager"]
                dst.setdefault("rows", {}).update(sw.get("rows", {}))
        else:
            store[key] = val
    return store


def row_key(method: str, setting: str) -> str:
    """Key of a sweep row in the results file."""
    return f"{method}|{setting}"


class Store:
    """The results file of one model: loaded (unless ``fresh``), merged into
    and written after every measurement (atomically: a stopped call keeps
    what it measured).

    Raises
    ------
    LibraOptError
        The file holds results for another cap or device kind: pass
        ``--fresh`` or another ``--out``.
    """

    def __init__(self, path: Path, meta: dict, *, fresh: bool = False):
        self.path = Path(path)
        self.data: dict = {}
        if self.path.exists() and not fresh:
            self.data = json.loads(self.path.read_text())
            old = self.data.get("meta", {})
            for k in ("cap_bytes", "smoke", "model"):
                if k in old and old[k] != meta.get(k):
                    raise LibraOptError(f"{self.path} holds results for {k}={old[k]!r}, not {meta.get(k)!r}: pass "
                                        f"--fresh to start over or --out to write elsewhere")
            if self.data.get("schema") != SCHEMA:
                raise LibraOptError(f"{self.path} is in an older results layout; pass --fresh to start over")
        self.data["schema"] = SCHEMA
        self.data.setdefault("meta", {}).update(meta)

    def add(self, new: dict) -> None:
        """Merge ``new`` (see :func:`merge_results`) and write the file."""
        merge_results(self.data, new)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.path, json.dumps(self.data, indent=1, default=_json_default))


def _json_default(x):
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


# ====================================================================== env
@dataclasses.dataclass
class Env:
    """Where and how a run measures.

    On a GPU the cap is real (``memory_cap``) and peaks are
    ``torch.cuda.max_memory_reserved`` (what the device holds; allocated is
    kept beside it).  In smoke mode (CPU) a step "runs out of memory" when
    its tracked / simulated peak plus its fixed memory exceeds the cap.
    """

    device: torch.device
    cap: int
    smoke: bool
    autocast: torch.dtype | None
    reserve: float
    steps: int = 2
    repeats: int = 3
    limit: int | None = None
    calibrate: bool | None = True


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


def libra_step(method: Method, zm, env: Env, budget: Any) -> tuple[TrainStep, list[str]]:
    """A libra-opt training step (``optimize`` through
    :func:`libra_opt.train_methods.make_train_step`) with the method's
    executor and the run's calibration where this build takes them."""
    from libra_opt.optimize import optimize

    kw, notes = libra_keywords(optimize, executor=method.executor, calibrate=env.calibrate if not env.smoke else None)
    train = make_train_step(method.solver, zm, budget=budget, autocast_dtype=env.autocast,
                            solver_options={**dict(method.options), **kw})
    return train, notes


def make_step(method: Method, zm, env: Env, *, budget: Any = None) -> tuple[TrainStep, Any, list[str]]:
    """``(train step, smoke measurer, notes)`` for ``method`` on ``zm``;
    ``budget`` overrides the solver budget (default cap - fixed - reserve)."""
    if method.kind == "reference":
        return make_train_step(method.reference, zm, autocast_dtype=env.autocast), None, []
    if method.kind == "compile":
        tracked = _Tracked() if env.smoke else None
        return compile_train_step(zm, method.amb, env, tracked), tracked, []
    if budget is None:
        fixed = fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"]
        budget = solver_budget(env.cap, fixed, env.reserve)
    train, notes = libra_step(method, zm, env, budget)
    return train, None, notes


def _reserved_peaks(env: Env) -> dict:
    """Measured peaks of the steps since the last reset (GPU): reserved and allocated, bytes."""
    torch.cuda.synchronize(env.device)
    return {"reserved_bytes": int(torch.cuda.max_memory_reserved(env.device)),
            "allocated_bytes": int(torch.cuda.max_memory_allocated(env.device)),
            "peak_bytes": int(torch.cuda.max_memory_reserved(env.device)), "peak_kind": "max_memory_reserved"}


def _plan_fields(train: TrainStep, fixed: int) -> dict:
    """A libra step's plan: budget, planned peak (graph peak + resident memory) and simulated step."""
    plan = getattr(train.module, "plan", None)
    if plan is None:
        return {}
    return {"budget_bytes": int(plan.budget_bytes), "planned_peak_bytes": int(plan.peak_bytes) + int(fixed),
            "simulated_step_s": float(plan.time_s)}


def run_step_under_cap(method: Method, model: str, seq: int, batch: int, env: Env, *, budget: Any = None,
                       time_it: bool = False) -> dict:
    """Build ``model`` at ``batch``, train ``env.steps`` steps by ``method``
    under the cap; optionally time ``env.repeats`` more.  Raises
    ``torch.OutOfMemoryError`` when it does not fit (real or smoke cap)."""
    torch._dynamo.reset()
    free_device_memory()
    zm = build_model(model, batch, seq, device=env.device)
    fixed = fixed_memory_bytes(zm.model, (zm.args, zm.kwargs))["total"]
    train, tracked, notes = make_step(method, zm, env, budget=budget)
    out: dict = {"batch": batch, "fixed_bytes": fixed, **_plan_fields(train, fixed)}
    if notes:
        out["notes"] = notes
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
        out.update(_reserved_peaks(env))
    if method.kind == "solver":
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
    from libra_opt.apps.max_batch import predict_max_batch

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


def _max_batch_entry(result) -> dict:
    """The JSON entry of a :class:`~libra_opt.max_batch.MaxBatchResult`: every
    field it has (this build's and later ones': planned / measured reserved
    peaks, the limit) except the search, which is summarised as probes."""
    entry = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if f.name == "search":
            entry["probes"] = [[t.batch, t.fits, t.reason[:120]] for t in v.trials]
            entry["limit_reached"] = v.limit_reached
        elif isinstance(v, (int, float, str, bool, list, dict, type(None))):
            entry[f.name] = v
        else:
            entry[f.name] = str(v)
    if entry.get("step_s"):
        entry.setdefault("samples_per_s", entry["batch"] / entry["step_s"])
    return entry


def maxbatch_via_library(m: Method, model: str, seq: int, env: Env, start: int, guess: int | None) -> dict:
    """A libra method's max batch by :func:`libra_opt.max_batch.max_batch`
    (closed-loop calibration and executor where this build has them)."""
    from libra_opt.apps.max_batch import max_batch

    kw, notes = libra_keywords(max_batch, executor=m.executor, calibrate=env.calibrate)
    res = max_batch(model, env.cap, m.solver, seq=seq, device=env.device, autocast_dtype=env.autocast,
                    reserve=env.reserve, start=start, limit=env.limit, steps=env.steps, time_repeats=env.repeats,
                    solver_options=dict(m.options), progress=True, guess=guess, **kw)
    entry = _max_batch_entry(res)
    entry["notes"] = list(entry.get("notes") or []) + notes
    entry["via"] = "libra_opt.max_batch.max_batch"
    return entry


def part_maxbatch(methods, model: str, seq: int, env: Env, store: Store, start: int, guess: bool = False) -> None:
    """Max batch and samples/s at it, per method (OOM-safe search; libra
    methods on a GPU through :func:`maxbatch_via_library`; with ``guess``
    guided by :func:`predicted_max_batch`).  Each method's entry is stored as
    soon as it is measured."""
    for m in methods:
        t0 = time.perf_counter()
        s = start
        eager = store.data.get("maxbatch", {}).get("eager", {}).get("batch")
        if m.name != "eager" and eager:
            s = max(1, int(eager))  # every method saves memory: start where eager stopped
        try:
            predicted, pre = predicted_max_batch(m, model, seq, env, eager) if guess else (None, [])
            if m.kind == "solver" and not env.smoke:
                entry = maxbatch_via_library(m, model, seq, env, s, predicted)
            else:
                entry = _search_here(m, model, seq, env, s, predicted)
            entry.update(predicted=predicted, prediction_probes=pre)
        except LibraOptError as e:
            entry = {"batch": None, "note": str(e)[:300]}
        entry["wall_s"] = time.perf_counter() - t0
        store.add({"maxbatch": {m.name: entry}})
        print(f"  {m.name:26s} max batch {entry.get('batch') or 0:5d}  "
              f"{entry.get('samples_per_s') or float('nan'):9.2f} samples/s  ({entry['wall_s']:.0f} s)"
              + (f"  {entry['note']}" if entry.get("note") else ""), flush=True)


def _search_here(m: Method, model: str, seq: int, env: Env, start: int, predicted: int | None) -> dict:
    fits = oom_safe(lambda b: run_step_under_cap(m, model, seq, b, env))
    search = search_max_batch(fits, start=start, limit=env.limit, guess=predicted, progress=True,
                              desc=f"{model} {m.name}")
    entry = {"batch": search.batch, "limit_reached": search.limit_reached,
             "probes": [[t.batch, t.fits, t.reason[:120]] for t in search.trials]}
    if search.batch > 0:
        r = oom_safe(lambda b: run_step_under_cap(m, model, seq, b, env, time_it=True))(search.batch)
        if r.fits:
            r.info.pop("problem", None)
            entry.update({k: v for k, v in r.info.items() if k != "batch"})
            entry["samples_per_s"] = search.batch / r.info["step_s"]
        else:
            entry["note"] = f"timing run at the max batch failed: {r.reason}"
    return entry


def part_common(methods, model: str, seq: int, env: Env, store: Store, batch: int) -> None:
    """samples/s of each method at one batch (under the cap), stored per (batch, method)."""
    for m in methods:
        try:
            r = oom_safe(lambda b, m=m: run_step_under_cap(m, model, seq, b, env, time_it=True))(batch)
        except LibraOptError as e:
            entry = {"note": str(e)[:300]}
        else:
            if r.fits:
                r.info.pop("problem", None)
                entry = {k: v for k, v in r.info.items() if k != "batch"}
                entry["samples_per_s"] = batch / r.info["step_s"]
            else:
                entry = {"note": r.reason[:200], "oom": True}
        store.add({"common": {str(batch): {m.name: entry}}})
        print(f"  {m.name:26s} batch {batch}: {entry.get('samples_per_s', float('nan')):9.2f} samples/s", flush=True)


def graph_seconds(train: TrainStep, env: Env) -> float:
    """Median seconds of the forward + backward of ``train`` alone (no
    optimizer step): what a plan's simulated step time predicts."""
    def fwd_bwd():
        train.optimizer.zero_grad(set_to_none=True)
        with train.context(), torch.autocast(env.device.type, dtype=train.autocast_dtype or torch.bfloat16,
                                             enabled=train.autocast_dtype is not None):
            loss = train.forward()
        loss.backward()

    fwd_bwd()
    s, _ = time_steps(fwd_bwd, env.device, warmup=0, repeats=env.repeats)
    return s


def _timed_peak(train: TrainStep, env: Env, method: Method, tracked=None, plan=None) -> dict:
    """Median step seconds and peaks of a step, without a cap: ``step_s``,
    ``peak_bytes`` (reserved on a GPU; tracked / simulated in smoke mode) and
    on a GPU ``reserved_bytes`` / ``allocated_bytes``."""
    if env.smoke:
        train()
        peak = _smoke_peak(method, train, tracked, plan)
        step_s, _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
        return {"step_s": step_s, "peak_bytes": peak}
    train()
    free_device_memory()  # the step's own reserved peak, not what earlier steps left cached
    torch.cuda.reset_peak_memory_stats(env.device)
    step_s, _ = time_steps(train, env.device, warmup=0, repeats=env.repeats)
    return {"step_s": step_s, **_reserved_peaks(env)}


def _libra_module(m: Method, zm, problem, plan, step, env: Env):
    """The planned module for a sweep row: :class:`OptimizedModule` on the
    already profiled problem, with ``executor=`` where it takes it; a
    ``LibraOptError`` where this build cannot run ``m.executor``."""
    from libra_opt.runtime.module import OptimizedModule

    kw, _ = libra_keywords(OptimizedModule, executor=m.executor, calibrate=None)
    return OptimizedModule(zm.model, problem, plan, example_shapes=step.example_shapes, autocast_dtype=env.autocast,
                           loss_fn=zm.loss_fn, device=step.device, **kw)


def part_sweep(families, model: str, seq: int, env: Env, store: Store, batch: int, budgets, ambs) -> None:
    """Budget against step-time overhead at ``batch`` (no cap: the budget is
    the constraint); each row stored as soon as it is measured, keyed by
    (batch, method, setting)."""
    from libra_opt.frontend.capture import capture
    from libra_opt.passes.costs import for_executor
    from libra_opt.frontend.profiling import problem_of
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import solve

    def fresh():
        torch._dynamo.reset()
        free_device_memory()
        return build_model(model, batch, seq, device=env.device)

    key = str(batch)
    ref = store.data.get("sweep", {}).get(key, {}).get("eager")
    if ref is None:
        zm = fresh()
        ref = _timed_peak(make_train_step("none", zm, autocast_dtype=env.autocast), env, METHODS["eager"])
        store.add({"sweep": {key: {"eager": ref}}})
        del zm
    eager_s, eager_peak = ref["step_s"], ref["peak_bytes"]

    def add(family, method, setting, measured, **extra):
        row = {"family": family, "method": method, "setting": setting, **measured, **extra}
        if measured.get("step_s") is not None:
            row["budget_fraction"] = measured["peak_bytes"] / eager_peak if eager_peak else None
            row["added_pct"] = 100.0 * (measured["step_s"] / eager_s - 1.0)
        store.add({"sweep": {key: {"rows": {row_key(method, setting): row}}}})
        if "step_s" in row:
            print(f"  {method:26s} {setting:>10}: peak {format_bytes(row['peak_bytes'])} "
                  f"({row['budget_fraction']:.2f} of eager), overhead {row['added_pct']:+.1f}%"
                  + (f", simulated/measured {row['sim_ratio']:.3f}" if row.get("sim_ratio") else ""), flush=True)
        else:
            print(f"  {method:26s} {setting:>10}: {row.get('note', '')[:100]}", flush=True)

    for fam in ("checkpoint", "save-on-cpu"):
        if fam in families:
            zm = fresh()
            add(fam, fam, "-", _timed_peak(make_train_step(fam, zm, autocast_dtype=env.autocast), env, METHODS[fam]))
    if "compile" in families:
        for amb in ambs:
            zm = fresh()
            tracked = _Tracked() if env.smoke else None
            train = compile_train_step(zm, amb, env, tracked)
            add("compile", f"compile-amb-{amb:g}", f"amb={amb:g}", _timed_peak(train, env, METHODS["compile-amb-1"],
                                                                              tracked), amb=amb)
            del train
    libra = [METHODS[f] for f in families if f in METHODS and METHODS[f].kind == "solver"]
    if not libra:
        return
    zm = fresh()
    step = capture(zm.model, zm.args, zm.kwargs, autocast_dtype=env.autocast, loss_fn=zm.loss_fn)
    problem = problem_of(step, optimizer="adam")
    measured = problem.provenance.extra["profile"]
    fixed = problem.fixed.resident_bytes
    peak0 = no_remat_peak(problem)
    for m in libra:
        priced = for_executor(problem, m.executor or "eager")
        for frac in budgets:
            setting = f"{frac:g}"
            extra = {"executor": m.executor, "profile_calibration": measured["calibration"],
                     "profile_spread": measured["spread"]}
            try:
                plan = solve(priced, int(frac * peak0), m.solver, **dict(m.options))
                om = _libra_module(m, zm, priced, plan, step, env)
            except LibraOptError as e:
                add(m.family, m.name, setting, {}, note=str(e)[:300], **extra)
                continue
            torch._dynamo.reset()
            train = TrainStep(lambda om=om: om(*zm.args, **zm.kwargs), zm.model.parameters(), env.device)
            res = _timed_peak(train, env, m, plan=plan)
            graph_s = graph_seconds(train, env)
            add(m.family, m.name, setting, res, planned_peak_bytes=int(plan.peak_bytes) + int(fixed),
                simulated_step_s=float(plan.time_s), graph_s=graph_s, sim_ratio=float(plan.time_s) / graph_s,
                simulated_added_pct=100.0 * plan.added_s / problem.total_compute_s, **extra)
            del om, train
    del step, zm


# ================================================================= output
def ratio(a, b):
    return a / b if a is not None and b else None


def _fmt(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _bytes(x):
    return "-" if x is None else format_bytes(int(x))


def _first(entry: dict, *names):
    """The first of ``names`` that ``entry`` holds (result fields are named by the library that made them)."""
    return next((entry[n] for n in names if entry.get(n) is not None), None)


PYTORCH_FAMILIES = ("checkpoint", "save-on-cpu", "compile")


def maxbatch_rows(data: dict) -> list[dict]:
    """One row per method of the issue-11 table: max batch under the cap,
    ratio to the best PyTorch method, samples/s at it and at eager's max
    batch, planned and measured peaks, what limits it."""
    mb = data.get("maxbatch", {})
    eager_max = (mb.get("eager") or {}).get("batch")
    at_eager = data.get("common", {}).get(str(eager_max), {}) if eager_max else {}
    e_sps = (at_eager.get("eager") or {}).get("samples_per_s")
    best_pt = max([e.get("batch") or 0 for n, e in mb.items() if n in METHODS and METHODS[n].family in
                   PYTORCH_FAMILIES] or [0]) or None
    rows = []
    for name in [n for n in METHODS if n in mb or n in at_eager]:
        a, c = mb.get(name, {}), at_eager.get(name, {})
        notes = list(dict.fromkeys(x for x in ([a.get("note")] + list(a.get("notes") or []) + [c.get("note")]) if x))
        rows.append({
            "method": name, "executor": METHODS[name].executor or "",
            "max_batch": a.get("batch"),
            "x_best_pytorch": ratio(a.get("batch"), best_pt) if METHODS[name].kind == "solver" else None,
            "samples_per_s_at_max": a.get("samples_per_s"),
            "eager_max_batch": eager_max, "samples_per_s_at_eager_max": c.get("samples_per_s"),
            "x_eager_at_eager_max": ratio(c.get("samples_per_s"), e_sps),
            "planned_peak_bytes": _first(a, "planned_reserved_bytes", "planned_peak_bytes"),
            "reserved_bytes": _first(a, "measured_reserved_bytes", "reserved_peak_bytes", "reserved_bytes"),
            "allocated_bytes": _first(a, "allocated_bytes", "peak_bytes") if not a.get("reserved_bytes")
            else a.get("allocated_bytes"),
            "limit": _first(a, "limit", "limited_by") or ("search limit" if a.get("limit_reached") else ""),
            "note": "; ".join(str(n) for n in notes)[:200]})
    return rows


def sweep_rows(data: dict) -> list[tuple[str, dict, list[dict]]]:
    """``(batch, eager reference, rows in method order)`` per swept batch."""
    out = []
    order = {n: k for k, n in enumerate(METHODS)}
    for batch, sw in sorted(data.get("sweep", {}).items(), key=lambda kv: int(kv[0])):
        rows = sorted(sw.get("rows", {}).values(),
                      key=lambda r: (order.get(r["method"], 99), -float(r.get("amb") or 0),
                                     -float(r["setting"]) if r["setting"].replace(".", "", 1).isdigit() else 0))
        out.append((batch, sw.get("eager") or {}, rows))
    return out


def render(data: dict, out: Path, stem: str) -> list[Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>_sweep.png`` (when a
    sweep has rows) from the results ``data``; returns the paths written."""
    meta = data.get("meta", {})
    written = []
    md = [f"# Headline: {meta.get('model', '')} ({meta.get('description', '')})", "",
          f"{meta.get('device', '')}; cap {_bytes(meta.get('cap_bytes'))}; {meta.get('precision', '')}; "
          f"torch {meta.get('torch', '')}; last run {meta.get('date', '')}", ""]
    if meta.get("smoke"):
        md += ["**SMOKE RUN (CPU, tiny model, caps checked against tracked / simulated memory): these numbers "
               "exercise the code; they are not benchmarks.**", ""]
    mrows = maxbatch_rows(data)
    if mrows:
        eb = mrows[0]["eager_max_batch"]
        md += [f"## Max batch under {_bytes(meta.get('cap_bytes'))}", "",
               f"| method | executor | max batch | x best PyTorch | samples/s @ max | samples/s @ eager's max "
               f"({eb}) | x eager | planned peak | measured reserved | measured allocated | limit / note |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in mrows:
            md.append(f"| {r['method']} | {r['executor']} | {_fmt(r['max_batch'], 'd')} | {_fmt(r['x_best_pytorch'])}"
                      f" | {_fmt(r['samples_per_s_at_max'])} | {_fmt(r['samples_per_s_at_eager_max'])} | "
                      f"{_fmt(r['x_eager_at_eager_max'])} | {_bytes(r['planned_peak_bytes'])} | "
                      f"{_bytes(r['reserved_bytes'])} | {_bytes(r['allocated_bytes'])} | "
                      f"{' '.join(x for x in (str(r['limit'] or ''), r['note']) if x)} |")
    curves = []
    for batch, ref, rows in sweep_rows(data):
        md += ["", f"## Budget sweep at batch {batch} (no cap)", "",
               f"eager: step {_fmt(ref.get('step_s', 0) * 1e3, '.1f')} ms, peak {_bytes(ref.get('peak_bytes'))}.",
               "", "| method | setting | peak | peak / eager | step overhead | simulated ms | measured fwd+bwd ms "
               "| simulated / measured | note |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            sim, g = r.get("simulated_step_s"), r.get("graph_s")
            md.append(f"| {r['method']} | {r['setting']} | {_bytes(r.get('peak_bytes'))} | "
                      f"{_fmt(r.get('budget_fraction'))} | "
                      f"{'-' if r.get('added_pct') is None else format(r['added_pct'], '+.1f') + '%'} | "
                      f"{_fmt(sim * 1e3 if sim else None, '.1f')} | {_fmt(g * 1e3 if g else None, '.1f')} | "
                      f"{_fmt(r.get('sim_ratio'), '.3f')} | {r.get('note', '')[:120]} |")
            if r.get("added_pct") is not None and r.get("budget_fraction") is not None:
                curves.append({"method": r["family"] if r["family"] != "compile" else "torch.compile (amb)",
                               "budget_fraction": r["budget_fraction"], "added_pct": r["added_pct"],
                               "batch": batch})
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{stem}.md"
    write_text(p, "\n".join(md) + "\n")
    written.append(p)
    p = out / f"{stem}.csv"
    fields = ["part", "batch", "method", "setting", "value", "unit", "ratio", "peak_bytes", "reserved_bytes",
              "planned_peak_bytes", "simulated_step_s", "graph_s", "note"]
    with atomic_write(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in mrows:
            w.writerow({"part": "maxbatch", "batch": r["max_batch"], "method": r["method"], "setting": "max batch",
                        "value": r["max_batch"], "unit": "samples", "ratio": r["x_best_pytorch"],
                        "reserved_bytes": r["reserved_bytes"], "planned_peak_bytes": r["planned_peak_bytes"],
                        "note": r["note"]})
            w.writerow({"part": "maxbatch", "batch": r["max_batch"], "method": r["method"],
                        "setting": "samples/s at max batch", "value": r["samples_per_s_at_max"], "unit": "samples/s"})
            w.writerow({"part": "common", "batch": r["eager_max_batch"], "method": r["method"],
                        "setting": "samples/s at eager's max batch", "value": r["samples_per_s_at_eager_max"],
                        "unit": "samples/s", "ratio": r["x_eager_at_eager_max"]})
        for batch, _, rows in sweep_rows(data):
            for r in rows:
                w.writerow({**r, "part": "sweep", "batch": batch, "value": r.get("added_pct"), "unit": "% overhead",
                            "ratio": r.get("budget_fraction")})
    written.append(p)
    if curves:
        from libra_opt.apps.plots import plot_budget_curve

        batches = sorted({c["batch"] for c in curves}, key=int)
        p = out / f"{stem}_sweep.png"
        plot_budget_curve([c for c in curves if c["batch"] == batches[-1]], p,
                          title=f"{meta.get('model', '')} batch {batches[-1]}: peak memory (fraction of eager's) "
                                f"vs step-time overhead")
        written.append(p)
    return written


# =================================================================== main
def _floats(text: str, what: str, parser) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{what}: comma-separated numbers, got {text!r}")
    if not vals or any(not 0 < v <= 1 for v in vals):
        parser.error(f"{what}: fractions in (0, 1], got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` lists every option)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="methods: " + ", ".join(METHODS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"one model per call: {', '.join(MODELS)} on a GPU; any zoo name with "
                                        f"--device cpu (default there {SMOKE_MODEL[0]})")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): the benchmark; cpu: a smoke run with tiny caps, not a benchmark")
    parser.add_argument("--seq", type=int, help="sequence length / image side (default: the model's)")
    parser.add_argument("--memory", help="the hard cap (default 16GiB; cpu: fixed memory of batch 4 + 1.5x its "
                                         "graph memory)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset (default all)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {', '.join(PARTS)} (default all)")
    parser.add_argument("--common-batch", type=int, help="batch for 'common' and 'sweep' (default: eager's max)")
    parser.add_argument("--budgets", help="libra sweep: fractions of the no-remat peak (default "
                                          f"{','.join(f'{b:g}' for b in BUDGETS)}; cpu 1,0.8,0.6)")
    parser.add_argument("--ambs", help="torch.compile sweep: activation_memory_budget values (default "
                                       f"{','.join(f'{a:g}' for a in AMBS)}; cpu 1,0.5)")
    parser.add_argument("--reserve", type=float, default=0.05, help="solver budget reserve, fraction of the cap")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="libra: plan without the closed loop (calibration is on by default where this "
                             "build has it)")
    parser.add_argument("--start", type=int, default=1, help="first batch of eager's search (default 1)")
    parser.add_argument("--limit", type=int, help="never probe above this batch")
    parser.add_argument("--guess", action="store_true",
                        help="libra methods: search around the batch the simulator predicts from two probes at "
                             "eager's max batch and half of it, instead of from eager's max batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (median; default 3)")
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results; cpu: .../smoke)")
    parser.add_argument("--fresh", action="store_true", help="start the results file over (default: merge)")
    parser.add_argument("--smoke", action="store_true", help=f"= --device cpu --model {SMOKE_MODEL[0]}")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def _smoke_cap(model: str, seq: int) -> int:
    """CPU smoke mode: fixed memory of batch 4 plus 1.5x its tracked graph memory (eager fits about 6)."""
    from libra_opt.runtime.executor import measure_step_peak

    probe = build_model(model, 4, seq)
    fixed4 = fixed_memory_bytes(probe.model, (probe.args, probe.kwargs))["total"]
    probe.step_loss().backward()  # warm-up: the first step of a process is slow
    graph4 = measure_step_peak(lambda: probe.step_loss().backward()).peak_bytes
    return int(fixed4 + 1.5 * graph4)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.smoke:
        args.device, args.model = "cpu", args.model or SMOKE_MODEL[0]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [m for m in methods if m not in METHODS] + [p for p in parts if p not in PARTS]
    if bad:
        parser.error(f"unknown method or part: {', '.join(bad)} (methods: {', '.join(METHODS)})")
    smoke = args.device == "cpu"
    if not smoke and not torch.cuda.is_available():
        print("headline.py: this benchmark measures under a hard GPU memory cap and needs a CUDA GPU; this machine "
              "has none. Run it on a GPU (see benchmarks/README.md), or pass --device cpu (or --smoke) to exercise "
              "the pipeline on the CPU with a tiny model.", file=sys.stderr)
        return 2
    if smoke:
        model = args.model or SMOKE_MODEL[0]
        seq = args.seq or SMOKE_MODEL[1]
        description = f"{model}, sequence {seq} (CPU smoke run)"
        device, autocast = torch.device("cpu"), None
        out = args.out or RESULTS / "smoke"
        # one intra-op thread: on a busy 2-core machine OpenMP's spinning threads make tiny ops erratic
        torch.set_num_threads(1)
        cap = parse_bytes(args.memory) if args.memory else _smoke_cap(model, seq)
        limit = args.limit or 24
        budgets, ambs = args.budgets or "1,0.8,0.6", args.ambs or "1,0.5"
    else:
        if args.model not in MODELS:
            parser.error(f"--model: one of {', '.join(MODELS)} on a GPU (one model per call)")
        model = args.model
        seq, description = MODELS[model]
        seq = args.seq or seq
        device, autocast = torch.device("cuda"), torch.bfloat16
        out = args.out or RESULTS
        cap = parse_bytes(args.memory or "16GiB")
        limit = args.limit
        budgets = args.budgets or ",".join(f"{b:g}" for b in BUDGETS)
        ambs = args.ambs or ",".join(f"{a:g}" for a in AMBS)
        warm = build_model(model, 1, seq, device=device)  # warm-up: CUDA context, cuBLAS/cuDNN handles
        with torch.autocast("cuda", dtype=autocast):
            warm.step_loss().backward()
        del warm
        free_device_memory()
    budget_list, amb_list = _floats(budgets, "--budgets", parser), _floats(ambs, "--ambs", parser)
    env = Env(device=device, cap=cap, smoke=smoke, autocast=autocast, reserve=args.reserve, repeats=args.repeats,
              limit=limit, calibrate=args.calibrate)
    stem = f"headline_{model}"
    meta = dict(model=model, description=description, cap_bytes=cap, smoke=smoke,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                precision="bf16 autocast, fp32 parameters, fused AdamW" if autocast else "fp32, fused AdamW",
                torch=torch.__version__, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    try:
        store = Store(out / f"{stem}.json", meta, fresh=args.fresh)
    except LibraOptError as e:
        print(f"headline.py: {e}", file=sys.stderr)
        return 2
    print(f"headline: {model} on {meta['device']}, cap {format_bytes(cap)}, methods {', '.join(methods)}, "
          f"parts {', '.join(parts)}", flush=True)
    sel = [METHODS[m] for m in methods]
    t0 = time.perf_counter()
    try:
        if "maxbatch" in parts:
            print("max batch under the cap:", flush=True)
            part_maxbatch(sel, model, seq, env, store, args.start, guess=args.guess)
        common_batch = args.common_batch or store.data.get("maxbatch", {}).get("eager", {}).get("batch")
        if ("common" in parts or "sweep" in parts) and not common_batch:
            print("headline.py: no common batch: run --parts maxbatch with eager first, or pass --common-batch",
                  file=sys.stderr)
            return 2
        if "common" in parts:
            print(f"samples/s at the common batch {common_batch}:", flush=True)
            part_common(sel, model, seq, env, store, int(common_batch))
        if "sweep" in parts:
            print(f"budget sweep at batch {common_batch}:", flush=True)
            families = sorted({m.family for m in sel} - {"eager"})
            part_sweep(families, model, seq, env, store, int(common_batch), budget_list, amb_list)
    finally:
        store.save()
        written = render(store.data, out, stem)
    print(f"done in {time.perf_counter() - t0:.0f} s; wrote " + ", ".join(str(p) for p in [store.path] + written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
