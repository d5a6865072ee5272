"""Graph coarsening: a smaller :class:`~libra_opt.problem.RematProblem` for
solvers whose model grows with the square of the node count (Checkmate's MILP
has O(n^2) variables), and the map back to the original.

:func:`coarsen` merges runs of consecutive nodes (in eager order) into coarse
nodes until at most ``target_nodes`` remain.  Greedy: the adjacent pair of
segments whose merge has the smallest score is merged first.  The score of a
merged segment is its compute time plus its *footprint* (the bytes resident
while it runs as one node: storages it reads from earlier nodes, storages it
owns that are needed after it, and its largest single allocation), each
relative to its per-node share of the total, plus a small count term.  So
views and other free ops fold into their neighbours first, and no coarse node
gets a footprint that would raise the smallest feasible budget much.  The
score is multiplied by 0.75 for two segments of the same ``node.module`` and
by 4 when merging would make a recomputable segment non-recomputable.
Segments never cross the forward/backward boundary.

A coarse node = its members run in order.  Its outputs are the members'
tensors read outside it or returned by the step, grouped per storage (one
coarse tensor per storage, so storages stay exact: it owns the storage's
bytes when the coarse node owns the storage, else it is a view of the
owner's coarse tensor); tensors used only inside it are internal
temporaries, freed right after their last use inside it, and its
``workspace_bytes`` is the peak of those temporaries plus the members'
workspace.  Recomputing a coarse node recomputes all its members.  Hence the
coarse problem's memory accounting is never below the original's for the
expanded plan: :meth:`CoarseProblem.expand` gives a plan the simulator
accepts within any budget the coarse plan met.

Source: segment-level rematerialization as in Chen et al., *Training Deep
Nets with Sublinear Memory Cost* (2016, sec. 4) and the node grouping that
Checkmate (Jain et al., MLSys 2020, sec. 6) and Rockmate (Zhao et al., ICML
2023) apply to keep their solvers tractable; the greedy merge is our own.
"""
from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field

from libra_opt.ir.problem import INPUT, Node, RematProblem, Tensor
from libra_opt.ir.schedule import Compute, Free, Instr, Op, Schedule

log = logging.getLogger(__name__)

__all__ = ["coarsen", "CoarseProblem"]


@dataclass(frozen=True, eq=False)
class CoarseProblem:
    """A coarsened problem and the map back to the original.

    Attributes
    ----------
    problem : RematProblem
        The coarse problem (valid IR: nodes in a topological order, storages
        and views as in the original).
    original : RematProblem
    groups : tuple of tuple of int
        ``groups[g]``: original node ids of coarse node ``g``, in eager order
        (consecutive).
    tensor_map : tuple of tuple of int
        ``tensor_map[c]``: original tensor ids coarse tensor ``c`` stands for
        (one graph input, or every tensor a coarse node exports on one
        storage; they are produced and freed together).
    internal_frees : tuple of tuple of tuple of int
        ``internal_frees[g][k]``: original tensors to free right after the
        ``k``-th member of group ``g`` (its internal temporaries).
    """

    problem: RematProblem
    original: RematProblem
    groups: tuple
    tensor_map: tuple
    internal_frees: tuple = field(repr=False)

    @property
    def num_nodes(self) -> int:
        """Number of coarse nodes."""
        return self.problem.num_nodes

    def expand(self, schedule: Schedule) -> Schedule:
        """A plan for the original problem from a plan for the coarse one.

        ``Compute(g)`` becomes the members' ``Compute`` in order with the
        ``Free`` of internal temporaries after their last use; ``Free(c)``
        frees every original tensor ``c`` stands for; swap instructions are
        mapped back when ``c`` stands for one original tensor.

        Parameters
        ----------
        schedule : Schedule
            A plan on :attr:`problem`.

        Returns
        -------
        Schedule
            A plan on :attr:`original`; ``meta`` is copied and records the
            coarsening under ``"coarsened"``.

        Raises
        ------
        ValueError
            A swap instruction on a coarse tensor that stands for several
            original tensors.
        """
        out: list[Instr] = []
        tmap = self.tensor_map
        for ins in schedule:
            if ins.op == Op.COMPUTE:
                for member, frees in zip(self.groups[ins.arg], self.internal_frees[ins.arg]):
                    out.append(Compute(member))
                    out.extend(Free(x) for x in frees)
            elif ins.op == Op.FREE:
                out.extend(Free(x) for x in tmap[ins.arg])
            else:
                originals = tmap[ins.arg]
                if len(originals) != 1:
                    raise ValueError(f"cannot expand {ins!r}: coarse tensor {ins.arg} stands for original tensors "
                                     f"{list(originals)}; swaps are only expanded for coarse tensors that stand "
                                     f"for one original tensor")
                out.append(Instr(ins.op, originals[0]))
        meta = dict(schedule.meta)
        meta["coarsened"] = {"coarse_nodes": self.problem.num_nodes, "original_nodes": self.original.num_nodes}
        return Schedule(out, meta)

    def group_of(self) -> list[int]:
        """Coarse node id of every original node."""
        out = [0] * self.original.num_nodes
        for g, members in enumerate(self.groups):
            for m in members:
                out[m] = g
        return out


def _segments(problem: RematProblem, target: int) -> list[tuple[int, int]]:
    """Greedy merge of consecutive nodes into at most ``target`` segments
    ``[start, end)`` (fewer merges if the phase boundary prevents it)."""
    nodes = problem.nodes
    n = len(nodes)
    tensors = problem.tensors
    if n <= target:
        return [(i, i + 1) for i in range(n)]
    out = problem.output_set
    # storage -> last node that needs it (n for step outputs); owned bytes per node
    storage_last = {}
    for t in tensors:
        last = n if t.id in out else (t.consumers[-1] if t.consumers else -1)
        storage_last[t.storage] = max(storage_last.get(t.storage, -1), last)
    owned = [[(y, tensors[y].nbytes) for y in nd.outputs if tensors[y].storage == y] for nd in nodes]
    reads = [[(tensors[x].storage, tensors[tensors[x].storage].nbytes, tensors[tensors[x].storage].producer)
              for x in nd.inputs if tensors[x].kind != INPUT] for nd in nodes]
    alloc = [nd.workspace_bytes + sum(b for _, b in owned[i]) for i, nd in enumerate(nodes)]

    def footprint(a: int, c: int) -> int:
        """Bytes resident while segment [a, c) runs as one node: storages it
        reads from before ``a``, storages it owns that are needed after it,
        and its largest single allocation."""
        ins: dict[int, int] = {}
        for m in range(a, c):
            for st, b, prod in reads[m]:
                if prod is not None and prod < a:
                    ins[st] = b
        outs = sum(b for m in range(a, c) for y, b in owned[m] if storage_last[y] >= c)
        return sum(ins.values()) + outs + max(alloc[a:c])

    time = [nd.time_s for nd in nodes]
    single_fp = [footprint(i, i + 1) for i in range(n)]
    t_ref = max(sum(time) / target, 1e-30)
    f_ref = max(sum(single_fp) / target, 1e-30)
    c_ref = n / target
    start = list(range(n))
    end = [i + 1 for i in range(n)]
    prev = [i - 1 for i in range(n)]
    nxt = [i + 1 if i + 1 < n else -1 for i in range(n)]
    seg_time = list(time)
    seg_count = [1] * n
    seg_rec = [nd.recomputable for nd in nodes]
    seg_module = [nd.module for nd in nodes]
    version = [0] * n
    alive = [True] * n

    def score(a: int, b: int) -> float | None:
        if nodes[start[a]].phase != nodes[start[b]].phase:
            return None
        s = ((seg_time[a] + seg_time[b]) / t_ref + footprint(start[a], end[b]) / f_ref
             + 0.05 * (seg_count[a] + seg_count[b]) / c_ref)
        if seg_module[a] and seg_module[a] == seg_module[b]:
            s *= 0.75
        if seg_rec[a] != seg_rec[b]:
            s *= 4.0
        return s

    heap: list[tuple[float, int, int, int, int]] = []

    def push(a: int) -> None:
        b = nxt[a]
        if b < 0:
            return
        sc = score(a, b)
        if sc is not None:
            heapq.heappush(heap, (sc, a, b, version[a], version[b]))

    for a in range(n - 1):
        push(a)
    count = n
    while count > target and heap:
        _, a, b, va, vb = heapq.heappop(heap)
        if not (alive[a] and alive[b]) or version[a] != va or version[b] != vb or nxt[a] != b:
            continue
        end[a] = end[b]
        seg_time[a] += seg_time[b]
        seg_count[a] += seg_count[b]
        seg_rec[a] = seg_rec[a] and seg_rec[b]
        if seg_module[a] != seg_module[b]:
            seg_module[a] = ""
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[b] >= 0:
            prev[nxt[b]] = a
        version[a] += 1
        count -= 1
        push(a)
        if prev[a] >= 0:
            push(prev[a])
    out_segs = []
    a = 0
    while a >= 0:
        out_segs.append((start[a], end[a]))
        a = nxt[a]
    return out_segs


def coarsen(problem: RematProblem, target_nodes: int) -> CoarseProblem:
    """Merge consecutive nodes into at most ``target_nodes`` coarse nodes.

    Parameters
    ----------
    problem : RematProblem
    target_nodes : int
        Upper bound on the coarse node count; it is not reached only when the
        phases force more (a segment never spans the forward/backward
        boundary, so at least one per phase remains).

    Returns
    -------
    CoarseProblem
        Coarse tensors: one per graph input, and one per (coarse node,
        storage) for the tensors a coarse node exports on that storage.  It
        is a base owning the storage's bytes when the coarse node owns the
        storage, else a view of the owner's coarse tensor; it stands for all
        those original tensors (``tensor_map``), which are freed together.

    Raises
    ------
    ValueError
        ``target_nodes`` is not a positive integer.
    """
    if isinstance(target_nodes, bool) or not isinstance(target_nodes, int) or target_nodes < 1:
        raise ValueError(f"target_nodes must be a positive integer, got {target_nodes!r}")
    p = problem
    tensors = p.tensors
    segs = _segments(p, target_nodes)
    group_of = [0] * p.num_nodes
    for g, (a, b) in enumerate(segs):
        for m in range(a, b):
            group_of[m] = g
    out = p.output_set

    def prod_group(x: int) -> int | None:
        pr = tensors[x].producer
        return None if pr is None else group_of[pr]

    exported = [False] * len(tensors)
    for t in tensors:
        if t.kind == INPUT:
            continue
        g = prod_group(t.id)
        if t.id in out or any(group_of[c] != g for c in t.consumers):
            exported[t.id] = True
    for t in tensors:  # a view exported from another group needs its storage's owner to export it too
        if t.kind != INPUT and exported[t.id] and t.storage != t.id and prod_group(t.storage) != prod_group(t.id):
            exported[t.storage] = True
    # coarse tensors: inputs, then one class per (group, storage) of exported tensors
    key_of: dict[int, tuple] = {}
    classes: dict[tuple, list[int]] = {}
    for t in tensors:
        if t.kind == INPUT:
            key = ("input", t.id)
        elif exported[t.id]:
            key = (prod_group(t.id), t.storage)
        else:
            continue
        key_of[t.id] = key
        classes.setdefault(key, []).append(t.id)
    keys = list(classes)  # ordered by the smallest original tensor id of each class
    cid = {k: i for i, k in enumerate(keys)}

    nodes: list[Node] = []
    internal_frees: list[tuple[tuple[int, ...], ...]] = []
    for g, (a, b) in enumerate(segs):
        members = list(range(a, b))
        ins: dict[int, None] = {}
        outs: dict[int, None] = {}
        for m in members:
            nd = p.nodes[m]
            for x in nd.inputs:
                if prod_group(x) != g:
                    ins[cid[key_of[x]]] = None
            for y in nd.outputs:
                if exported[y]:
                    outs[cid[key_of[y]]] = None
        work, frees = _internal(p, members, exported, group_of, g)
        internal_frees.append(frees)
        first, last = p.nodes[a], p.nodes[b - 1]
        modules = {p.nodes[m].module for m in members}
        nodes.append(Node(
            id=g, name=first.name if a + 1 == b else f"{first.name}..{last.name}",
            target=first.target if a + 1 == b else f"coarse[{b - a}]", phase=first.phase,
            time_s=float(sum(p.nodes[m].time_s for m in members)), workspace_bytes=int(work),
            recomputable=all(p.nodes[m].recomputable for m in members), inputs=tuple(ins), outputs=tuple(outs),
            module=modules.pop() if len(modules) == 1 else "",
            pointwise=all(p.nodes[m].pointwise for m in members)))  # a fused pointwise chain (libra_opt.costs)
    consumers: dict[int, list[int]] = {}
    for nd in nodes:
        for c in nd.inputs:
            consumers.setdefault(c, []).append(nd.id)
    new_tensors = []
    for k, key in enumerate(keys):
        members_t = classes[key]
        t = tensors[members_t[0]]
        if key[0] == "input":
            storage, nbytes, producer = k, t.nbytes, None
        else:
            g, s = key
            producer = g
            if prod_group(s) == g:
                storage, nbytes = k, tensors[s].nbytes
            else:
                storage, nbytes = cid[(prod_group(s), s)], 0
        name = t.name if len(members_t) == 1 else f"{t.name}+{len(members_t) - 1}"
        single = len(members_t) == 1
        new_tensors.append(Tensor(id=k, name=name, producer=producer, consumers=tuple(consumers.get(k, ())),
                                  storage=storage, nbytes=nbytes, kind=t.kind,
                                  shape=t.shape if single else None, dtype=t.dtype if single else None))
    coarse_outputs = list(dict.fromkeys(cid[key_of[o]] for o in p.outputs))
    coarse = RematProblem(nodes, new_tensors, coarse_outputs, fixed=p.fixed, device=p.device,
                          provenance=p.provenance, name=f"{p.name}/coarse{len(nodes)}", executor=p.executor)
    log.info("coarsened %s: %d -> %d nodes, %d -> %d tensors", p.name, p.num_nodes, len(nodes), len(tensors),
             len(new_tensors))
    return CoarseProblem(problem=coarse, original=p, groups=tuple(tuple(range(a, b)) for a, b in segs),
                         tensor_map=tuple(tuple(classes[k]) for k in keys), internal_frees=tuple(internal_frees))


def _internal(p: RematProblem, members: list[int], exported: list[bool], group_of: list[int],
              g: int) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """Peak of internal temporaries plus member workspace (bytes), and the
    internal tensors to free after each member.

    Internal tensors (made by a member, read only inside the group) are
    freed after their last use inside the group (right away if unused).  A
    storage the group owns costs bytes inside the group only if none of its
    tensors is exported (otherwise the coarse node's output pays for it)."""
    tensors = p.tensors
    last: dict[int, int] = {}
    for k, m in enumerate(members):
        for y in p.nodes[m].outputs:
            if not exported[y]:
                last[y] = k
    for k, m in enumerate(members):
        for x in p.nodes[m].inputs:
            if x in last:
                last[x] = max(last[x], k)
    frees: list[list[int]] = [[] for _ in members]
    for x, k in last.items():
        frees[k].append(x)
    pos = {m: k for k, m in enumerate(members)}
    storage_end: dict[int, int] = {}
    for m in members:
        for y in p.nodes[m].outputs:
            if tensors[y].storage == y and not any(exported[v] for v in p.storage_views[y]):
                storage_end[y] = max(last.get(v, pos[m]) for v in p.storage_views[y])
    alloc_at: dict[int, list[int]] = {}
    release_at: dict[int, list[int]] = {}
    for s, k in storage_end.items():
        alloc_at.setdefault(pos[tensors[s].producer], []).append(s)
        release_at.setdefault(k, []).append(s)
    cur = 0
    peak = 0
    for k, m in enumerate(members):
        cur += sum(tensors[s].nbytes for s in alloc_at.get(k, ()))
        peak = max(peak, cur + p.nodes[m].workspace_bytes)
        cur -= sum(tensors[s].nbytes for s in release_at.get(k, ()))
    return peak, tuple(tuple(sorted(f)) for f in frees)
