"""The end-to-end demonstration behind ``libra-opt demo``.

One run goes through the whole pipeline on a real architecture with random
weights (nothing is downloaded):

1. **build** a model (by default GPT-2 from a ``transformers`` config) and a
   deep copy of it, the eager reference (same seed, same weights);
2. **profile** one training step: capture the joint forward+backward graph
   (:func:`libra_opt.capture.capture`), time every op on the device
   and measure the device (:func:`libra_opt.profiling.problem_of`), build the
   :class:`~libra_opt.problem.RematProblem`;
3. **solve**: plan within the budget (default 50 % of the no-remat peak) with
   the chosen solver (default ``libra``);
4. **train** a few AdamW steps with the plan
   (:class:`libra_opt.runtime.module.OptimizedModule`) and the same steps
   eagerly on the copy, and check that the losses agree.

It reports the no-remat peak, the budget, the planned (simulated) peak, the
measured peak (``torch.cuda.max_memory_allocated`` on a GPU; on a CPU the
runtime's storage tracker, :func:`libra_opt.runtime.executor.measure_step_peak`),
the measured step-time overhead against eager PyTorch, the solve time, and
where the memory went: bytes recomputed, swapped and kept, from the plan's
eviction decisions (``schedule.meta["evictions"]``).

Default sizes: on a GPU the zoo's ``gpt2`` (GPT-2 small: 12 layers, 768
hidden) at batch 8, sequence 512; on a CPU :func:`gpt2_cpu`, the GPT-2
architecture with 4 layers, 256 hidden, 4 heads and a vocabulary of 8192, at
batch 8, sequence 128, which profiles, plans and trains in well under two
minutes on two cores.

Sources: the pipeline of ``DESIGN.md``; measurement as in its "Measuring"
section (``torch.cuda.max_memory_allocated``, median step time over repeats).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import LibraOptError
from ..ir.units import check_budget, format_bytes, format_seconds, parse_budget

if TYPE_CHECKING:  # pragma: no cover
    from ..ir.problem import RematProblem
    from ..ir.schedule import Schedule
    from ..solvers import SolveResult
    from .zoo import ZooModel

logger = logging.getLogger(__name__)

__all__ = ["DemoConfig", "DemoReport", "MemoryBreakdown", "run_demo", "memory_breakdown", "gpt2_cpu",
           "default_size", "CPU_DEFAULT", "GPU_DEFAULT"]

#: default model, batch, sequence on a CPU (``gpt2-cpu`` is :func:`gpt2_cpu`)
CPU_DEFAULT = ("gpt2-cpu", 8, 128)
#: default model, batch, sequence on a GPU (the zoo's GPT-2 small)
GPU_DEFAULT = ("gpt2", 8, 512)

#: models the demo builds itself, besides the zoo's
DEMO_MODELS = {"gpt2-cpu": "libra_opt.apps.demo:gpt2_cpu"}


def gpt2_cpu(batch: int, seq: int | None = None, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32):
    """GPT-2 sized for a two-core CPU: the GPT-2 architecture
    (``transformers.GPT2LMHeadModel``) with 4 layers, 256 hidden, 4 heads,
    vocabulary 8192, random weights, dropout 0.

    Parameters
    ----------
    batch : int
    seq : int, optional
        Sequence length (default 128).
    device, dtype
        Where and in what dtype to build it.

    Returns
    -------
    ZooModel
        ``input_ids`` and ``labels`` of shape ``(batch, seq)``; the loss is
        the model's causal-LM loss.
    """
    from .zoo import ZooModel, transformers_classes

    GPT2Config, GPT2LMHeadModel = transformers_classes("GPT2Config", "GPT2LMHeadModel")  # noqa: N806

    seq = int(seq or 128)
    vocab = 8192
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=vocab, n_positions=max(seq, 128),
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"
    model = model.to(device=device, dtype=dtype).train()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    return ZooModel(model, (), {"input_ids": ids, "labels": ids.clone()}, _lm_loss,
                    f"GPT-2 architecture for a CPU (4 layers, 256 hidden, 4 heads, vocab {vocab}); "
                    f"batch {batch}, sequence {seq}", name="gpt2-cpu", batch=batch, seq=seq, dtype=dtype)


def _lm_loss(output) -> torch.Tensor:
    return output.loss


def default_size(device: torch.device) -> tuple[str, int, int]:
    """``(model, batch, seq)`` the demo uses on ``device`` when not told."""
    return GPU_DEFAULT if device.type == "cuda" else CPU_DEFAULT


# ====================================================================== config
@dataclass
class DemoConfig:
    """What :func:`run_demo` runs.

    Attributes
    ----------
    model : str, optional
        Zoo name, ``"gpt2-cpu"`` or ``"module:callable"`` (default: see
        :func:`default_size`).
    batch, seq : int, optional
        Batch size and sequence length / image side (defaults per device).
    budget : str or int or float
        Graph-memory budget: ``"50%"`` of the no-remat peak (default), bytes
        or ``"1GiB"``.
    solver : str
        A registered solver (default ``"libra"``).
    steps : int
        Training steps (>= 2: the first is a warm-up, the rest are timed).
    device : str, optional
        ``"cuda"`` if available, else ``"cpu"``.
    plot : str, optional
        Path of a memory-timeline plot (plan vs no-remat).
    lr : float
        AdamW learning rate.
    seed : int
        Seed of the weights and inputs.
    rtol : float
        Relative tolerance of the loss check, per step.
    autocast_dtype : torch.dtype, optional
        Mixed precision (then the loss check is looser: see ``rtol``).
    """

    model: str | None = None
    batch: int | None = None
    seq: int | None = None
    budget: Any = "50%"
    solver: str = "libra"
    steps: int = 4
    device: str | None = None
    plot: str | None = None
    lr: float = 1e-3
    seed: int = 0
    rtol: float = 1e-3
    autocast_dtype: torch.dtype | None = None

    def _check(self) -> None:
        """Raise :class:`LibraOptError` (a ``BudgetError`` for the budget) for
        a bad option, before anything is built or profiled."""
        if int(self.steps) < 2:
            raise LibraOptError(f"--steps must be >= 2 (one warm-up, then timed steps), got {self.steps}")
        for name in ("batch", "seq"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LibraOptError(f"--{name} must be an integer >= 1, got {v!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise LibraOptError(f"--lr must be a finite number > 0, got {self.lr!r}")
        if not (math.isfinite(self.rtol) and self.rtol >= 0):
            raise LibraOptError(f"--rtol must be a finite number >= 0, got {self.rtol!r}")
        check_budget(self.budget)  # the budget contract, before building or profiling anything

    def resolved(self) -> "DemoConfig":
        """A copy with the device, model, batch and seq defaults filled in."""
        dev = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise LibraOptError("--device cuda was given but CUDA is not available; use --device cpu")
        model, batch, seq = default_size(dev)
        self._check()
        if self.model is not None and self.model != model:
            batch, seq = 4, None  # a model of the user's choice: a small batch, the zoo's default length
        return DemoConfig(model=self.model or model, batch=self.batch or batch,
                          seq=self.seq if self.seq is not None else seq, budget=self.budget, solver=self.solver,
                          steps=int(self.steps), device=str(dev), plot=self.plot, lr=self.lr, seed=self.seed,
                          rtol=self.rtol, autocast_dtype=self.autocast_dtype)


# ===================================================================== report
@dataclass(frozen=True)
class MemoryBreakdown:
    """Where the saved activations went under a plan (bytes and counts of
    storages): ``recomputed`` and ``swapped`` are the evicted storages by
    policy; ``kept`` are the other activations saved for the backward
    (storages used both before and after the forward/backward boundary,
    :func:`libra_opt.lowering.default_windows`).  ``recompute_s`` /
    ``stall_s`` / ``d2h_bytes`` are the simulator's."""

    recomputed_bytes: int
    recomputed_count: int
    swapped_bytes: int
    swapped_count: int
    kept_bytes: int
    kept_count: int
    recompute_s: float = 0.0
    stall_s: float = 0.0
    d2h_bytes: int = 0

    def lines(self) -> list[str]:
        """The "where the saved activations went" table, one line per kind (text)."""
        total = self.recomputed_bytes + self.swapped_bytes + self.kept_bytes

        def pct(b):
            return f"{100.0 * b / total:5.1f}%" if total else "   - "

        return [f"  recomputed {format_bytes(self.recomputed_bytes):>11}  {pct(self.recomputed_bytes)}  "
                f"({self.recomputed_count} storages; {format_seconds(self.recompute_s)} of recompute, simulated)",
                f"  swapped    {format_bytes(self.swapped_bytes):>11}  {pct(self.swapped_bytes)}  "
                f"({self.swapped_count} storages; {format_bytes(self.d2h_bytes)} copied to host, "
                f"{format_seconds(self.stall_s)} of stalls, simulated)",
                f"  kept       {format_bytes(self.kept_bytes):>11}  {pct(self.kept_bytes)}  "
                f"({self.kept_count} storages saved for backward stay on the device)"]


def memory_breakdown(problem: "RematProblem", schedule: "Schedule", simulation=None) -> MemoryBreakdown:
    """Bytes recomputed / swapped / kept by a plan.

    Parameters
    ----------
    problem : RematProblem
    schedule : Schedule
        A plan; its ``meta["evictions"]`` (``[storage, after, before,
        policy]`` lists, written by :func:`libra_opt.lowering.lower`) are
        used when present, else the schedule's recomputed nodes and swapped
        tensors.
    simulation : SimulationResult, optional
        For the recompute seconds, stalls and copied bytes.

    Returns
    -------
    MemoryBreakdown
        Each storage counted once (by its first eviction's policy).
    """
    from ..passes.lowering import default_windows

    policy: dict[int, str] = {}
    evictions = schedule.meta.get("evictions")
    if evictions:
        for storage, _after, _before, pol in evictions:
            policy.setdefault(int(storage), str(pol))
    else:
        for t in schedule.swapped_tensors():
            policy.setdefault(problem.tensors[t].storage, "swap")
        for nid in schedule.recomputed_nodes():
            for t in problem.nodes[nid].outputs:
                policy.setdefault(problem.tensors[t].storage, "recompute")
    nbytes = {s: problem.tensors[s].nbytes for s in policy}
    rec = [s for s, p in policy.items() if p == "recompute"]
    swp = [s for s, p in policy.items() if p == "swap"]
    saved = [s for s in default_windows(problem) if s not in policy]
    sim = simulation
    return MemoryBreakdown(
        recomputed_bytes=sum(nbytes[s] for s in rec), recomputed_count=len(rec),
        swapped_bytes=sum(nbytes[s] for s in swp), swapped_count=len(swp),
        kept_bytes=sum(problem.tensors[s].nbytes for s in saved), kept_count=len(saved),
        recompute_s=float(sim.recompute_s) if sim is not None else 0.0,
        stall_s=float(sim.stall_s) if sim is not None else 0.0,
        d2h_bytes=int(sim.d2h_bytes) if sim is not None else 0)


@dataclass
class DemoReport:
    """What :func:`run_demo` found.

    Attributes
    ----------
    config : DemoConfig
        As resolved (device, model, batch, seq filled in).
    description : str
        The model, in one line.
    device_name : str
    no_remat_peak_bytes : int
        Simulated peak graph memory of eager PyTorch's plan (bytes).
    budget_bytes : int
    planned_peak_bytes : int
        Simulated peak of the plan (bytes), <= budget.
    measured_peak_bytes : int or None
        Measured peak graph memory of a planned forward + backward (bytes):
        ``torch.cuda.max_memory_allocated`` minus the memory allocated before
        the step on a GPU; on a CPU the runtime's storage tracker
        (:class:`~libra_opt.runtime.executor.StorageTracker`) while the plan's
        lowered graphs run.
    eager_measured_peak_bytes : int or None
        The same for the eager step.
    measured_note : str
        How the measured peaks were taken.
    fixed_bytes : int
        Parameters, buffers, AdamW state and inputs (outside graph memory).
    eager_step_s, planned_step_s : float
        Median measured training-step time (s) over the timed steps.
    simulated_added_s, simulated_base_s : float
        The plan's simulated added time and the no-remat step (s).
    solve_s : float
        Wall time of the solver (s).
    losses_eager, losses_planned : list of float
        Loss per step.
    loss_max_rel_diff : float
    loss_ok : bool
    breakdown : MemoryBreakdown
    stage_s : dict
        Wall seconds per stage (build, profile, solve, train).
    plot_path : str or None
    solver : str
    status : str
        The solver's status.
    """

    config: DemoConfig
    description: str
    device_name: str
    no_remat_peak_bytes: int
    budget_bytes: int
    planned_peak_bytes: int
    measured_peak_bytes: int | None
    eager_measured_peak_bytes: int | None
    measured_note: str
    fixed_bytes: int
    eager_step_s: float
    planned_step_s: float
    simulated_added_s: float
    simulated_base_s: float
    solve_s: float
    losses_eager: list[float]
    losses_planned: list[float]
    loss_max_rel_diff: float
    loss_ok: bool
    breakdown: MemoryBreakdown
    stage_s: dict = field(default_factory=dict)
    plot_path: str | None = None
    solver: str = "libra"
    status: str = ""

    @property
    def overhead(self) -> float:
        """Measured step-time overhead: planned / eager - 1."""
        return self.planned_step_s / self.eager_step_s - 1.0 if self.eager_step_s > 0 else math.nan

    def rows(self) -> list[tuple[str, str]]:
        """``(field, value)`` rows of the summary table."""
        ref = max(self.no_remat_peak_bytes, 1)

        def rel(b):
            return f"{format_bytes(b)} ({100.0 * b / ref:.0f}% of no-remat)"

        if self.measured_peak_bytes is not None:
            measured = rel(self.measured_peak_bytes)
            if self.eager_measured_peak_bytes is not None:
                measured += f"; eager {format_bytes(self.eager_measured_peak_bytes)}"
        else:
            measured = self.measured_note
        sim_pct = 100.0 * self.simulated_added_s / self.simulated_base_s if self.simulated_base_s > 0 else 0.0
        return [
            ("no-remat peak", f"{format_bytes(self.no_remat_peak_bytes)} (simulated graph memory; fixed "
                              f"memory {format_bytes(self.fixed_bytes)} on top)"),
            ("budget", rel(self.budget_bytes)),
            ("planned peak", rel(self.planned_peak_bytes) + " (simulated)"),
            ("measured peak", measured),
            ("step-time overhead", f"{100.0 * self.overhead:+.1f}% measured (eager "
                                   f"{format_seconds(self.eager_step_s)}, planned "
                                   f"{format_seconds(self.planned_step_s)}); {sim_pct:+.1f}% simulated"),
            ("solve time", f"{format_seconds(self.solve_s)} ({self.solver}, {self.status})"),
            ("loss check", f"{'ok' if self.loss_ok else 'FAILED'}: max relative difference "
                           f"{self.loss_max_rel_diff:.2e} over {len(self.losses_eager)} steps "
                           f"(tolerance {self.config.rtol:g})"),
        ]

    def table(self) -> str:
        """The summary table as text."""
        rows = self.rows()
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k:<{w}}  {v}" for k, v in rows)

    def text(self) -> str:
        """Table, where the memory went, and the loss per step."""
        out = [f"{self.description} on {self.device_name}", self.table(), "where the saved activations went:"]
        out += self.breakdown.lines()
        out.append("loss per step (eager / planned): " + ", ".join(
            f"{a:.5f}/{b:.5f}" for a, b in zip(self.losses_eager, self.losses_planned)))
        if self.plot_path:
            out.append(f"memory timeline written to {self.plot_path}")
        return "\n".join(out)


# ======================================================================= run
def _build(cfg: DemoConfig) -> "ZooModel":
    from .zoo import build_model

    name = DEMO_MODELS.get(cfg.model, cfg.model)
    zm = build_model(name, cfg.batch, cfg.seq, device=cfg.device, seed=cfg.seed)
    if cfg.model in DEMO_MODELS:
        zm.name = cfg.model
    return zm


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Trainer:
    """forward (+ loss) + backward, timed, with optional peak measurement, then AdamW."""

    def __init__(self, forward: Callable[[], torch.Tensor], params, device: torch.device, lr: float):
        self.forward = forward
        self.device = device
        self.opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr)

    def fwd_bwd(self) -> torch.Tensor:
        loss = self.forward()
        loss.backward()
        return loss

    def step(self, measure: bool) -> tuple[float, float, int | None]:
        """One step: ``(loss, seconds, peak graph bytes or None)``; the peak is
        measured on a GPU only (``max_memory_allocated`` minus the memory
        allocated before the step)."""
        self.opt.zero_grad(set_to_none=True)
        peak = None
        _sync(self.device)
        t0 = time.perf_counter()
        if measure and self.device.type == "cuda":
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            loss = self.fwd_bwd()
            _sync(self.device)
            peak = int(torch.cuda.max_memory_allocated(self.device) - base)
        else:
            loss = self.fwd_bwd()
        _sync(self.device)
        seconds = time.perf_counter() - t0
        self.opt.step()
        return float(loss.detach()), seconds, peak


def _tracked_peaks(step, problem: "RematProblem", schedule: "Schedule") -> tuple[int, int]:
    """CPU: measured peak graph memory of the plan and of eager PyTorch's
    free-after-last-use execution, by the runtime's storage tracker, running
    the plan's lowered forward and backward graphs on the captured inputs
    (:func:`libra_opt.runtime.partition.run_lowered`) and the joint graph
    (:func:`libra_opt.runtime.executor.measure_joint_peak`).  Returns
    ``(planned, eager)`` bytes."""
    from ..runtime.executor import measure_joint_peak, measure_step_peak
    from ..runtime.partition import lower_plan, run_lowered
    from ..runtime.swap import SwapManager

    low = lower_plan(step.joint, step.num_fwd_outputs, problem, schedule, SwapManager(step.device))
    planned = measure_step_peak(lambda: run_lowered(low, step.primals, step.tangents), device=step.device)
    eager = measure_joint_peak(step, device=step.device)
    return int(planned.peak_bytes), int(eager.peak_bytes)


def run_demo(config: DemoConfig | None = None, *, progress: Callable[[str, str], None] | None = None
             ) -> DemoReport:
    """Build, profile, plan and train a model; compare with eager PyTorch.

    Parameters
    ----------
    config : DemoConfig, optional
        Defaults: GPT-2 on the GPU if there is one, else :func:`gpt2_cpu` on
        the CPU; budget 50 %; solver ``libra``; 4 steps.
    progress : callable, optional
        ``progress(stage, message)`` is called as each stage starts and ends
        (stages ``build``, ``profile``, ``solve``, ``train``, ``plot``).

    Returns
    -------
    DemoReport
        Check ``loss_ok``; the CLI exits non-zero when it is False.

    Raises
    ------
    LibraOptError
        A bad option (budget, steps, device), a model that does not capture,
        or an infeasible budget (the message gives the smallest feasible one).

    Notes
    -----
    Step 1 of both runs is a warm-up (the planned module is compiled there)
    and is not timed.  On a GPU the measured peaks are taken in the last
    step, eager and planned alike; on a CPU the runtime's storage tracker
    measures the plan's lowered graphs and the joint graph once, outside the
    timed steps (the tracker is a ``TorchDispatchMode``, under which
    ``torch.compile``'d code does not run).  Losses are compared step by step
    with ``rtol``; the planned and eager models start from the same weights
    (a deep copy made before capture).
    """
    from ..frontend.capture import capture
    from ..frontend.profiling import problem_of
    from ..runtime.module import OptimizedModule
    from ..ir.schedule import no_remat_schedule
    from ..passes.simulator import simulate
    from ..solvers import solve

    cfg = (config or DemoConfig()).resolved()
    say = progress or (lambda stage, msg: logger.info("%s: %s", stage, msg))
    dev = torch.device(cfg.device)
    stage_s: dict[str, float] = {}

    t0 = time.perf_counter()
    say("build", f"building {cfg.model} (batch {cfg.batch}) on {dev}")
    zm = _build(cfg)
    eager_model = copy.deepcopy(zm.model)  # same weights, before anything is optimized
    stage_s["build"] = time.perf_counter() - t0
    say("build", f"{zm.description}; {zm.num_parameters / 1e6:.1f} M parameters "
                 f"({format_seconds(stage_s['build'])})")

    t0 = time.perf_counter()
    say("profile", "capturing the joint forward+backward graph and timing every op")
    step = capture(zm.model, zm.args, zm.kwargs, autocast_dtype=cfg.autocast_dtype, loss_fn=zm.loss_fn)
    # a CPU is slow and steady: fewer passes keep the demo under two minutes on two cores
    passes = dict(warmup=2, repeats=5) if dev.type == "cuda" else dict(warmup=1, repeats=3)
    problem = problem_of(step, optimizer="adam", **passes)
    reference = simulate(problem)
    stage_s["profile"] = time.perf_counter() - t0
    say("profile", f"{len(problem.nodes)} ops, no-remat peak {format_bytes(reference.peak_bytes)}, "
                   f"profiled step {format_seconds(problem.total_compute_s)} "
                   f"({format_seconds(stage_s['profile'])})")

    t0 = time.perf_counter()
    try:
        budget = parse_budget(cfg.budget, reference.peak_bytes)
    except ValueError as e:
        raise LibraOptError(f"--budget: {e}") from None
    say("solve", f"planning with {cfg.solver!r} within {format_bytes(budget)}")
    plan: SolveResult = solve(problem, budget, cfg.solver)
    stage_s["solve"] = time.perf_counter() - t0
    say("solve", f"{plan.status}: planned peak {format_bytes(plan.peak_bytes)}, simulated step "
                 f"+{format_seconds(plan.added_s)} ({format_seconds(plan.solve_s)} of solving)")

    tracked = None
    if dev.type != "cuda":
        t0 = time.perf_counter()
        say("solve", "measuring the plan's peak with the storage tracker (CPU stand-in for max_memory_allocated)")
        tracked = _tracked_peaks(step, problem, plan.schedule)
        stage_s["measure"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say("train", f"{cfg.steps} AdamW steps with the plan and eagerly (step 1 is a warm-up)")
    om = OptimizedModule(zm.model, problem, plan, example_shapes=step.example_shapes,
                         autocast_dtype=cfg.autocast_dtype, loss_fn=zm.loss_fn, device=step.device)
    del step

    def planned_forward():
        out = om(*zm.args, **zm.kwargs)
        return out if zm.loss_fn is not None else out.sum()

    def eager_forward():
        ctx = (torch.autocast(dev.type, dtype=cfg.autocast_dtype) if cfg.autocast_dtype
               else contextlib.nullcontext())
        with ctx:
            out = eager_model(*zm.args, **zm.kwargs)
            return zm.loss_fn(out) if zm.loss_fn is not None else out.sum()

    planned_t = _Trainer(planned_forward, zm.model.parameters(), dev, cfg.lr)
    eager_t = _Trainer(eager_forward, eager_model.parameters(), dev, cfg.lr)
    losses_e, losses_p, times_e, times_p = [], [], [], []
    peak_e = peak_p = None
    for k in range(cfg.steps):
        last = k == cfg.steps - 1
        le, se, pe = eager_t.step(measure=last)
        lp, sp, pp = planned_t.step(measure=last)
        losses_e.append(le)
        losses_p.append(lp)
        if k > 0:
            times_e.append(se)
            times_p.append(sp)
        if last:
            peak_e, peak_p = pe, pp
        say("train", f"step {k + 1}/{cfg.steps}: loss eager {le:.5f}, planned {lp:.5f}; "
                     f"{format_seconds(se)} / {format_seconds(sp)}")
    stage_s["train"] = time.perf_counter() - t0
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(losses_e, losses_p)]
    max_rel = max(rel) if rel else 0.0
    loss_ok = all(math.isfinite(x) for x in losses_p) and max_rel <= cfg.rtol
    if dev.type == "cuda":
        note = "torch.cuda.max_memory_allocated during forward+backward, minus what was allocated before"
    else:
        peak_p, peak_e = tracked
        note = "runtime storage tracker: live storages while the lowered plan / the joint graph run"

    plot_path = None
    if cfg.plot:
        from .plots import plot_memory_timeline

        say("plot", f"writing the memory timeline to {cfg.plot}")
        plot_memory_timeline(problem, {"no remat (eager)": (no_remat_schedule(problem), reference),
                                       f"{plan.solver} @ {format_bytes(budget)}": (plan.schedule, plan.simulation)},
                             cfg.plot, budget_bytes=budget,
                             title=f"{zm.name}: batch {cfg.batch}, {cfg.solver} at {format_bytes(budget)}")
        plot_path = str(cfg.plot)

    return DemoReport(
        config=cfg, description=zm.description, device_name=problem.device.name,
        no_remat_peak_bytes=int(reference.peak_bytes), budget_bytes=int(budget),
        planned_peak_bytes=int(plan.peak_bytes), measured_peak_bytes=peak_p, eager_measured_peak_bytes=peak_e,
        measured_note=note, fixed_bytes=int(problem.fixed.resident_bytes),
        eager_step_s=statistics.median(times_e), planned_step_s=statistics.median(times_p),
        simulated_added_s=float(plan.added_s), simulated_base_s=float(problem.total_compute_s),
        solve_s=float(plan.solve_s), losses_eager=losses_e, losses_planned=losses_p, loss_max_rel_diff=max_rel,
        loss_ok=loss_ok, breakdown=memory_breakdown(problem, plan.schedule, plan.simulation), stage_s=stage_s,
        plot_path=plot_path, solver=plan.solver, status=plan.status)
