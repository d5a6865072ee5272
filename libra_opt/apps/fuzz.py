"""Seeded generator of small, valid :class:`~libra_opt.problem.RematProblem`
instances that exercise the corners of the IR, for fuzzing solvers.

Each problem is a random training step: a forward of plain ops over one or
two graph inputs, then (usually) a backward that walks the forward in reverse,
reads saved activations and produces gradients, which are step outputs.  The
forward mixes the shapes real captures have and solvers have tripped on:

- **two-output ops** (``aten.native_batch_norm``, ``max_pool2d_with_indices``:
  a large output and a small one with different readers);
- **views of graph inputs** (``aten.t`` of a weight: an activation on an
  input's storage);
- **two views of one base** (``aten.split``: one op making two views; or two
  view ops reading one base);
- a **non-recomputable random op** (``aten.native_dropout``'s mask) whose
  output feeds a view;
- **zero and huge sizes** (0 bytes, up to 2**40 bytes) and zero-time ops;
- **slow links** (host-device copies 10**3 to 10**6 times slower than 55 GB/s)
  and devices whose copies do not overlap compute (a CPU);
- now and then a single-phase graph (no backward) or an empty one (no nodes).

Use :func:`random_problem` for one instance and :func:`random_budget` for a
budget to plan it at; ``benchmarks/fuzz_solvers.py`` runs every built-in
solver over thousands of them and ``tests/test_fuzz_solvers.py`` over a few
hundred.

Source: the problem IR of ``DESIGN.md``; the op shapes are those of
AOTAutograd's joint graphs (PyTorch ``torch._functorch.aot_autograd``).
"""
from __future__ import annotations

import numpy as np

from ..ir.problem import BACKWARD, FORWARD, DeviceProfile, ProblemBuilder, Provenance, RematProblem

#: sizes drawn for a new storage: zero, tiny, typical (around the problem's scale) and huge ones
_ZERO, _TINY, _HUGE = 0.08, 0.05, 0.02
_KINDS = ("plain", "two", "view", "split", "two_views", "rand_view", "input_view")
_KIND_P = np.array([8, 2, 2, 1, 1, 1, 1], dtype=np.float64)


def _size(rng: np.random.Generator, scale: float) -> int:
    u = rng.random()
    if u < _ZERO:
        return 0
    if u < _ZERO + _TINY:
        return int(rng.integers(1, 5))
    if u < _ZERO + _TINY + _HUGE:
        return int(rng.integers(1 << 36, 1 << 40))
    return max(int(scale * rng.lognormal(0.0, 0.8)), 1)


def _time(rng: np.random.Generator) -> float:
    return 0.0 if rng.random() < 0.1 else float(rng.uniform(1e-6, 1e-3))


def random_problem(seed: int, *, max_forward: int = 10) -> RematProblem:
    """A random valid training step, the same for the same ``seed``.

    Parameters
    ----------
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    max_forward : int
        Most forward ops (the backward adds about as many again).

    Returns
    -------
    RematProblem
        Named ``fuzz-<seed>``; ``provenance.extra`` records the seed and the
        features drawn (``single_phase``, ``slow_link``, ``overlap``).
    """
    rng = np.random.default_rng(seed)
    scale = float(rng.choice([1 << 10, 1 << 20, 1 << 28]))

    def size():
        return _size(rng, scale)

    b = ProblemBuilder()
    inputs = [b.input("x", size())]
    if rng.random() < 0.7:
        inputs.append(b.input("w", size()))
    single_phase = rng.random() < 0.15
    n_fwd = 0 if rng.random() < 0.02 else int(rng.integers(1, max_forward + 1))
    avail = list(inputs)          # tensors later ops may read
    acts: list[int] = []          # forward activations (saved for backward when read there)
    k = 0

    def op(name, reads, outs, recomputable=True, phase=FORWARD, target=""):
        nonlocal k
        k += 1
        return b.op(f"{name}_{k}", reads, outs, time_s=_time(rng), phase=phase, target=target or f"aten.{name}",
                    workspace_bytes=size() if rng.random() < 0.2 else 0, recomputable=recomputable)

    def pick(n):
        n = min(n, len(avail))
        return [int(t) for t in rng.choice(avail, size=n, replace=False)]

    for _ in range(n_fwd):
        kind = str(rng.choice(_KINDS, p=_KIND_P / _KIND_P.sum()))
        reads = pick(int(rng.integers(1, 3)))
        if kind == "plain":
            new = op("mm", reads, [("t", size())])
        elif kind == "two":
            new = op("native_batch_norm", reads, [("out", size()), ("stat", size())])
        elif kind in ("view", "input_view"):
            src = int(rng.choice(inputs)) if kind == "input_view" else reads[0]
            new = op("view", [src], [("v", 0, src)])
        elif kind == "split":
            new = op("split", reads[:1], [("s0", 0, reads[0]), ("s1", 0, reads[0])])
        elif kind == "two_views":
            (base,) = op("mm", reads, [("t", size())])
            new = (base, *op("view", [base], [("va", 0, base)]), *op("slice", [base], [("vb", 0, base)]))
        else:  # rand_view: a dropout mask (random: not recomputable) read through a view
            (mask,) = op("native_dropout", reads[:1], [("mask", size())], recomputable=False)
            new = (mask, *op("view", [mask], [("mv", 0, mask)]))
        avail.extend(new)
        acts.extend(new)
    outputs: list[int] = []
    if acts:
        (loss,) = op("sum", [acts[-1]], [("loss", 4)])
        outputs.append(loss)
    if not single_phase and acts:
        grad = None
        for t in reversed(acts):
            if rng.random() < 0.35:
                continue
            reads = [t] + ([grad] if grad is not None else []) + ([int(rng.choice(acts))] if rng.random() < 0.3 else [])
            (grad,) = op("mm_backward", reads, [("g", size())], phase=BACKWARD)
            if rng.random() < 0.3:
                outputs.append(grad)
        if grad is None:
            (grad,) = op("mm_backward", [acts[0]], [("g", size())], phase=BACKWARD)
        outputs.append(grad)
    slow = rng.random() < 0.25
    bw = 55e9 / (10 ** rng.uniform(3, 6)) if slow else 55e9
    device = DeviceProfile(name="fuzz", h2d_bytes_per_s=bw, d2h_bytes_per_s=bw * rng.uniform(0.5, 2.0),
                           copies_overlap_compute=bool(rng.random() < 0.8))
    prov = Provenance(source="fuzz", model=f"fuzz-{seed}",
                      extra=dict(seed=int(seed), single_phase=single_phase, slow_link=slow,
                                 overlap=device.copies_overlap_compute))
    return b.build(outputs=outputs, device=device, provenance=prov, name=f"fuzz-{seed}")


def random_budget(problem: RematProblem, seed: int) -> int:
    """A graph-memory budget (bytes) for case ``seed``, spread where solvers
    differ: the no-remat peak a fifth of the time, otherwise between 0.9x the
    memory lower bound (:func:`~libra_opt.bounds.memory_lower_bound`) and the
    peak.  At least 1 byte (a budget must be positive)."""
    from ..passes.bounds import memory_lower_bound
    from ..passes.simulator import no_remat_peak

    rng = np.random.default_rng([seed, 1])
    peak, lb = no_remat_peak(problem), memory_lower_bound(problem)
    if rng.random() < 0.2:
        return max(int(peak), 1)
    lo = 0.9 * min(lb, peak)
    return max(int(lo + rng.random() * (peak - lo)), 1)


#: the built-in solvers that plan a small problem in well under a second (no MILP / LP)
FAST_SOLVERS = (("libra", {"policy": "hybrid"}), ("libra", {"policy": "recompute"}), ("libra", {"policy": "swap"}),
                ("none", {}), ("checkpoint-all", {}), ("chen-sqrt", {}), ("chen-greedy", {}), ("swap-all", {}))

PLAN, INFEASIBLE, SOLVER_ERROR, INTERNAL_ERROR = "plan", "infeasible", "solver_error", "internal_error"


def check_case(problem: RematProblem, budget, solver: str, **options) -> tuple[str, str]:
    """Plan ``problem`` at ``budget`` with ``solver`` and judge the outcome.

    Returns ``(outcome, message)``: ``"plan"`` when the schedule, simulated
    again from scratch, is valid and within the budget; ``"infeasible"`` for
    an :class:`~libra_opt.errors.InfeasibleBudgetError` that states a smallest
    feasible budget above the one asked; ``"solver_error"`` for a
    :class:`~libra_opt.errors.SolverError`; ``"internal_error"`` for any other
    exception, an invalid plan, a plan over budget, or a plan that runs
    faster than the cut bound of its class
    (:func:`~libra_opt.passes.cut_bounds.cut_lower_bound`; the message says
    which).  Never raises for what the solver does.
    """
    from ..errors import InfeasibleBudgetError, LibraOptError, SolverError
    from ..passes.simulator import simulate
    from ..solvers import solve

    try:
        res = solve(problem, budget, solver, **options)
    except InfeasibleBudgetError as e:
        if e.min_feasible_bytes is not None and e.min_feasible_bytes <= e.budget_bytes:
            return INTERNAL_ERROR, f"infeasible, yet states a smallest feasible budget within it: {e}"
        return INFEASIBLE, str(e)
    except SolverError as e:
        cause = e.__cause__
        if cause is not None and not isinstance(cause, LibraOptError):  # a bug the base class wrapped
            return INTERNAL_ERROR, f"{type(cause).__name__}: {cause} (wrapped: {e})"
        return SOLVER_ERROR, f"{type(e).__name__}: {e}"
    except Exception as e:  # the fuzzer's job is to report these
        return INTERNAL_ERROR, f"{type(e).__name__}: {e}"
    try:
        sim = simulate(problem, res.schedule, budget=res.budget_bytes)
    except LibraOptError as e:
        return INTERNAL_ERROR, f"returned a plan the simulator rejects: {e}"
    if sim.peak_bytes != res.peak_bytes:
        return INTERNAL_ERROR, f"reports peak {res.peak_bytes} bytes, simulated {sim.peak_bytes}"
    from ..passes.cut_bounds import cut_lower_bound
    from ..solvers.certificates import HYBRID, plan_class

    cut = cut_lower_bound(problem, res.budget_bytes, swaps=plan_class(res.schedule) == HYBRID)
    if sim.time_s < cut.time_s * (1 - 1e-9):
        return INTERNAL_ERROR, (f"simulates in {sim.time_s!r} s, under the cut bound {cut.time_s!r} s of its plan class "
                                f"(node {cut.node}): the bound or the simulator is wrong")
    return PLAN, ""


__all__ = ["random_problem", "random_budget", "check_case", "FAST_SOLVERS"]
