"""A lower bound on the time a swap-only plan adds: what copying out allows.

Where a plan meets a budget with swaps only, at every node ``t`` whose
no-remat memory ``C0[t]`` is over the budget, at least ``C0[t] - budget``
bytes of storages evicted over ``t`` are off the device while ``t`` runs.
A swapped storage leaves the device when its copy out has ended, and its
copy cannot start before its producer has run; the device-to-host queue
copies one storage at a time at its bandwidth.  So those bytes are on the
host by the start of node ``t`` only if the queue, fed with every storage
evicted over ``t`` as soon as its producer ends (earliest first, a fluid
queue: a partial storage counts), has moved that many bytes by then; where
it cannot by the no-remat start of ``t``, the compute stream has waited at
least the difference (stalls delay every later node: nothing makes up for
them).  The bound is the largest such wait over the nodes it looks at.

It holds for the plans of the simulator (:mod:`libra_opt.passes.simulator`:
a copy out starts when issued after its producer and the queue is free, a
storage is released once its copy has ended) over the eviction windows of
the timeline it is computed on, with no recomputation.  ``libra``'s hybrid
portfolio skips its swap-only descent at the budgets where this bound is
well above what the hybrid descent's plan costs (``LibraSolver``).

Source: the memory constraint of the rematerialization literature (Checkmate,
Jain et al., MLSys 2020, sec. 4) with the copy queues of offloading
schedules (Beaumont et al., "Efficient Combination of Rematerialization and
Offloading for Training DNNs", NeurIPS 2021, sec. 3: one copy at a time per
direction, a value offloaded only after it is computed); the fluid queue is
the usual relaxation of a single-machine schedule with release dates.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .estimate import Timeline

__all__ = ["swap_only_lower_bounds"]

#: nodes (those with the most no-remat memory over a budget) the bound looks at per budget: any set
#: of nodes gives a valid bound; the peak's neighbourhood is where copying out is tightest
BOUND_NODES = 24


def swap_only_lower_bounds(tl: Timeline, budgets: Sequence[int], nodes: int = BOUND_NODES) -> dict[int, float]:
    """Per budget (bytes), seconds that any swap-only plan over the eviction
    windows of ``tl`` that meets it adds at least (module docstring):
    ``inf`` where the windows over some node cannot free enough bytes,
    ``0.0`` where the budget is at or over the no-remat peak.

    ``tl``: a timeline of the problem (only its tables and windows are
    read: the no-remat memory ``C0`` (N,), start and end times (s), copy
    bandwidth (bytes/s), and each window's storage bytes, producer and
    range).  ``nodes``: how many of the nodes over each budget to look at,
    those with the most memory first (the bound is their largest wait).
    Cost: O(``nodes`` x W) per budget, W the number of windows.
    """
    pt, wt = tl.tables, tl.windows
    start = pt.cum[:-1]
    arrive = (start + pt.node_time)[wt.w_prod]   # each window's copy out may start when its producer ends
    order = np.argsort(arrive, kind="stable")
    arrive, lo, hi = arrive[order], wt.w_a[order], wt.orig_b[order]
    nbytes = wt.w_bytes[order].astype(np.float64)
    rate = float(pt.d2h)
    top = np.argsort(-pt.C0, kind="stable")
    out: dict[int, float] = {}
    for budget in budgets:
        over = top[:int(np.searchsorted(-pt.C0[top], -int(budget), side="left"))][:nodes]
        worst = 0.0
        for t in over.tolist():
            need = float(pt.C0[t] - int(budget))
            m = (lo < t) & (t < hi)
            a, b = arrive[m], nbytes[m]
            done = np.cumsum(b)
            k = int(np.searchsorted(done, need, side="left"))
            if k >= len(b):
                worst = np.inf
                break
            # fluid queue in arrival order: copy i ends at max over j <= i of (a_j + bytes j..i / rate)
            ends = done / rate + np.maximum.accumulate(a - (done - b) / rate)
            begin = max(ends[k - 1], a[k]) if k else a[0]
            worst = max(worst, begin + (need - (done[k] - b[k])) / rate - float(start[t]))
        out[int(budget)] = float(worst)
    return out
