"""One GPU check of every target of issues 10 and 11: PASS / FAIL per target.

Targets (H100, bf16 autocast, fp32 parameters, fused AdamW; issue 10 at
GPT-2 medium b8 s1024, ViT-B/16 b128, ResNet-50 b128; issue 11 under a 16 GiB
cap).  "Peak" is ``torch.cuda.max_memory_reserved`` (the budget contract of
``DESIGN.md``); a method's graph memory is its reserved peak minus what is
allocated before its step (parameters, buffers, AdamW state, the batch).

=====================  ==========================================================  =========
target                 check                                                       part
=====================  ==========================================================  =========
eager-no-evict         libra, eager executor, nothing evicted (budget 1.0 of the   step
                       no-remat peak): step <= 1.03x eager PyTorch's
inductor-at-compile    libra, Inductor executor, budget = the graph memory of      step
                       ``torch.compile`` (default): step <= 1.03x compile's
vs-checkpoint          libra (each executor) at the graph memory of per-block      step
                       checkpointing: samples/s >= 1.15x checkpoint's
curve-0.5 / curve-0.3  libra (each executor) at 0.5 / 0.3 of eager's measured      curve
                       graph memory: faster than torch.compile's curve (amb 1.0
                       / 0.8 / 0.5 / 0.3 / 0.1) interpolated at libra's measured
                       graph memory (PASS also where compile's curve does not
                       reach that low; SKIP where neither does)
sim-vs-measured        every libra plan measured above: simulated step within      step, curve
                       10 % of its measured forward+backward
two-profiles           two profiles of one graph: calibrated step within 5 %       profiles
grads-eager            eager executor at 0.5 of the no-remat peak vs eager         grads
                       PyTorch, same weights and seed: max over parameters of
                       max|diff| / max|eager| <= 1e-2 (CUDA), == 0 (CPU)
grads-inductor         Inductor executor vs eager PyTorch <= max(1e-2, 1.25x       grads
                       torch.compile's own difference)
no-oom                 libra max batch under the cap (each executor, closed-loop   maxbatch
                       calibration on): zero out-of-memory probes among the
                       batches it planned as fitting
max-batch              libra's max batch >= 1.5x the best PyTorch method:          maxbatch
                       ViT-B/16 >= 1416, ResNet-50 >= 1224, GPT-2 medium >= 19
max-batch-time         one model's max batch in under 10 minutes                   maxbatch
max-batch-speed        stretch (reported, not failed): samples/s at libra's max    maxbatch
                       batch >= 0.8x eager's (H100 reference of
                       ``gpu-measurements/README.md``)
=====================  ==========================================================  =========

Each call stays under 10 minutes: checks are run model by model and part by
part, and once ``--deadline`` seconds (default 570) have passed the rest are
recorded as SKIP (not run).  Results accumulate in
``benchmarks/results/gpu_check.json`` (merged per model and target; ``--fresh``
starts over) and are rendered to ``gpu_check.md``; a later call with
``--models`` / ``--parts`` fills in what is missing.  One model's ``maxbatch``
part is a call of its own::

    python benchmarks/gpu_check.py --models gpt2-medium --parts step,profiles,grads
    python benchmarks/gpu_check.py --models gpt2-medium --parts curve
    python benchmarks/gpu_check.py --models gpt2-medium --parts maxbatch
    (the same for vit-base and resnet50)

Exit status: 0 when no target FAILs, 1 otherwise, 2 on bad arguments.  On a
CPU (``--device cpu``) the same logic runs on a tiny GPT-2 (thresholds
evaluated, but they are GPU targets: the figures are not benchmarks; the
``maxbatch`` part needs a GPU and is skipped).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline as hl  # noqa: E402  (the benchmark's steps, measurements and keyword handling)

from libra_opt.atomic import write_text  # noqa: E402
from libra_opt.errors import LibraOptError  # noqa: E402
from libra_opt.apps.train_methods import make_train_step  # noqa: E402
from libra_opt.ir.units import format_bytes  # noqa: E402
from libra_opt.apps.zoo import build_model  # noqa: E402

log = logging.getLogger("gpu_check")

#: issue 10's models: name -> (sequence length / image side, batch)
GPU_MODELS = {"gpt2-medium": (1024, 8), "vit-base": (224, 128), "resnet50": (224, 128)}
CPU_MODELS = {"gpt2-tiny": (16, 2)}
#: issue 11: 1.5x per-block checkpoint's max batch under 16 GiB (944, 816) and GPT-2 medium's floor (19)
MAX_BATCH_TARGET = {"vit-base": 1416, "resnet50": 1224, "gpt2-medium": 19}
#: eager's max batch under 16 GiB on the H100 (gpu-measurements/README.md): where libra's search starts
EAGER_MAX_BATCH = {"resnet50": 368, "vit-base": 224, "gpt2-medium": 4}
#: eager's samples/s at its max batch under 16 GiB, H100 (gpu-measurements/README.md), for the stretch target
EAGER_SAMPLES_PER_S = {"resnet50": 2213.0, "vit-base": 2054.0, "gpt2-medium": 50.1}
PARTS = ("step", "curve", "profiles", "grads", "maxbatch")
TIME_SLACK = 1.03
CHECKPOINT_SPEEDUP = 1.15
SIM_TOLERANCE = 0.10
PROFILE_TOLERANCE = 0.05
GRAD_TOLERANCE = 1e-2
CURVE_POINTS = (0.5, 0.3)


@dataclasses.dataclass
class Check:
    """One target on one model: ``passed`` True / False, or None (SKIP: not
    run, with the reason in ``detail``; or a stretch target, reported only)."""

    model: str
    target: str
    passed: bool | None
    value: float | None = None
    threshold: str = ""
    detail: str = ""

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]


class Report:
    """The checks of this call, merged into the results file per (model, target)."""

    def __init__(self, path: Path, meta: dict, fresh: bool):
        self.path = path
        self.data = {} if fresh or not path.exists() else json.loads(path.read_text())
        self.data.setdefault("checks", {})
        self.data["meta"] = meta
        self.new: list[Check] = []

    def add(self, check: Check) -> Check:
        self.new.append(check)
        self.data["checks"][f"{check.model}|{check.target}"] = dataclasses.asdict(check) | {"status": check.status}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.path, json.dumps(self.data, indent=1))
        print(f"  {check.status:4s} {check.model:12s} {check.target:22s} "
              f"{'' if check.value is None else format(check.value, '.4g'):>10s} {check.threshold:14s} "
              f"{check.detail[:110]}", flush=True)
        return check

    def render(self) -> Path:
        meta = self.data.get("meta", {})
        lines = [f"# GPU check (issues 10 and 11)", "", f"{meta.get('device', '')}; torch {meta.get('torch', '')}; "
                 f"last run {meta.get('date', '')}", "", "| model | target | status | value | threshold | detail |",
                 "|---|---|---|---:|---|---|"]
        for c in sorted(self.data["checks"].values(), key=lambda c: (c["model"], c["target"])):
            v = "" if c["value"] is None else format(c["value"], ".4g")
            lines.append(f"| {c['model']} | {c['target']} | {c['status']} | {v} | {c['threshold']} | "
                         f"{c['detail'][:200]} |")
        p = self.path.with_suffix(".md")
        write_text(p, "\n".join(lines) + "\n")
        return p


# ===================================================== pure evaluations
def interpolate_curve(points: list[tuple[float, float]], x: float) -> float | None:
    """Step time of a measured (peak fraction, step seconds) curve at peak
    fraction ``x``: linear between the two nearest measured peaks around
    ``x``; the nearest point's time where ``x`` is above every peak (more
    memory never costs more); ``None`` where ``x`` is below every peak (the
    curve does not reach that memory)."""
    pts = sorted(points)
    if not pts or x < pts[0][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def oom_probes(probes: list) -> list:
    """The probes (``[batch, fits, reason]``) that ran out of memory (a
    probe whose solver found no plan is "does not fit", not an OOM)."""
    return [p for p in probes if not p[1] and str(p[2]).startswith("out of memory")]


def max_rel_grad_diff(ref: list, other: list) -> float:
    """Max over parameters of ``max|ref - other| / max|ref|`` (gradients as tensors; ``None`` skipped)."""
    worst = 0.0
    for a, b in zip(ref, other):
        if a is None or b is None:
            continue
        worst = max(worst, float((a - b).abs().max() / (a.abs().max() + 1e-12)))
    return worst


# =================================================================== runner
class Runner:
    """Runs the parts for one model and adds their checks to the report."""

    def __init__(self, model: str, seq: int, batch: int, env: hl.Env, report: Report, deadline: float):
        self.model, self.seq, self.batch, self.env, self.report = model, seq, batch, env, report
        self.deadline = deadline
        self.cuda = env.device.type == "cuda"
        self.ref: dict[str, dict] = {}
        self._problem = None

    # ------------------------------------------------------------ helpers
    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def skip(self, target: str, why: str) -> None:
        self.report.add(Check(self.model, target, None, detail=why))

    def fresh(self):
        torch._dynamo.reset()
        hl.free_device_memory()
        return build_model(self.model, self.batch, self.seq, device=self.env.device)

    def resident(self, train) -> int:
        """Bytes allocated before a step (gradients freed as the step's zero_grad frees them)."""
        if not self.cuda:
            return 0
        train.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(self.env.device)
        return int(torch.cuda.memory_allocated(self.env.device))

    def measure(self, name: str, train, method: hl.Method, tracked=None) -> dict:
        """Step time, peak and graph memory (peak - resident) of a step; kept as a reference by name."""
        r = hl._timed_peak(train, self.env, method, tracked)
        r["resident_bytes"] = self.resident(train)
        r["graph_bytes"] = max(0, r["peak_bytes"] - r["resident_bytes"]) if self.cuda else r["peak_bytes"]
        self.ref[name] = r
        return r

    def reference(self, name: str) -> dict:
        if name in self.ref:
            return self.ref[name]
        zm = self.fresh()
        if name == "eager":
            return self.measure(name, make_train_step("none", zm, autocast_dtype=self.env.autocast), hl.METHODS["eager"])
        if name == "checkpoint":
            return self.measure(name, make_train_step("checkpoint", zm, autocast_dtype=self.env.autocast),
                                hl.METHODS["checkpoint"])
        amb = float(name.split("=")[1])
        tracked = hl._Tracked() if self.env.smoke else None
        return self.measure(name, hl.compile_train_step(zm, amb, self.env, tracked), hl.METHODS["compile-amb-1"],
                            tracked)

    def problem(self):
        """The model's problem, captured and profiled once per call."""
        if self._problem is None:
            from libra_opt.frontend.capture import build_problem, capture
            from libra_opt.frontend.profiling import device_profile, profile_step

            zm = self.fresh()
            step = capture(zm.model, zm.args, zm.kwargs, autocast_dtype=self.env.autocast, loss_fn=zm.loss_fn)
            measured = profile_step(step, progress=False)
            problem = build_problem(step, times=measured["times"], workspace=measured["workspace"],
                                    device=device_profile(step.device), optimizer="adam")
            self._problem = (zm, step, problem, measured)
        return self._problem

    def libra(self, executor: str, label: str, budget_bytes: int | None = None, fraction: float | None = None,
              policy: str = "hybrid") -> dict:
        """Plan on the profiled problem priced for ``executor`` (bytes, or a
        fraction of the no-remat peak), run it, measure it; checks
        ``sim-vs-measured``.  Raises ``LibraOptError`` (no plan, or no such
        executor in this build)."""
        from libra_opt.passes.costs import for_executor
        from libra_opt.passes.simulator import no_remat_peak
        from libra_opt.solvers import solve

        zm, step, problem, _ = self.problem()
        priced = for_executor(problem, executor)
        budget = int(budget_bytes if budget_bytes is not None else fraction * no_remat_peak(problem))
        plan = solve(priced, budget, "libra", policy=policy)
        m = hl.METHODS[f"libra-{policy}-{executor}"]
        om = hl._libra_module(m, zm, priced, plan, step, self.env)
        torch._dynamo.reset()
        train = hl.TrainStep(lambda: om(*zm.args, **zm.kwargs), zm.model.parameters(), self.env.device)
        r = hl._timed_peak(train, self.env, m, plan=plan)
        r["resident_bytes"] = self.resident(train)
        r["graph_bytes"] = max(0, r["peak_bytes"] - r["resident_bytes"]) if self.cuda else r["peak_bytes"]
        r["graph_s"] = hl.graph_seconds(train, self.env)
        r["simulated_s"] = float(plan.time_s)
        r["budget_bytes"] = budget
        err = r["simulated_s"] / r["graph_s"] - 1.0
        self.report.add(Check(self.model, f"sim-vs-measured[{label}]",
                              abs(err) <= SIM_TOLERANCE, err, f"|err| <= {SIM_TOLERANCE:.0%}",
                              f"simulated {r['simulated_s'] * 1e3:.1f} ms, measured fwd+bwd "
                              f"{r['graph_s'] * 1e3:.1f} ms"))
        del om, train
        return r

    def executors(self) -> list[str]:
        return list(hl.EXECUTORS)

    # -------------------------------------------------------------- parts
    def part_step(self) -> None:
        eager = self.reference("eager")
        try:
            r = self.libra("eager", "eager-no-evict", fraction=1.0)
            ratio = r["step_s"] / eager["step_s"]
            self.report.add(Check(self.model, "eager-no-evict", ratio <= TIME_SLACK, ratio, f"<= {TIME_SLACK}x eager",
                                  f"{r['step_s'] * 1e3:.1f} vs {eager['step_s'] * 1e3:.1f} ms"))
        except LibraOptError as e:
            self.report.add(Check(self.model, "eager-no-evict", False, detail=str(e)[:200]))
        if self.out_of_time():
            return self.skip("inductor-at-compile", "out of time")
        comp = self.reference("amb=1")
        try:
            r = self.libra("inductor", "inductor-at-compile", budget_bytes=comp["graph_bytes"])
            ratio = r["step_s"] / comp["step_s"]
            self.report.add(Check(self.model, "inductor-at-compile", ratio <= TIME_SLACK, ratio,
                                  f"<= {TIME_SLACK}x compile", f"{r['step_s'] * 1e3:.1f} vs {comp['step_s'] * 1e3:.1f} "
                                  f"ms at {format_bytes(comp['graph_bytes'])} of graph memory"))
        except LibraOptError as e:
            self.report.add(Check(self.model, "inductor-at-compile", False, detail=str(e)[:200]))
        ck = self.reference("checkpoint")
        for ex in self.executors():
            if self.out_of_time():
                return self.skip(f"vs-checkpoint[{ex}]", "out of time")
            try:
                r = self.libra(ex, f"vs-checkpoint[{ex}]", budget_bytes=ck["graph_bytes"])
                speed = ck["step_s"] / r["step_s"]
                self.report.add(Check(self.model, f"vs-checkpoint[{ex}]", speed >= CHECKPOINT_SPEEDUP, speed,
                                      f">= {CHECKPOINT_SPEEDUP}x", f"peak {format_bytes(r['peak_bytes'])} vs "
                                      f"checkpoint's {format_bytes(ck['peak_bytes'])}"))
            except LibraOptError as e:
                self.report.add(Check(self.model, f"vs-checkpoint[{ex}]", False, detail=str(e)[:200]))

    def part_curve(self) -> None:
        """Fractions here are of eager's graph memory (reserved peak minus what
        is allocated before the step), so that what else is alive in this
        process (the profiled problem's model) counts for no method."""
        eager = self.reference("eager")
        curve = []
        for amb in hl.AMBS:
            if self.out_of_time():
                break
            c = self.reference(f"amb={amb:g}")
            curve.append((c["graph_bytes"] / eager["graph_bytes"], c["step_s"]))
        lowest = min((x for x, _ in curve), default=None)
        for ex in self.executors():
            for frac in CURVE_POINTS:
                target = f"curve-{frac:g}[{ex}]"
                if self.out_of_time():
                    self.skip(target, "out of time")
                    continue
                try:
                    r = self.libra(ex, target, budget_bytes=int(frac * eager["graph_bytes"]))
                except LibraOptError as e:
                    reached = lowest is not None and lowest <= frac
                    self.report.add(Check(self.model, target, False if reached else None,
                                          detail=("" if reached else f"neither reaches {frac:g} (compile's lowest "
                                                  f"{lowest if lowest is None else round(lowest, 2)}): ") + str(e)[:200]))
                    continue
                x = r["graph_bytes"] / eager["graph_bytes"]
                ref = interpolate_curve(curve, x)
                if ref is None:
                    self.report.add(Check(self.model, target, True, x, "< compile's",
                                          f"torch.compile's curve (lowest {lowest:.2f} of eager's graph memory) does "
                                          f"not reach {x:.2f}"))
                else:
                    self.report.add(Check(self.model, target, r["step_s"] < ref, r["step_s"] / ref, "< 1x compile",
                                          f"libra {r['step_s'] * 1e3:.1f} ms at {x:.2f} of eager's graph memory; "
                                          f"compile {ref * 1e3:.1f} ms there"))

    def part_profiles(self) -> None:
        from libra_opt.frontend.profiling import profile_agreement, profile_step

        _, step, _, first = self.problem()
        second = profile_step(step, progress=False)
        agree = profile_agreement(first, second)
        self.report.add(Check(self.model, "two-profiles", agree["step"] <= PROFILE_TOLERANCE, agree["step"],
                              f"<= {PROFILE_TOLERANCE:.0%}", f"ops differ by {agree['ops']:.1%} (time-weighted); "
                              f"calibration x{first['calibration']:.3f} / x{second['calibration']:.3f}, spread "
                              f"{first['spread']['step']:.3f}"))

    def grads_of(self, zm, run) -> list:
        params = [p for p in zm.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        torch.manual_seed(1)
        loss = run()
        loss.backward()
        grads = [None if p.grad is None else p.grad.detach().float().clone() for p in params]
        for p in params:
            p.grad = None
        return grads

    def part_grads(self) -> None:
        from libra_opt.passes.costs import for_executor
        from libra_opt.passes.simulator import no_remat_peak
        from libra_opt.solvers import solve

        zm, step, problem, _ = self.problem()
        ac = self.env.autocast

        def eager_loss():
            with torch.autocast(self.env.device.type, dtype=ac or torch.bfloat16, enabled=ac is not None):
                return zm.step_loss()

        ref = self.grads_of(zm, eager_loss)
        frac = 0.5 if self.cuda else 1.0   # the tiny CPU model has no plan below its no-remat peak
        diffs = {}
        for ex in self.executors():
            target = f"grads-{ex}"
            try:
                priced = for_executor(problem, ex)
                plan = solve(priced, int(frac * no_remat_peak(problem)), "libra")
                om = hl._libra_module(hl.METHODS[f"libra-hybrid-{ex}"], zm, priced, plan, step, self.env)
                diffs[ex] = max_rel_grad_diff(ref, self.grads_of(zm, lambda: om(*zm.args, **zm.kwargs)))
                del om
            except LibraOptError as e:
                self.report.add(Check(self.model, target, False, detail=str(e)[:200]))
        if "eager" in diffs:
            tol = GRAD_TOLERANCE if self.cuda else 0.0
            self.report.add(Check(self.model, "grads-eager", diffs["eager"] <= tol, diffs["eager"], f"<= {tol:g}",
                                  f"budget {frac:g} of the no-remat peak"))
        if "inductor" in diffs:
            compiled = torch.compile(zm.model, backend="inductor" if self.cuda else "aot_eager")

            def compiled_loss():
                with torch.autocast(self.env.device.type, dtype=ac or torch.bfloat16, enabled=ac is not None):
                    out = compiled(*zm.args, **zm.kwargs)
                    return zm.loss_fn(out) if zm.loss_fn is not None else out.sum()

            comp = max_rel_grad_diff(ref, self.grads_of(zm, compiled_loss))
            tol = max(GRAD_TOLERANCE, 1.25 * comp)
            self.report.add(Check(self.model, "grads-inductor", diffs["inductor"] <= tol, diffs["inductor"],
                                  f"<= {tol:.3g}", f"torch.compile's own difference {comp:.3g}"))

    def part_maxbatch(self) -> None:
        if not self.cuda:
            for t in ("no-oom", "max-batch", "max-batch-time", "max-batch-speed"):
                self.skip(t, "needs a CUDA GPU (a hard memory cap)")
            return
        for ex in self.executors():
            if self.out_of_time():
                self.skip(f"max-batch[{ex}]", "out of time")
                continue
            t0 = time.perf_counter()
            m = hl.METHODS[f"libra-hybrid-{ex}"]
            try:
                entry = hl.maxbatch_via_library(m, self.model, self.seq, self.env,
                                                EAGER_MAX_BATCH.get(self.model, 1), None)
            except LibraOptError as e:
                self.report.add(Check(self.model, f"max-batch[{ex}]", False, detail=str(e)[:200]))
                continue
            wall = time.perf_counter() - t0
            ooms = oom_probes(entry.get("probes", []))
            self.report.add(Check(self.model, f"no-oom[{ex}]", not ooms, len(ooms), "0 OOMs",
                                  "; ".join(f"batch {p[0]}: {p[2][:60]}" for p in ooms)))
            target = MAX_BATCH_TARGET.get(self.model)
            batch = entry.get("batch") or 0
            planned = hl._first(entry, "planned_reserved_bytes", "planned_peak_bytes")
            measured = hl._first(entry, "measured_reserved_bytes", "reserved_peak_bytes", "reserved_bytes",
                                 "peak_bytes")
            self.report.add(Check(self.model, f"max-batch[{ex}]", None if target is None else batch >= target, batch,
                                  f">= {target}", f"planned peak {hl._bytes(planned)}, measured "
                                  f"{hl._bytes(measured)}; limit: {entry.get('limit') or entry.get('limited_by') or '?'}"))
            self.report.add(Check(self.model, f"max-batch-time[{ex}]", wall < 600, wall, "< 600 s"))
            sps, ref = entry.get("samples_per_s"), EAGER_SAMPLES_PER_S.get(self.model)
            self.report.add(Check(self.model, f"max-batch-speed[{ex}]", None, (sps / ref) if sps and ref else None,
                                  ">= 0.8x eager (stretch)", f"{sps or 0:.1f} samples/s vs eager's {ref} (H100 "
                                  f"reference); stretch target, reported only"))

    def run(self, parts: list[str]) -> None:
        for part in parts:
            if self.out_of_time():
                self.skip(f"part:{part}", f"out of time (--deadline); rerun with --models {self.model} --parts {part}")
                continue
            print(f"{self.model}: {part}", flush=True)
            try:
                getattr(self, f"part_{part}")()
            except torch.OutOfMemoryError as e:
                self.report.add(Check(self.model, f"part:{part}", False, detail=f"out of memory: {str(e)[:150]}"))


# =================================================================== main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"models: {', '.join(GPU_MODELS)} (GPU), {', '.join(CPU_MODELS)} (CPU); "
                                            f"parts: {', '.join(PARTS)}")
    parser.add_argument("--models", help="comma-separated (default: all of the device's)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset (default all)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default); cpu runs the logic on a tiny model (not the targets' device)")
    parser.add_argument("--memory", default="16GiB", help="the max-batch cap (default 16GiB)")
    parser.add_argument("--deadline", type=float, default=570.0,
                        help="seconds after which the remaining checks are SKIPped (default 570)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per measurement (median; default 5)")
    parser.add_argument("--out", type=Path, help="results file (default benchmarks/results/gpu_check.json; "
                                                   "cpu: .../smoke/gpu_check.json)")
    parser.add_argument("--fresh", action="store_true", help="start the results file over (default: merge)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    cuda = args.device == "cuda"
    table = GPU_MODELS if cuda else CPU_MODELS
    models = [m.strip() for m in (args.models or ",".join(table)).split(",") if m.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [m for m in models if m not in table] + [p for p in parts if p not in PARTS]
    if bad:
        parser.error(f"unknown model or part for --device {args.device}: {', '.join(bad)}")
    if cuda and not torch.cuda.is_available():
        print("gpu_check.py: the targets are GPU targets and this machine has no CUDA GPU; run it on an H100, or "
              "pass --device cpu to run its logic on a tiny model.", file=sys.stderr)
        return 2
    t_end = time.monotonic() + args.deadline
    if not cuda:
        torch.set_num_threads(1)
    from libra_opt.ir.units import parse_bytes

    cap = parse_bytes(args.memory) if cuda else hl._smoke_cap(models[0], CPU_MODELS[models[0]][0])
    env = hl.Env(device=torch.device(args.device), cap=cap, smoke=not cuda,
                 autocast=torch.bfloat16 if cuda else None, reserve=0.05, repeats=args.repeats, calibrate=True)
    out = args.out or (hl.RESULTS if cuda else hl.RESULTS / "smoke") / "gpu_check.json"
    meta = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "cap_bytes": cap}
    report = Report(out, meta, args.fresh)
    print(f"gpu_check: {', '.join(models)}; parts {', '.join(parts)}; deadline {args.deadline:.0f} s", flush=True)
    for model in models:
        seq, batch = table[model]
        Runner(model, seq, batch, env, report, t_end).run(parts)
        hl.free_device_memory()
    md = report.render()
    fails = [c for c in report.new if c.passed is False]
    print(f"{sum(c.passed is True for c in report.new)} PASS, {len(fails)} FAIL, "
          f"{sum(c.passed is None for c in report.new)} SKIP; wrote {report.path}, {md}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
