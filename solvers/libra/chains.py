"""Recomputation chains of the ``libra`` estimate: what the lowering runs
before a node that reads evicted tensors, replayed on the model's state.

:meth:`ChainReplay.chain_at` mirrors ``lowering._Lowerer._regenerate``: the
same post-order over the missing tensors, the same choice between recomputing
and swapping in (a base storage with a swap decision comes back by swap), the
same freeing of chain temporaries, and the simulator's memory rules (outputs
allocated at compute start, already-resident outputs and workspace transient).

Source: Checkmate's plan generation (Jain et al., MLSys 2020, sec. 4.5) for
recomputation with freeing, as implemented by :mod:`libra_opt.lowering`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .codes import ARRIVING, LIVE, MISSING


@dataclass(frozen=True)
class Chain:
    """The recomputation chain run before one regeneration point.

    Attributes
    ----------
    nodes : tuple of int
        Nodes recomputed, in order.
    time_s : float
        Recompute time plus synchronous swap-in time (s).
    peak_bytes : int
        Peak memory of the chain above what was resident before it (bytes).
    kept_bytes : int
        Bytes the chain allocated that are still resident when the node runs.
    touched : frozenset of int
        Storages the chain reads or regenerates.
    feasible : bool
        False when the chain needs to recompute a non-recomputable node.
    waits : tuple of (int, float)
        Swapped storages whose in-flight swap-in the chain waits for, with the
        chain time before that wait (s).
    made : tuple of int
        Tensors the chain makes resident (recomputed or swapped in).
    """

    nodes: tuple
    time_s: float
    peak_bytes: int
    kept_bytes: int
    touched: frozenset
    feasible: bool = True
    waits: tuple = ()
    made: tuple = ()


class ChainReplay:
    """Mixin of :class:`~libra_opt.solvers.libra_estimate.Timeline`: recomputation chains."""

    def chain_at(self, q: int) -> Chain | None:
        """The recomputation chain before node ``q`` under the current (or
        hypothetical) decisions; ``None`` if node ``q`` needs nothing.  Mirrors
        ``lowering._Lowerer._regenerate``."""
        st = self._st
        n_inputs = self.n_inputs
        needed = n_inputs[q]
        if q in self.early_at:
            extra = self.early_targets(q)
            if extra:
                needed = (*needed, *extra)
        cache: dict[int, int] = {}     # tensor -> state before this chain
        missing = []
        for t in needed:
            v = cache[t] = st(t, q)
            if v != LIVE:
                missing.append(t)
        if not missing:
            return None
        tsto = self.t_storage
        t_prod = self.t_prod
        has_swap = self._has_swap
        state: dict[int, int] = {}
        order: list[tuple[bool, int]] = []   # (is_swap, tensor or node)
        stack = [(t, False) for t in reversed(missing)]
        swapped: dict[int, bool] = {}  # tensor -> comes back by swap-in (else by recomputation)

        def stc(t):
            v = cache.get(t)
            if v is None:
                v = cache[t] = st(t, q)
            return v

        while stack:
            t, done = stack.pop()
            if done:
                order.append((True, t) if swapped[t] else (False, t_prod[t]))
                state[t] = 2
                continue
            if t in state:
                continue
            v = cache.get(t)
            if v is None:
                v = cache[t] = st(t, q)
            if v == LIVE:
                continue
            state[t] = 1
            stack.append((t, True))
            sw = swapped[t] = t == tsto[t] and (v == ARRIVING or has_swap(t))
            if not sw:
                for u in reversed(n_inputs[t_prod[t]]):
                    if u not in state:
                        v = cache.get(u)
                        if v is None:
                            v = cache[u] = st(u, q)
                        if v != LIVE:
                            stack.append((u, False))
        pending: dict[int, int] = {}
        steps = []
        seen = set()
        for sw, x in order:
            if not sw:
                if x in seen:
                    continue
                seen.add(x)
                for u in n_inputs[x]:
                    pending[u] = pending.get(u, 0) + 1
            steps.append((sw, x))
        for u in needed:
            pending[u] = pending.get(u, 0) + 1
        made: set[int] = set()
        resident: set[int] = set()      # tensors made resident by the chain (a subset of made)
        refs: dict[int, int] = {}       # storage -> chain-made resident tensors on it
        pre_alloc: dict[int, bool] = {}  # storage -> allocated before the chain
        touched = set()
        cur = peak = 0
        time_s = 0.0
        nodes = []
        waits = []
        feasible = True
        nb = self.t_nbytes
        t_out, t_act, views, last_eff = self.t_out, self.t_act, self.views, self.t_last_eff
        storage_off = self._storage_off
        n_outputs, n_recomp, n_time, n_ws = self.n_outputs, self.n_recomp, self.n_rtime, self.n_ws
        h2d, margin1 = self.h2d, 1.0 + self.margin

        def allocated_before(s):
            """Storage ``s`` was allocated before the chain (a tensor of it live, or, for an activation,
            arriving); cached in ``pre_alloc``, whose lookup the loop below does inline."""
            v = pre_alloc[s] = any(stc(u) == LIVE for u in views[s]) or (
                t_act[s] and any(stc(u) == ARRIVING for u in views[s]))
            return v

        # the closures of the earlier version (live / add / drop) are inlined below, and the cache lookup of
        # allocated_before: this loop runs for every candidate evaluation of the descents and the finish
        for sw, x in steps:
            if sw:
                if x in resident or stc(x) == LIVE:
                    continue
                if stc(x) == ARRIVING:   # waits for its prefetch in flight: allocated already
                    waits.append((x, time_s))
                    resident.add(x)
                    made.add(x)
                    touched.add(x)
                    refs[x] = refs.get(x, 0) + 1
                    new = ()
                else:
                    new = (x,)
            else:
                outs = n_outputs[x]
                new = []
                transient = n_ws[x]
                for t in outs:
                    if t in resident or stc(t) == LIVE:
                        transient += nb[t]
                    else:
                        new.append(t)
                if not new:
                    continue
                if not n_recomp[x]:
                    feasible = False
                nodes.append(x)
                time_s += n_time[x]
            for t in new:                    # add(t)
                resident.add(t)
                made.add(t)
                s = tsto[t]
                touched.add(s)
                r = refs.get(s, 0)
                if r == 0:
                    ab = pre_alloc.get(s)
                    if ab is None:
                        ab = allocated_before(s)
                    if not ab:
                        cur += nb[s]
                refs[s] = r + 1
            if sw:
                if new:   # a synchronous swap-in
                    time_s += nb[x] / h2d * margin1
                    peak = max(peak, cur)
                cands = (x,)
            else:
                peak = max(peak, cur + transient)
                ins = n_inputs[x]
                for u in ins:
                    pending[u] -= 1
                    if t_act[u]:
                        touched.add(tsto[u])
                cands = (*ins, *new)
            for t in cands:                  # drop(cands)
                if t in resident and pending.get(t, 0) == 0 and not t_out[t] and (
                        last_eff[t] <= q or storage_off(tsto[t], q)):
                    resident.discard(t)
                    s = tsto[t]
                    refs[s] -= 1
                    if refs[s] == 0:
                        ab = pre_alloc.get(s)
                        if ab is None:
                            ab = allocated_before(s)
                        if not ab:
                            cur -= nb[s]
        for t in missing:
            touched.add(tsto[t])
        return Chain(tuple(nodes), time_s, int(peak), int(cur), frozenset(touched), feasible, tuple(waits),
                     tuple(sorted(made)))
