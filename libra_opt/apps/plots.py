"""Plots of plans: memory timelines and budget/overhead curves.

matplotlib is imported lazily (Agg backend, no display needed) when a plot is
made, so importing libra_opt never needs it.

- :func:`plot_memory_timeline`: graph memory (bytes) against compute-stream
  time (s) for one or more simulated plans, as a step plot, with the budget
  as a horizontal line and the forward/backward boundary of each plan marked.
- :func:`plot_budget_curve`: for each method (solver), added step time (% of
  the no-remat step) against the memory budget (fraction of the no-remat
  peak, or bytes): the trade-off curve of Checkmate (Jain et al., MLSys 2020,
  fig. 5) and Libra's budget sweeps.

Source: matplotlib's ``Axes.step`` / ``Axes.plot`` / ``Axes.axhline`` /
``Axes.axvline`` API.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PlotError
from ..ir.problem import BACKWARD
from ..ir.schedule import Op

if TYPE_CHECKING:  # pragma: no cover
    from ..ir.problem import RematProblem
    from ..ir.schedule import Schedule
    from ..passes.simulator import SimulationResult

log = logging.getLogger(__name__)

__all__ = ["plot_memory_timeline", "plot_budget_curve", "PlotError"]

_BYTE_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))




def _matplotlib():
    from ..extras import require

    return require("matplotlib", "plot", "plotting")


def _figure(figsize: tuple[float, float]):
    """A figure rendered by the Agg canvas, made without pyplot: no global
    backend switch, no figure registry to leak into."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig, path: str | os.PathLike) -> None:
    """Write ``fig`` to ``path`` in the format its suffix names (matplotlib's
    ``savefig(format=...)``; no suffix: ``rcParams["savefig.format"]``) with
    :func:`~libra_opt.atomic.atomic_write`, so a failed write (an unknown
    format, a full disk) leaves the old file and no temporary file."""
    from ..atomic import atomic_write

    fmt = Path(path).suffix[1:].lower() or None
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format=fmt, dpi=120)


def _byte_unit(max_bytes: float) -> tuple[str, float]:
    name, scale = "B", 1
    for n, s in _BYTE_UNITS:
        if max_bytes >= s:
            name, scale = n, s
    return name, float(scale)


def _time_unit(max_s: float) -> tuple[str, float]:
    if max_s >= 1:
        return "s", 1.0
    if max_s >= 1e-3:
        return "ms", 1e-3
    return "us", 1e-6


def _normalise(results) -> list[tuple[str, "Schedule | None", "SimulationResult"]]:
    from ..passes.simulator import SimulationResult

    items = list(results.items()) if isinstance(results, Mapping) else [
        (f"plan {k}", v) for k, v in enumerate(results)]
    out = []
    for label, v in items:
        if isinstance(v, SimulationResult):
            out.append((str(label), None, v))
        elif isinstance(v, Sequence) and len(v) == 2 and isinstance(v[1], SimulationResult):
            out.append((str(label), v[0], v[1]))
        else:
            raise PlotError(f"plan {label!r}: expected (Schedule, SimulationResult) or a SimulationResult, "
                            f"got {type(v).__name__}")
    if not out:
        raise PlotError("no plans to plot: pass at least one (Schedule, SimulationResult)")
    return out


def _backward_start(problem: "RematProblem", schedule: "Schedule | None", result: "SimulationResult"):
    """Compute-stream time (s) of the first backward Compute, or None."""
    if schedule is None or problem.boundary >= len(problem.nodes):
        return None
    for k, ins in enumerate(schedule.instructions):
        if ins.op == Op.COMPUTE and problem.nodes[ins.arg].phase == BACKWARD:
            return float(result.timeline_t[k]) if k < len(result.timeline_t) else None
    return None


def plot_memory_timeline(problem: "RematProblem", results, path: str | os.PathLike,
                         budget_bytes: int | None = None, *, title: str | None = None) -> Path:
    """Step plot of graph memory against time for one or more plans.

    Parameters
    ----------
    problem : RematProblem
        The problem the plans were simulated on.
    results : dict of str to (Schedule, SimulationResult), or list of them
        One curve per plan; a list is labelled ``plan 0``, ``plan 1``, ...
        A bare :class:`SimulationResult` is accepted (no boundary marker).
    path : str or PathLike
        Output image (``.png``, ``.pdf``, ``.svg``: by matplotlib's suffix).
    budget_bytes : int, optional
        Draws a horizontal budget line (graph memory, bytes).
    title : str, optional
        Defaults to the problem's name.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    PlotError
        ``results`` is empty or holds something else.
    OutputPathError
        ``path`` cannot be written (a missing or read-only directory, a full
        disk); nothing is left behind.

    Notes
    -----
    x is :attr:`SimulationResult.timeline_t` (compute-stream time at each
    instruction, extended to the step's end ``time_s``), y is
    :attr:`SimulationResult.timeline_bytes` (graph memory, workspace
    included).  A dashed vertical line marks where each plan's first backward
    node starts.
    """
    plans = _normalise(results)
    max_b = max([float(r.timeline_bytes.max(initial=0)) for _, _, r in plans] + [float(budget_bytes or 0)])
    max_t = max(float(r.time_s) for _, _, r in plans)
    bunit, bscale = _byte_unit(max_b)
    tunit, tscale = _time_unit(max_t)
    fig, ax = _figure((9, 4.5))
    colors = _matplotlib().rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for k, (label, schedule, r) in enumerate(plans):
        color = colors[k % len(colors)]
        t = np.append(r.timeline_t, r.time_s) / tscale
        b = np.append(r.timeline_bytes, r.timeline_bytes[-1] if len(r.timeline_bytes) else 0) / bscale
        ax.step(t, b, where="post", color=color, lw=1.4,
                label=f"{label}: peak {r.peak_bytes / bscale:.3g} {bunit}, step {r.time_s / tscale:.4g} {tunit}")
        tb = _backward_start(problem, schedule, r)
        if tb is not None:
            ax.axvline(tb / tscale, color=color, ls="--", lw=0.9, alpha=0.8)
            ax.annotate("bwd", (tb / tscale, 1.0), xycoords=("data", "axes fraction"), color=color,
                        fontsize=8, ha="left", va="top", xytext=(2, -2 - 10 * k), textcoords="offset points")
    if budget_bytes is not None:
        ax.axhline(budget_bytes / bscale, color="black", ls=":", lw=1.2,
                   label=f"budget {budget_bytes / bscale:.3g} {bunit}")
    ax.set_xlabel(f"time ({tunit})")
    ax.set_ylabel(f"graph memory ({bunit})")
    ax.set_title(title if title is not None else f"{problem.name}: memory timeline")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    _save(fig, path)
    log.info("wrote memory timeline of %d plan(s) to %s", len(plans), path)
    return Path(path)


def _field(row: Any, *names: str):
    for n in names:
        v = row.get(n) if isinstance(row, Mapping) else getattr(row, n, None)
        if v is not None:
            return v
    return None


def plot_budget_curve(rows, path: str | os.PathLike, *, reference_bytes: int | None = None,
                      title: str | None = None) -> Path:
    """Added step time against memory budget, one curve per method.

    Parameters
    ----------
    rows : iterable of mapping or SolveResult
        One per (method, budget).  Read fields:

        - method: ``method`` or ``solver`` (str);
        - x: ``budget_fraction`` (fraction of the no-remat peak) if every row
          has it, else ``budget_bytes`` divided by ``reference_bytes`` when
          that is given, else ``budget_bytes`` in bytes;
        - y: ``added_pct`` (% of the no-remat step) if present, else
          ``100 * added_s / base_s`` with ``base_s`` the no-remat step time
          (s), read from ``base_s`` or derived as ``time_s - added_s``.

        Rows without a plan (``added_s`` and ``added_pct`` missing or
        ``None``: infeasible budgets) are skipped.
    path : str or PathLike
        Output image.
    reference_bytes : int, optional
        The no-remat peak (bytes) that budgets are divided by.
    title : str, optional

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    PlotError
        No row with a plan, or a row without a method, a budget or a step time.
    """
    rows = list(rows)
    use_fraction = bool(rows) and all(_field(r, "budget_fraction") is not None for r in rows)
    curves: dict[str, list[tuple[float, float]]] = {}
    for k, r in enumerate(rows):
        method = _field(r, "method", "solver")
        if method is None:
            raise PlotError(f"row {k} has no 'method' (or 'solver')")
        y = _field(r, "added_pct")
        if y is None:
            added = _field(r, "added_s")
            if added is None:
                continue  # no plan at this budget
            base = _field(r, "base_s")
            if base is None:
                time_s = _field(r, "time_s")
                if time_s is None:
                    raise PlotError(f"row {k} ({method}) has added_s but neither base_s nor time_s")
                base = time_s - added
            if base <= 0:
                raise PlotError(f"row {k} ({method}): the no-remat step time is {base} s; cannot make a %")
            y = 100.0 * added / base
        if use_fraction:
            x = float(_field(r, "budget_fraction"))
        else:
            bb = _field(r, "budget_bytes")
            if bb is None:
                raise PlotError(f"row {k} ({method}) has neither budget_fraction nor budget_bytes")
            x = float(bb) / reference_bytes if reference_bytes else float(bb)
        curves.setdefault(str(method), []).append((x, float(y)))
    if not curves:
        raise PlotError("no row has a plan (added_s / added_pct): nothing to plot")
    relative = use_fraction or bool(reference_bytes)
    unit, scale = ("", 1.0) if relative else _byte_unit(max(x for c in curves.values() for x, _ in c))
    fig, ax = _figure((7, 4.5))
    for method, pts in curves.items():
        pts.sort()
        xs = np.array([p[0] for p in pts]) / scale
        ax.plot(xs, [p[1] for p in pts], marker="o", ms=3.5, lw=1.4, label=method)
    ax.set_xlabel("memory budget (fraction of the no-remat peak)" if relative else f"memory budget ({unit})")
    ax.set_ylabel("added step time (% of the no-remat step)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    log.info("wrote budget curve of %d method(s) to %s", len(curves), path)
    return Path(path)
