"""A proof that a recompute-only plan peaks over a limit, without lowering it.

The built-in checkpointing baselines (``checkpoint-all``, ``chen-sqrt``,
``chen-greedy``: :mod:`libra_opt.solvers.baselines`) give one recompute
decision per storage over one window each.  Lowering such a plan and
simulating it costs a walk of every chain it runs: on a 1,000-node random
layered graph ``checkpoint-all``'s plan is 500,277 instructions (1.8 CPU s),
where ``libra``'s portfolio only needs to know that its peak is over the
least peak ``libra`` found (0.23 s of lowering until it passes it).
:class:`PeakProver` answers that question from a few chains: the memory at any instant
of the simulation is a lower bound on its peak, and the instants it looks at
are those of the chains the lowering would run before a few nodes, replayed
on their own.

What makes one chain replayable alone: under recompute decisions only (no
swap, no retention, no early regeneration: the baselines' plans), whether a
tensor is resident before node ``i``'s chain is a closed-form function of
``i`` (``PeakProver._missing_at``), the rule of
:class:`~libra_opt.passes.lowering._Lowerer`:

- produced before ``i`` and read at or after ``i`` (a step output: always
  after its producer; a base read for the last time is freed even where a
  view keeps its storage), and
- not inside its storage's eviction window ``(a, b)`` (``a < i <= b``: every
  tensor on it is freed after ``a``; a chain inside the window that reads it
  drops it again, and node ``b``'s chain brings back what ``b`` reads),
- except between a window's end ``b`` and the tensor's first read at or
  after it where ``b`` does not read it (Chen's segment windows, or a view
  ``b`` does not read): there it is resident only if some chain since ``b``
  made it.  Such a query makes the prover give up that chain (it proves
  nothing from it).

With that, the chain is :func:`~libra_opt.passes.regeneration.regeneration_steps`'
walk, as the lowering runs it.  The memory counted at each of its steps is
what is surely resident then, per storage (a view owns no bytes; a storage
is allocated by the first tensor made on it): the storages resident before
the chain, those of the tensors the chain made that a later step or the
node still reads (the drop rule frees a tensor only once no read is
pending), and the step's workspace (the simulator's ``Compute``: outputs
allocated at its start, workspace on top).  It leaves out what the lowering
may also hold (outputs recomputed while resident, made tensors not yet
dropped), so it is never above the simulated memory at that instant: over
1,131 random recompute plans (random layered, pattern and fuzz graphs, some
with views), 64 on ``problems/``'s CPU-profiled models and 1,429 baseline
plans (the shared graphs, ``problems/`` but its two largest, fuzz
problems), none is; on the baselines' plans of random layered graphs the
largest chain value equals the simulated peak.

Source: the regeneration rule of Checkmate's plan generation (Jain et al.,
MLSys 2020, sec. 4.5) as :mod:`libra_opt.passes.regeneration` states it; the
simulator's memory rules (:mod:`libra_opt.passes.simulator`).
"""
from __future__ import annotations

import bisect
from typing import Callable, Mapping

import numpy as np

from libra_opt.ir.problem import RematProblem
from libra_opt.passes.lowering import Policy
from libra_opt.passes.regeneration import regeneration_steps

__all__ = ["PeakProver"]


class _Unknown(Exception):
    """A chain asks about a tensor whose residency the prover cannot tell (or needs a node that cannot run
    again): that chain proves nothing."""


class PeakProver:
    """Proves that the plan the lowering makes of ``decisions`` over
    ``windows`` peaks over a limit, by replaying a few of its chains.

    Parameters
    ----------
    problem : RematProblem
    decisions : mapping of int to Policy
        Storage -> policy (``KEEP`` or ``RECOMPUTE``), as given to
        :func:`~libra_opt.passes.lowering.evictions_for`.
    windows : mapping of int to (int, int)
        Storage -> its eviction window ``(after, before)`` (positions); a
        storage recomputed is evicted over its window (one per storage).

    Attributes
    ----------
    applicable : bool
        Whether the prover can say anything: no decision swaps.  Where it is
        ``False``, :meth:`over` is always ``False``.
    known_bytes : int
        The most memory found at an instant of the plan so far (bytes; 0
        before any proof was asked for): a lower bound on its simulated peak.
        The first proof counts every node's own run (what is resident before
        it, its outputs and workspace), then the chains replayed.

    Methods
    -------
    over(limit) -> bool
        ``True`` only where the plan's simulated peak is surely over
        ``limit`` bytes.

    Cost: the surely-resident bytes before every node (one pass over the
    tensors, on first use), then one chain replay per node that reads an
    evicted tensor, in two orders taken in turn (by an upper bound on what a
    replay finds, and by the bytes resident before the chain), until one is
    over the limit, none left can be, :attr:`MAX_CHAINS` chains were
    replayed or :attr:`STEPS_PER_NODE` times the node count of chain steps
    (over every call).  On the 1,000-node random layered graph
    ``checkpoint-all``'s plan is proven over ``libra``'s least peak from its
    first chain (0.003-0.01 CPU s, where lowering it that far takes 0.23 s).
    """

    #: chain steps the prover replays at most, per node of the problem, over all calls
    STEPS_PER_NODE = 8
    #: chains the prover replays at most, over all calls: where a plan peaks under the limit asked, every
    #: replay is lost (ViT-B's checkpointing plans: 167 chains, 5 ms each plan).  ``checkpoint-all``'s plans
    #: of the random layered graphs, the shared ones and ResNet-50 are proven over 0.95 of their peak within
    #: 25 chains, and over the no-remat peak (the random layered ones) within 6
    MAX_CHAINS = 32

    def __init__(self, problem: RematProblem, decisions: Mapping[int, Policy],
                 windows: Mapping[int, tuple[int, int]]):
        # the problem's tables, not the problem: a prover is kept in them (``baselines._prover``), and they
        # hold their problem weakly so that they never keep it alive
        self._tb = tb = problem.tables
        self.applicable = all(p != Policy.SWAP for p in decisions.values())
        self._evicted = {s: (int(windows[s][0]), int(windows[s][1])) for s, p in decisions.items()
                         if p == Policy.RECOMPUTE and s in windows} if self.applicable else {}
        self.known_bytes = 0
        self._base: np.ndarray | None = None
        self._order: list[int] | None = None
        self._next = 0                   # index into _order of the next chain to replay
        self._chains = 0                 # chains replayed so far
        self._steps_left = self.STEPS_PER_NODE * problem.num_nodes
        self._reread: dict[int, int] = {}   # tensor of an evicted storage -> its first read from the window's end on

    @property
    def problem(self) -> RematProblem:
        """The problem (``ReferenceError`` where it no longer exists)."""
        return self._tb.problem

    # ------------------------------------------------------------------ rule
    def _build(self) -> None:
        """The surely-resident bytes before each node's chain (``_base``,
        int64 of shape ``(N,)``) and the order the chains are replayed in."""
        tb = self._tb
        N = tb.N
        nb, act, out, last, prod, cons = tb.t_nbytes, tb.t_act, tb.t_out, tb.t_last_read, tb.t_prod, tb.t_cons
        for s, (a, b) in self._evicted.items():   # each tensor's first read from its window's end on
            for t in tb.views[s]:
                k = bisect.bisect_left(cons[t], b)
                self._reread[t] = cons[t][k] if k < len(cons[t]) else b
        d = np.zeros(N + 1, dtype=np.int64)
        for s, ts in tb.views.items():
            if not act[s] or not nb[s]:   # a graph input's storage (fixed memory), or no bytes
                continue
            w = self._evicted.get(s)
            spans = []   # where some tensor of the storage is surely resident before a node's chain
            for t in ts:
                lo, hi = prod[t] + 1, N - 1 if out[t] else last[t]
                if w is None:
                    spans.append((lo, hi))
                else:   # off after a, and until its first read from b on (it may come back sooner)
                    spans += [(lo, min(hi, w[0])), (max(lo, self._reread[t] + 1), hi)]
            end = -1
            for lo, hi in sorted(x for x in spans if x[0] <= x[1]):   # their union, once per storage
                lo = max(lo, end + 1)
                if lo <= hi:
                    d[lo] += nb[s]
                    d[hi + 1] -= nb[s]
                    end = hi
        self._base = np.cumsum(d[:N])
        outs = np.array([sum(nb[t] for t in o) for o in tb.n_outputs], dtype=np.int64)
        ws = np.array(tb.n_ws, dtype=np.int64)
        # each node's own run (no chain counted): what is resident before it, its outputs and its workspace
        self.known_bytes = max(self.known_bytes, int((self._base + outs + ws).max(initial=0)))
        # the most a replay of node i's chain can find: every activation produced before i, once, node i's
        # outputs and the largest workspace up to i; none whose bound is at or under a limit is replayed for it
        self._upper = np.cumsum(outs) + np.maximum.accumulate(ws)
        # the nodes with a chain: a node reads a tensor off the device only at its first read from the end
        # of the tensor's window on (no use lies inside a window)
        points = set(self._reread.values())
        # replayed in two orders taken in turn: by that bound (on a single-phase graph the last nodes'
        # chains recompute nearly the whole graph) and by the bytes resident before the chain (on a
        # two-phase graph the first backward nodes hold the forward's activations)
        by_upper = sorted(points, key=lambda i: (-int(self._upper[i]), i))
        by_base = sorted(points, key=lambda i: (-int(self._base[i]), i))
        seen: set[int] = set()
        self._order = [i for pair in zip(by_upper, by_base) for i in pair if not (i in seen or seen.add(i))]
        # the bound's largest from each index of the order on
        self._rest_upper = np.maximum.accumulate(self._upper[self._order][::-1])[::-1]

    def _missing_at(self, i: int) -> Callable[[int], bool]:
        """The residency rule before node ``i``'s chain (see the module
        docstring): ``missing(t)`` is whether tensor ``t`` is off the device
        there; it raises ``_Unknown`` where the prover cannot tell."""
        tb = self._tb
        act, out, last, prod, sto = tb.t_act, tb.t_out, tb.t_last_read, tb.t_prod, tb.t_storage
        evicted, reread = self._evicted.get, self._reread

        def missing(t: int) -> bool:
            if not act[t]:
                return False
            if prod[t] >= i or (last[t] < i and not out[t]):
                return True
            w = evicted(sto[t])
            if w is not None:
                if w[0] < i <= w[1]:
                    return True
                if w[1] < i <= reread[t]:
                    raise _Unknown
            return False
        return missing

    def chain_bytes(self, i: int) -> int | None:
        """The most memory surely held at an instant of node ``i``'s chain or
        of node ``i`` itself (bytes), or ``None`` where node ``i`` needs no
        chain or the prover cannot replay it (a residency it cannot tell, or
        a node that cannot run again: the lowering refuses such a plan)."""
        if self._base is None:
            self._build()
        tb = self._tb
        n_in, n_out, nb, ws, prod, recomp = tb.n_inputs, tb.n_outputs, tb.t_nbytes, tb.n_ws, tb.t_prod, tb.n_recomp
        act, sto, views = tb.t_act, tb.t_storage, tb.views
        is_missing = self._missing_at(i)
        pre: dict[int, bool] = {}    # storage -> allocated before the chain (some tensor on it resident)
        refs: dict[int, int] = {}    # storage -> tensors on it the chain made that are still counted

        def allocated_before(s: int) -> bool:
            v = pre.get(s)
            if v is None:
                v = pre[s] = not all(is_missing(u) for u in views[s])
            return v
        needed = n_in[i]
        try:
            missing = [t for t in needed if is_missing(t)]
            if not missing:
                return None
            steps, pending = regeneration_steps(needed, missing, is_missing, None, prod, n_in)
            self._steps_left -= len(steps)
            base = int(self._base[i])
            made: set[int] = set()   # tensors the chain made that are still counted
            cur = best = 0           # bytes of the storages the chain allocated that are still counted
            for _, x in steps:
                new = [t for t in n_out[x] if t not in made and is_missing(t)]
                if not new:
                    continue   # the lowering skips a node whose outputs are all resident
                if not recomp[x]:
                    raise _Unknown   # the lowering refuses the plan
                for t in new:   # allocated at the step's start where no tensor holds the storage yet
                    made.add(t)
                    s = sto[t]
                    if act[s] and nb[s]:
                        if not refs.get(s) and not allocated_before(s):
                            cur += nb[s]
                        refs[s] = refs.get(s, 0) + 1
                best = max(best, cur + ws[x])
                for u in n_in[x]:
                    pending[u] -= 1
                for u in (*n_in[x], *new):
                    if u in made and not pending.get(u, 0):
                        made.discard(u)
                        s = sto[u]
                        if act[s] and nb[s]:
                            refs[s] -= 1
                            if not refs[s] and not allocated_before(s):
                                cur -= nb[s]
        except _Unknown:
            return None
        best = max(best, cur + sum(nb[t] for t in n_out[i]) + ws[i])   # node i: its inputs, its outputs
        return base + best

    # ----------------------------------------------------------------- proof
    def over(self, limit: int) -> bool:
        """Whether the plan's simulated peak is surely over ``limit`` (bytes):
        some instant found (:meth:`chain_bytes`) holds more.  ``False``
        means not proven (the peak may be over it or not)."""
        if not self.applicable:
            return False
        if self.known_bytes > limit:
            return True
        if self._base is None:
            self._build()
            if self.known_bytes > limit:
                return True
        order = self._order
        while self._next < len(order) and self._steps_left > 0 and self._chains < self.MAX_CHAINS:
            if self._rest_upper[self._next] <= limit:   # no chain left can hold more than the limit
                return False
            i = order[self._next]
            self._next += 1
            if self._upper[i] <= limit:
                continue
            self._chains += 1
            got = self.chain_bytes(i)
            if got is not None and got > self.known_bytes:
                self.known_bytes = got
                if got > limit:
                    return True
        return False
