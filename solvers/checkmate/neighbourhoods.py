"""Large-neighbourhood search around a MILP incumbent: sub-MILPs over windows.

Given a starting solution, a MIP engine spends most of a long solve proving
a bound, and may find nothing better than the start: ``hybrid-milp`` with
SCIP on ``random_layered_graph(100, seed=0)`` (copies as slow as compute,
0.7 of its peak) kept libra's recompute-only plan (59,027) for 600 s.  A
sub-MILP that fixes every integer variable outside a small window to the
incumbent and lets the engine re-optimise the window alone is solved in
seconds, and the plans it finds combine moves a greedy does not make
together (there: a storage swapped out after its last use and back before
the chain that recomputes its consumer: 59,027 -> 56,783 within three minutes).

Two kinds of windows, taken in turn, each ``width`` wide and ``width // 2``
apart:

- **stages** ``[lo, hi)``: the variables of stages ``lo .. hi - 1`` (every
  recomputation, checkpoint and copy decided in those stages) are free;
- **nodes** ``[lo, hi)``: the variables about the values that nodes
  ``lo .. hi - 1`` produce (their checkpoints, copies and recomputations in
  every stage, and whether they are offloaded) are free.

Continuous variables (frees, queue shares, delays) are never fixed.  A
window's solution is taken where its objective is lower than the
incumbent's; a sub-MILP's bound bounds only the restricted model and is
dropped.  The search stops after a full pass without a gain, or when its
seconds are spent.

Source: fix-and-optimize over time windows (Helber & Sahling, "A
fix-and-optimize approach for the multi-level capacitated lot sizing
problem", Int. J. Production Economics 123, 2010, sec. 3) and
neighbourhoods around the incumbent (Danna, Rothberg & Le Pape, "Exploring
relaxation induced neighborhoods to improve MIP solutions", Mathematical
Programming 102, 2005); the engines are :func:`.backends.solve_mip`'s.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .backends import MIPOptions, MipResult, solve_mip

log = logging.getLogger(__name__)

__all__ = ["LNSResult", "window_keys", "window_starts", "search_windows", "solve_with_windows"]

#: a window's solution is taken where it lowers the objective by more than this share
MIN_GAIN = 1e-6
#: window width (stages or nodes): this share of the problem's nodes, within WIDTH_MIN..WIDTH_MAX
WIDTH_SHARE = 0.2
WIDTH_MIN = 8
WIDTH_MAX = 24
#: seconds one window's sub-MILP may take, at most
WINDOW_LIMIT_S = 15.0


@dataclass
class LNSResult:
    """What :func:`search_windows` found.

    Attributes
    ----------
    x : ndarray of shape (num_vars,)
        The best solution found (the start where no window improved it).
    objective : float
        Its objective (the model's scaled units).
    start_objective : float
        The start's objective (same units).
    windows : int
        Sub-MILPs solved.
    improved : int
        Sub-MILPs whose solution was taken.
    seconds : float
        Wall-clock seconds spent.
    log : list of (str, int, int, float, float)
        Per window taken: ``(kind, lo, hi, objective before, after)``.
    """

    x: np.ndarray
    objective: float
    start_objective: float
    windows: int = 0
    improved: int = 0
    seconds: float = 0.0
    log: list = field(default_factory=list)

    def summary(self, scale: float) -> dict:
        """A JSON-ready summary for ``extras["lns"]``; ``scale``: seconds per objective unit."""
        return {"windows": self.windows, "improved": self.improved, "seconds": round(self.seconds, 3),
                "start_s": self.start_objective * scale, "end_s": self.objective * scale,
                "taken": [[k, lo, hi] for k, lo, hi, _, _ in self.log]}


def window_keys(model) -> dict[str, np.ndarray]:
    """Per variable of ``model`` (a Checkmate or hybrid model), its stage
    and its node, for the two kinds of windows: ``{"stages": (num_vars,),
    "nodes": (num_vars,)}`` int64 arrays, ``-1`` for the variables no window
    frees or fixes (continuous ones, and integer ones indexed by neither,
    e.g. Checkmate's ``FREE``).  Stage-indexed tables: ``r_idx`` (stage,
    node), ``s_idx``, and on a hybrid model ``in_idx``, ``a_idx``, ``b_idx``
    (stage, value); ``off_idx`` (value) has a node only.  A value's node is
    its producer (``graph.value_node``)."""
    n = model.num_vars
    stages = np.full(n, -1, dtype=np.int64)
    nodes = np.full(n, -1, dtype=np.int64)
    vnode = np.asarray(model.graph.value_node, dtype=np.int64)
    tables = [(model.r_idx, np.arange(model.r_idx.shape[1]))]
    for name in ("s_idx", "in_idx", "a_idx", "b_idx"):
        idx = getattr(model, name, None)
        if idx is not None:
            tables.append((idx, vnode))
    integer = np.asarray(model.integer, dtype=bool)
    for idx, col_node in tables:
        t, c = np.nonzero(idx >= 0)
        var = idx[t, c]
        keep = integer[var]
        stages[var[keep]] = t[keep]
        nodes[var[keep]] = col_node[c[keep]]
    off = getattr(model, "off_idx", None)
    if off is not None:
        v = np.flatnonzero(off >= 0)
        var = off[v]
        keep = integer[var]
        nodes[var[keep]] = vnode[v[keep]]
    return {"stages": stages, "nodes": nodes}


def window_starts(n: int, width: int) -> list[int]:
    """First stage (node) of each window of ``width`` over ``0 .. n - 1``,
    ``width // 2`` apart, the last one ending at ``n``: ``[0]`` where
    ``width >= n``."""
    if width >= n:
        return [0]
    step = max(width // 2, 1)
    out = list(range(0, n - width + 1, step))
    if out[-1] + width < n:
        out.append(n - width)
    return out


def search_windows(model, x0: np.ndarray, options: MIPOptions, seconds: float,
                   on_improved: Callable[[np.ndarray], None] | None = None,
                   width: int | None = None) -> LNSResult:
    """Improve the solution ``x0`` of ``model`` by sub-MILPs over windows
    (module docstring), for at most ``seconds`` of wall-clock time.

    Parameters
    ----------
    model : CheckmateModel or HybridModel
        The full model (not changed: each sub-MILP is a shallow copy with
        its own bounds ``lb`` / ``ub``).
    x0 : ndarray of shape (num_vars,)
        A solution of ``model`` (e.g. the warm start).
    options : MIPOptions
        The backend and its settings; each sub-MILP is solved with
        :func:`~libra_opt.solvers.checkmate.backends.solve_mip` within at most
        :data:`WINDOW_LIMIT_S` seconds and what is left of ``seconds``.
    seconds : float
        Wall-clock budget (s).
    on_improved : callable (x) -> None, optional
        Called with each solution taken (e.g. to simulate its plan).
    width : int, optional
        Window width in stages (nodes); default :data:`WIDTH_SHARE` of the
        nodes within :data:`WIDTH_MIN` .. :data:`WIDTH_MAX`.

    Returns
    -------
    LNSResult
        Never a higher objective than ``x0``'s.

    Raises
    ------
    SolverUnavailableError, KeyboardInterrupt
        As :func:`~libra_opt.solvers.checkmate.backends.solve_mip`.
    """
    t0 = time.perf_counter()
    end = t0 + max(seconds, 0.0)
    x = np.asarray(x0, dtype=np.float64).copy()
    obj = float(model.obj @ x)
    out = LNSResult(x, obj, obj)
    n = int(model.r_idx.shape[0])
    if width is None:
        width = int(min(max(round(WIDTH_SHARE * n), WIDTH_MIN), WIDTH_MAX))
    keys = window_keys(model)
    starts = window_starts(n, width)
    plan = [(kind, lo) for lo in starts for kind in ("nodes", "stages")]
    stale = 0   # windows in a row without a gain: a full pass of them ends the search
    k = 0
    while stale < len(plan):
        left = end - time.perf_counter()
        if left < 1.0:
            break
        kind, lo = plan[k % len(plan)]
        k += 1
        key = keys[kind]
        fix = (key >= 0) & ((key < lo) | (key >= lo + width))
        sub = copy.copy(model)
        val = np.round(out.x[fix])
        sub.lb = model.lb.copy()
        sub.ub = model.ub.copy()
        sub.lb[fix] = val
        sub.ub[fix] = val
        res = solve_mip(sub, out.x, min(WINDOW_LIMIT_S, left), options)
        out.windows += 1
        if res.x is not None and res.objective is not None and res.objective < out.objective - MIN_GAIN * abs(out.objective):
            before = out.objective
            out.x, out.objective = np.asarray(res.x, dtype=np.float64), float(res.objective)
            out.improved += 1
            out.log.append((kind, lo, lo + width, before, out.objective))
            log.info("LNS: %s [%d, %d): %.6g -> %.6g", kind, lo, lo + width, before, out.objective)
            stale = 0
            if on_improved is not None:
                on_improved(out.x)
        else:
            stale += 1
    out.seconds = time.perf_counter() - t0
    return out


#: the first full solve (the probe) takes this share of the time, at most PROBE_MAX_S: where it proves
#: the optimum, no window is searched
PROBE_SHARE = 0.1
PROBE_MAX_S = 60.0


def solve_with_windows(model, hint: np.ndarray | None, seconds: float, options: MIPOptions, share: float,
                       on_improved: Callable[[np.ndarray], None] | None = None
                       ) -> tuple[MipResult, LNSResult | None]:
    """Solve ``model`` within ``seconds``, searching windows around the
    incumbent (:func:`search_windows`) where a first, short full solve does
    not prove the optimum.

    1. **Probe**: the full model from ``hint``, for :data:`PROBE_SHARE` of
       ``seconds`` (at most :data:`PROBE_MAX_S`); an optimum proven there is
       the answer.
    2. **Windows**: from the better of the probe's incumbent and ``hint``,
       for ``share`` of ``seconds``.
    3. **Final**: the full model from the windows' best solution, for what
       is left.

    The bound returned is the larger of the probe's and the final solve's
    (both bound the full model; no window's bound is used), the solution
    the best of the final solve's and the windows' (status ``"feasible"``
    where the windows' is better).  Without ``hint`` or with ``share <= 0``
    it is one full solve (:func:`~.backends.solve_mip`).

    Returns
    -------
    (MipResult, LNSResult or None)
        The result, and what the windows found (``None`` where none ran).

    Raises
    ------
    SolverUnavailableError, KeyboardInterrupt
        As :func:`~.backends.solve_mip`.
    """
    t0 = time.perf_counter()
    if hint is None or share <= 0:
        return solve_mip(model, hint, seconds, options), None
    probe = solve_mip(model, hint, min(PROBE_SHARE * seconds, PROBE_MAX_S), options)
    if probe.status in ("optimal", "infeasible"):
        return probe, None
    start = np.asarray(hint, dtype=np.float64)
    if probe.x is not None and probe.objective is not None and probe.objective < float(model.obj @ start):
        start = probe.x
    found = search_windows(model, start, options, share * seconds, on_improved)
    left = max(seconds - (time.perf_counter() - t0), 1.0)
    final = solve_mip(model, found.x, left, options)
    bounds = [b for b in (probe.bound, final.bound) if b is not None]
    bound = max(bounds) if bounds else None
    if final.x is not None and final.objective is not None and final.objective <= found.objective:
        return dataclasses.replace(final, bound=bound), found
    return MipResult(found.x, "feasible", found.objective, bound, final.hit_time_limit, final.engine), found
