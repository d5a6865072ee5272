"""A hybrid descent continued from the end of a recompute-only descent.

Just under the least memory recomputation alone reaches, the hybrid
portfolio's descents start from the keep-everything plan: the hybrid one
swaps early and stalls out above the budget, and the descents that wait
for copies out meet it by swapping most of what they evict, paying the
copies (``random_layered_graph(100, seed=0)`` with copies 4x slower than
compute, at 0.995 of the recompute-only reach, 0.692 of its peak: 0.50 of
the compute time added, waiting for copies out).
The plan a budget just under that reach wants is the recompute-only plan
with a few swaps on top: :class:`ContinuedRefiner` is a hybrid descent that
starts where a recompute-only descent of the same solve ended (its
timeline, decision records, step and evaluation counts), so every further
move may swap or recompute (the same example: 0.089 of the compute time
added).

``LibraSolver._continued`` runs one from the lowest recompute-only end
for the budgets no recompute-only descent reaches, and, where some descent
of the solve meets the budget, one from each other end too (different
ends lead to different swaps: ``random_layered_graph(100, seed=2)`` with
copies as slow as compute, at 0.9 of its recompute-only reach, 120,312 ->
67,444 against the solve without them).

Source: Libra (Wang, NTHU 2024), greedy refinement with a hybrid
recompute / swap policy, here started from a recompute-only descent's end
instead of the keep-everything plan (our own addition, measured by
``benchmarks/continued_gain.py``).
"""
from __future__ import annotations

import dataclasses

from libra_opt.ir.problem import RematProblem

from .refine import Refiner

__all__ = ["ContinuedRefiner"]


class ContinuedRefiner(Refiner):
    """A hybrid descent (the options of ``source`` with ``policy="hybrid"``)
    that starts at the end of the recompute-only descent ``source``
    (:meth:`Refiner.final`: its timeline, decision records, step and
    evaluation counts), not from the keep-everything plan.

    Its moves do not depend on the budgets it is asked for (as any
    descent's), so single solves and ``solve_many`` take the same
    snapshots.  It keeps no checkpoints (:meth:`Refiner.rewind` answers
    ``False``: a tightening round builds a new one, a few steps from the
    source's kept end).  Its plans are named ``"hybrid-continued"`` in
    ``extras["descent"]``.

    Parameters
    ----------
    problem : RematProblem
    source : Refiner
        A recompute-only descent of the same problem that ran to its end
        (``done``, not cut short); its window mode and swap overlap margin
        are this descent's.

    Raises
    ------
    ValueError
        ``source`` is not a recompute-only descent that ran to its end.
    """

    #: the name of its plans in ``extras["descent"]`` (``"+switch"`` and the like may follow)
    LABEL = "hybrid-continued"

    def __init__(self, problem: RematProblem, source: Refiner):
        if source.opts.policy != "recompute" or not source.done or source.cut_short:
            raise ValueError("a continued descent starts from the end of a recompute-only descent that ran to "
                             f"its end (got policy {source.opts.policy!r}, done={source.done}, "
                             f"cut short={source.cut_short})")
        super().__init__(problem, dataclasses.replace(source.opts, policy="hybrid"))
        self.start_from(source)
        self.source = source

    @property
    def label(self) -> str:
        """:attr:`LABEL`: the name its plans get in ``extras["descent"]``."""
        return self.LABEL
