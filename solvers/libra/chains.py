"""Recomputation chains of the ``libra`` estimate: what the lowering runs
before a node that reads evicted tensors, replayed on the model's state.

:func:`chain_at` mirrors the lowering's on-demand regeneration
(``_Lowerer._regenerate`` in :mod:`libra_opt.passes.lowering`): the same
post-order over the missing tensors, the same choice between recomputing and
swapping in (a base storage with a swap decision comes back by swap), the same
freeing of chain temporaries, and the simulator's memory rules (outputs
allocated at compute start, already-resident outputs and workspace transient).

Everything here is a function of the static tables (``pt``: per problem,
``wt``: per window; :mod:`solvers/libra/tables.py
<libra_opt.solvers.libra.tables>`) and the timeline's state (``st``:
:class:`~libra_opt.solvers.libra.state.TimelineState`), read under the
state's hypothetical decision ``st.hyp`` (a
:class:`~libra_opt.solvers.libra.timeline_records.Hypothesis`, set while
``Timeline.evaluate`` replays): nothing here writes the state.

Source: Checkmate's plan generation (Jain et al., MLSys 2020, sec. 4.5) for
recomputation with freeing, as implemented by :mod:`libra_opt.passes.lowering`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable, NamedTuple

from .codes import ARRIVING, KEEP, LIVE, MISSING, REC, SWAP


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
        Storages the chain reads or regenerates, and every storage of an
        activation whose state its replay asked (an output of a recomputed
        node found resident among them): where a window of one of them
        changes over the chain's position, so may the chain (:func:`affected`).
    feasible : bool
        False when the chain needs to recompute a non-recomputable node.
    waits : tuple of (int, float)
        Swapped storages whose in-flight swap-in the chain waits for, with the
        chain time before that wait (s).
    made : tuple of int
        Tensors the chain makes resident (recomputed or swapped in).
    vals : tuple of int
        The chain's memory above where it starts at each step that allocates
        (a recomputation, with its workspace, or a synchronous swap-in), in
        order (bytes; ``peak_bytes`` is their maximum, or 0).
    seq : tuple of int
        Those steps' nodes (-1 for a swap-in): where a tensor retained only
        for this chain is read for the last time (:func:`held_rise`).
    asked : dict of int to int
        The tensors whose state the replay asked (:func:`state_reader`), with
        the answers, in the order asked: the only tensors whose last use the
        replay read (:func:`kept_by_retention`).  Not compared.
    """

    nodes: tuple
    time_s: float
    peak_bytes: int
    kept_bytes: int
    touched: frozenset
    feasible: bool = True
    waits: tuple = ()
    made: tuple = ()
    vals: tuple = ()
    seq: tuple = ()
    asked: dict = field(default_factory=dict, compare=False, repr=False)


def policy_of(st, j: int) -> int:
    """Policy of window ``j`` (``KEEP``, ``REC``, ``SWAP``), the hypothesis's if it is about ``j``."""
    h = st.hyp
    if h is not None and h.window == j:
        return h.policy
    return st.pol_l[j]


def windows_of(st, s: int):
    """Windows of storage ``s`` with a decision, the hypothesis's window included."""
    ws = st.s_win.get(s, ())
    h = st.hyp
    if h is not None and h.storage == s and h.window not in ws:
        return (*ws, h.window)
    return ws


def prefetch_pos(st, j: int) -> int:
    """Position after which swap window ``j``'s swap-in is issued (the hypothesis's swap layer's, if any)."""
    h = st.hyp
    if h is not None and h.prefetch is not None and j in h.prefetch:
        return h.prefetch[j]
    return st.pos[j]


def state_reader(pt, wt, st) -> Callable[[int, int], int]:
    """The tensor-state query of one state: ``read(t, q)``, the state of
    tensor ``t`` just before position ``q``'s chain: ``LIVE``, ``MISSING``
    (off the device: regenerate it) or ``ARRIVING`` (a swapped base storage
    whose swap-in was issued before ``q``); under the state's hypothesis
    (``st.hyp``) if any.  The tables and the state's fields are looked up
    once (a replay asks it for every tensor its walk reaches): the state
    must not change while ``read`` is used."""
    t_act, t_out, last_eff, t_storage = pt.t_act, pt.t_out, st.t_last_eff, pt.t_storage
    s_win, h, pol_l, w_a, w_hi = st.s_win.get, st.hyp, st.pol_l, wt.w_a_l, st.w_hi
    hw, hs, hpol = (h.window, h.storage, h.policy) if h is not None else (-1, -1, KEEP)

    def read(t: int, q: int) -> int:
        if not t_act[t]:
            return LIVE
        if not t_out[t] and last_eff[t] < q:
            return MISSING
        s = t_storage[t]
        ws = s_win(s, ())
        if hs == s and hw not in ws:
            ws = (*ws, hw)
        for j in ws:
            pol = hpol if j == hw else pol_l[j]
            if pol == KEEP:
                continue
            if w_a[j] < q <= w_hi[j].get(t, -1):
                if pol == SWAP and t == s and q > prefetch_pos(st, j):
                    return ARRIVING
                return MISSING
        return LIVE

    return read


def storage_off(wt, st, s: int, q: int) -> bool:
    """Storage ``s`` is meant to be off the device at the end of position
    ``q`` (the lowering's ``_is_off``): inside a recomputed window before
    its end, or a swapped one before its swap-in is issued."""
    w_a, w_b = wt.w_a_l, st.w_b
    for j in windows_of(st, s):
        pol = policy_of(st, j)
        if pol == REC and w_a[j] <= q <= w_b[j] - 1:
            return True
        if pol == SWAP and w_a[j] <= q <= prefetch_pos(st, j) - 1:
            return True
    return False


def has_swap(st, s: int) -> bool:
    """Some window of storage ``s`` is swapped (under the hypothesis, if any)."""
    ws = st.s_win.get(s)
    h = st.hyp
    pol_l = st.pol_l
    if h is not None and h.storage == s:
        return h.policy == SWAP or any(pol_l[j] == SWAP for j in ws or () if j != h.window)
    if ws:
        for j in ws:
            if pol_l[j] == SWAP:
                return True
    return False


def early_targets(st, q: int) -> list[int]:
    """Tensors regenerated before node ``q`` although it does not read
    them: those of recomputed windows that end early at ``q``
    (``st.w_early``, set by :mod:`.reshape`)."""
    js = st.early_at.get(q)
    if not js:
        return []
    out = []
    for j in sorted(js):
        e = st.w_early.get(j)
        if e is not None and e.at == q and st.w_b[j] == q and policy_of(st, j) == REC:
            out.extend(e.tensors)
    return out


def chain_at(pt, wt, st, q: int) -> Chain | None:
    """The recomputation chain before node ``q`` under the state's current
    (or hypothetical, ``st.hyp``) decisions; ``None`` if node ``q`` needs
    nothing.  Times in seconds (recompute times ``pt.n_rtime``, synchronous
    swap-ins at ``pt.h2d`` bytes/s times ``1 + wt.margin``), memory in
    bytes.  The walk, the pending reads and the drop rule are the lowering's
    (:mod:`libra_opt.passes.regeneration`); this counts bytes and seconds
    where the lowering emits instructions.

    A chain is a function of ``q``, the static tables and the answers to
    the state queries its replay asks (:func:`state_reader`,
    :func:`storage_off`, :func:`has_swap`, :func:`early_targets`, and
    whether a tensor's last use is at or before ``q``).  A chain replayed
    before is returned again where every query it asked gets the same answer
    now (:class:`ChainMemo`, ``st.memo``): the replay would ask the same
    queries in the same order and build the same chain."""
    h = st.hyp
    plain = st.n_swap == 0 and (h is None or h.policy != SWAP)   # nothing comes back by a swap-in
    memo = st.memo
    key = (q, plain)
    entries = memo.entries.get(key)
    if entries:
        # asked once for every entry: early_targets' answer (most entries of a position differ there) and
        # the state reader
        early, ts = tuple(early_targets(st, q)), state_reader(pt, wt, st)
        for e in entries:
            if _holds(pt, wt, st, q, e, early, ts):
                return e.chain
    return _replay(pt, wt, st, q, plain, memo, key)


def kept_by_retention(pt, wt, st, ch: Chain, q: int, t: int, was_last: int) -> bool:
    """Whether chain ``ch``, replayed before position ``q`` while tensor
    ``t``'s last use (``st.t_last_eff[t]``) was ``was_last``, is what a
    replay gives now that only that last use has moved (a retention,
    :func:`~libra_opt.solvers.libra.reshape.retain`).  A replay reads a
    tensor's last use only for the tensors whose state it asks (the state
    query, and the drop rule on the tensors it makes, which it asks first):
    the chain stands where it did not ask ``t``, or where ``t``'s state and
    the drop rule's test on it (last use at or before ``q``) answer as
    before."""
    v = ch.asked.get(t)
    if v is None:
        return True
    now = st.t_last_eff[t]
    return (now <= q) == (was_last <= q) and state_reader(pt, wt, st)(t, q) == v


#: queries a :class:`ChainMemo` holds at most (then it is emptied; with the chains they keep, a few MB): at
#: 500,000 the memos of a random layered n1000 solve at 0.5 raised its peak RSS from 128 to 183 MB; at
#: 100,000 it is 127 MB and the solve as fast (at 0.8: 73 -> 88 MB; n500 at 0.3: 72 -> 81 MB)
MEMO_MAX_QUERIES = 100_000
#: chains kept per position (and ``plain`` flag), the latest first
MEMO_PER_POSITION = 32
#: chains whose replay asked fewer state queries are not kept: checking one costs about what replaying it
#: does, and most checks fail (at 16: GPT-2 medium b8 hybrid at 0.5, 4,082 failed checks for 74 chains
#: found; the Checkmate ResNet-50 graph recompute-only at 0.3, 8,877 for 87 and a 10% slower solve; at 1,
#: the hybrid solves of the U-Net and the VGG segmentation graph 5-9% slower)
MEMO_MIN_QUERIES = 64


class _Entry(NamedTuple):
    """A chain of a :class:`ChainMemo` with the answers to the state queries
    its replay asked, in the order of each kind's first ask (the tensors'
    states are the chain's own, ``chain.asked``)."""
    last_of: Callable       # getter of the asked tensors' entries of st.t_last_eff
    last: object            # those entries (the drop rule reads last use <= q: an equal last use answers the same)
    storages: tuple         # storages whose storage_off was asked
    offs: tuple             # the answers
    bases: tuple            # base tensors whose has_swap was asked
    swapped: tuple          # the answers
    early: tuple            # early_targets' answer
    chain: Chain


class ChainMemo:
    """Chains replayed before, each with the answers to the state queries it
    was built from: ``entries[(q, plain)]`` is a list of :class:`_Entry`, at
    most :data:`MEMO_PER_POSITION` per key, at most :data:`MEMO_MAX_QUERIES`
    tensor queries in all (then emptied), only chains of at least
    :data:`MEMO_MIN_QUERIES` queries.

    A cache, not part of the plan: shared by a timeline's copies (each
    checks an entry against its own state), and a new one for each new or
    reset timeline (``records.fresh_timeline`` gives each descent its own).
    Random layered graph of 1,000 nodes, recompute-only at 0.8 of its peak:
    835 of the 4,293 chains a solve asks for are found here (of about 400
    queries each), and the solve takes 2.2 CPU s instead of 3.1-3.2."""

    __slots__ = ("entries", "size")

    def __init__(self):
        self.entries: dict[tuple[int, bool], list[_Entry]] = {}
        self.size = 0

    def __repr__(self) -> str:
        return f"ChainMemo({len(self.entries)} positions, {self.size} queries)"

    def add(self, key: tuple[int, bool], entry: _Entry) -> None:
        """Keep ``entry`` first among ``key``'s."""
        n = len(entry.chain.asked)
        if self.size + n > MEMO_MAX_QUERIES:
            self.entries.clear()
            self.size = 0
        lst = self.entries.setdefault(key, [])
        lst.insert(0, entry)
        self.size += n
        if len(lst) > MEMO_PER_POSITION:
            self.size -= len(lst.pop().chain.asked)


def _holds(pt, wt, st, q: int, e: _Entry, early: tuple, ts: Callable) -> bool:
    """Whether every state query of memo entry ``e`` (:class:`ChainMemo`)
    gets the same answer now, for the chain before position ``q``.
    ``early``: ``early_targets(st, q)`` as a tuple, and ``ts``:
    ``state_reader(pt, wt, st)`` (asked once by the caller for all of a
    position's entries).

    The queries are asked shortest list first, the tensors' states last:
    the answer is the same in any order, and where tensors come back by a
    swap-in most entries fail on :func:`has_swap` (an entry replayed under a
    hypothesis that swapped another storage; an EfficientNet profiled on
    CPU, transformers' default ``EfficientNetConfig`` at batch 2 and 64
    pixels, 2,287 nodes, hybrid at 0.5 of its peak: 28,029 of 33,825
    checks, each after all of the about 150 tensor states; the solve took
    2.57 CPU s, now 1.63, the same answer)."""
    last_of, last, storages, offs, bases, swapped, e_early, chain = e
    if early != e_early:
        return False
    for t, v in zip(bases, swapped):
        if has_swap(st, t) != v:
            return False
    for s, v in zip(storages, offs):
        if storage_off(wt, st, s, q) != v:
            return False
    if last_of(st.t_last_eff) != last:
        return False
    for t, v in chain.asked.items():
        if ts(t, q) != v:
            return False
    return True


def _walk(pt, st, q: int, missing: list, cache: dict, tstate: Callable, swapped: dict | None
          ) -> tuple[list[int], dict[int, int]]:
    """The estimate's walk: the steps that regenerate ``missing`` before
    node ``q``, in the order of the lowering's walk
    (:func:`~libra_opt.passes.regeneration.regeneration_steps`, which
    ``tests/test_libra_state.py`` holds equal to it over whole solves), with the state
    queries inlined (this runs in every candidate evaluation).

    ``cache``: tensor -> state before the chain (:func:`state_reader`'s
    answer; every tensor the walk asks is added, in the order asked);
    ``tstate``: the state reader; ``swapped``: ``None`` where no tensor comes
    back by a swap-in, else a dict the walk fills with :func:`has_swap`'s
    answer for each missing base tensor it enters that is not arriving (in
    the order asked).  Returns ``steps`` (a node ``n >= 0`` is recomputed,
    ``~t`` swaps tensor ``t`` in) and ``last``: per tensor the index in
    ``steps`` of the last step that reads it (the node's own reads are the
    caller's to add).  Source: Checkmate (MLSys 2020), sec. 4.5."""
    producer, n_inputs, tsto = pt.t_prod, pt.n_inputs, pt.t_storage
    t_act, t_out, last_eff = pt.t_act, pt.t_out, st.t_last_eff
    rev = pt.memo("libra.chains.rev_inputs", lambda: [tuple(reversed(n_inputs[n])) if n is not None else ()
                                                      for n in producer])
    visited: set[int] = set()
    seen: set[int] = set()      # nodes emitted (a producer of several missing outputs runs once)
    back: set[int] = set()      # tensors entered that come back by a swap-in
    steps: list[int] = []
    last: dict[int, int] = {}
    stack = list(reversed(missing))
    pop, push, visit, emit, cget = stack.pop, stack.append, visited.add, steps.append, cache.get
    while stack:
        t = pop()
        if t < 0:   # ~t: t's inputs are done, emit its step
            t = ~t
            if t in back:
                emit(~t)
                continue
            n = producer[t]
            if n not in seen:
                seen.add(n)
                k = len(steps)
                emit(n)
                for u in n_inputs[n]:
                    last[u] = k
            continue
        if t in visited:
            continue
        visit(t)
        push(~t)
        if swapped is not None and t == tsto[t]:   # by a swap-in: arriving, or its storage is swapped
            if cache[t] == ARRIVING:
                back.add(t)
                continue
            v = swapped[t] = has_swap(st, t)
            if v:
                back.add(t)
                continue
        for u in rev[t]:
            if u in visited:
                continue
            v = cget(u)
            if v is None:   # state_reader's answer, its first two cases inline
                if not t_act[u]:
                    v = cache[u] = LIVE
                elif not t_out[u] and last_eff[u] < q:
                    v = cache[u] = MISSING
                else:
                    v = cache[u] = tstate(u, q)
            if v != LIVE:
                push(u)
    return steps, last


def _one_alone_out(pt) -> list[int]:
    """Per node, its output where it has exactly one and that one is alone
    on its storage (``pt.t_alone``), else -1 (list of int, length ``N``):
    the nodes :func:`_replay`'s short loop takes."""
    alone = pt.t_alone
    return [o[0] if len(o) == 1 and alone[o[0]] else -1 for o in pt.n_outputs]


def _replay(pt, wt, st, q: int, plain: bool, memo: ChainMemo, key: tuple) -> Chain | None:
    """:func:`chain_at`'s replay (``plain``: no tensor comes back by a
    swap-in), kept in ``memo`` under ``key`` with the answers it was built
    from where it asked at least :data:`MEMO_MIN_QUERIES` queries."""
    n_inputs = pt.n_inputs
    needed = n_inputs[q]
    early = ()
    if q in st.early_at:
        extra = early_targets(st, q)
        if extra:
            needed = (*needed, *extra)
            early = tuple(extra)
    cache: dict[int, int] = {}     # tensor -> state before this chain
    missing = []
    tstate = state_reader(pt, wt, st)
    for t in needed:
        v = cache[t] = tstate(t, q)
        if v != LIVE:
            missing.append(t)
    if not missing:
        return None
    tsto = pt.t_storage

    def stc(t):
        """State of tensor ``t`` before this chain, cached."""
        v = cache.get(t)
        if v is None:
            v = cache[t] = tstate(t, q)
        return v

    swapped: dict[int, bool] = {}   # base tensor -> has_swap's answer
    steps, last = _walk(pt, st, q, missing, cache, tstate, None if plain else swapped)
    after = len(steps)
    for u in needed:   # read by the node itself: kept through the chain
        last[u] = after
    made: list[int] = []            # tensors the chain makes resident (each once: the walk enters a tensor once)
    resident: set[int] = set()      # tensors made resident by the chain and not freed yet
    refs: dict[int, int] = {}       # storage -> chain-made resident tensors on it
    pre_alloc: dict[int, bool] = {}  # storage -> allocated before the chain
    cur = peak = 0
    time_s = 0.0
    nodes = []
    waits = []
    vals: list[int] = []   # memory above the chain's start at each allocating step, and that step's node
    seq: list[int] | None = None    # (the nodes of ``nodes`` until a swap-in allocates: then built apart)
    feasible = True
    nb = pt.t_nbytes
    t_out, t_act, views, last_eff = pt.t_out, pt.t_act, pt.views, st.t_last_eff
    n_outputs, n_recomp, n_time, n_ws = pt.n_outputs, pt.n_recomp, pt.n_rtime, pt.n_ws
    # a tensor alone on its storage, where nothing comes back by a swap-in: its storage is allocated by the
    # chain exactly while the tensor is resident (no other tensor on it; not arriving): no reference count
    # (where one may come back by a swap-in, a table of False: every tensor takes the counted path)
    alone = pt.t_alone if plain else pt.memo("libra.chains.none_alone", lambda: [False] * len(pt.t_alone))
    h2d, margin1 = pt.h2d, 1.0 + wt.margin

    offs: dict[int, bool] = {}   # storage -> storage_off's answer at q

    def off(s, q):
        v = offs.get(s)
        if v is None:
            v = offs[s] = storage_off(wt, st, s, q)
        return v

    def allocated_before(s):
        """Storage ``s`` was allocated before the chain (a tensor of it live, or, for an activation,
        arriving); cached in ``pre_alloc``, whose lookup the loop below does inline."""
        vs = views[s]
        if len(vs) == 1:   # one tensor on the storage (most of them): its state alone
            u = stc(vs[0])
            v = pre_alloc[s] = u == LIVE or (bool(t_act[s]) and u == ARRIVING)
            return v
        v = pre_alloc[s] = any(stc(u) == LIVE for u in vs) or (
            t_act[s] and any(stc(u) == ARRIVING for u in vs))
        return v

    # the byte accounting of add and drop is inlined below, the cache lookup of allocated_before, and the
    # drop rule (dropped_after_step's test, run on each candidate in its order: a tensor dropped leaves
    # ``resident``, so a second read of it is not dropped twice; no read pending after step k: the last
    # step reading it is at most k): this loop runs for every candidate evaluation of the descents and
    # the finish
    lget = last.get
    # each step's node's output where it has one alone on its storage, else -1 (``_one_alone_out``)
    outs1 = list(map(pt.memo("libra.chains.one_alone_out", lambda: _one_alone_out(pt)).__getitem__, steps)
                 ) if plain else None
    if outs1 and min(outs1) >= 0:
        # every step a node with one output alone on its storage, nothing back by a swap-in: the loop below
        # with what it cannot meet taken out (the walk entered the output as not live and its node once: the
        # node runs and makes it; every tensor the chain makes is alone: no reference count)
        for k, (x, t) in enumerate(zip(steps, outs1)):
            resident.add(t)
            cur += nb[t]
            time_s += n_time[x]
            c = cur + n_ws[x]
            if c > peak:
                peak = c
            vals.append(c)
            # the drop rule on the reads (on the output it never drops: the walk entered it as the chain's
            # target or as a read of a node entered before it, which runs after this step)
            for u in n_inputs[x]:
                if u in resident and lget(u, -1) <= k and not t_out[u] and (last_eff[u] <= q or off(tsto[u], q)):
                    resident.discard(u)
                    cur -= nb[u]
        nodes, made, feasible = steps, outs1, all(map(n_recomp.__getitem__, steps))
    else:
        for k, x in enumerate(steps):
            sw = x < 0
            if sw:
                x = ~x
                if x in resident or stc(x) == LIVE:
                    continue
                if stc(x) == ARRIVING:   # waits for its prefetch in flight: allocated already
                    waits.append((x, time_s))
                    resident.add(x)
                    made.append(x)
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
                if not new:   # not run: its reads stay pending to the end (the lowering's rule)
                    for u in n_inputs[x]:
                        last[u] = after
                    continue
                if not n_recomp[x]:
                    feasible = False
                nodes.append(x)
                time_s += n_time[x]
            for t in new:                    # add(t)
                resident.add(t)
                made.append(t)
                if alone[t]:
                    cur += nb[t]
                    continue
                s = tsto[t]
                r = refs.get(s, 0)
                if r == 0:
                    ab = pre_alloc.get(s)
                    if ab is None:
                        if t == s and len(views[s]) == 1:
                            # allocated_before(s), t its only tensor: t is not live (it is new) and its state is
                            # cached (the checks above asked it)
                            ab = pre_alloc[s] = bool(t_act[s]) and cache[t] == ARRIVING
                        else:
                            ab = allocated_before(s)
                    if not ab:
                        cur += nb[s]
                refs[s] = r + 1
            if sw:
                if new:   # a synchronous swap-in
                    time_s += nb[x] / h2d * margin1
                    if cur > peak:
                        peak = cur
                    vals.append(cur)
                    if seq is None:
                        seq = list(nodes)
                    seq.append(-1)
                cands = (x,)
            else:
                c = cur + transient
                if c > peak:
                    peak = c
                vals.append(c)
                if seq is not None:
                    seq.append(x)
                cands = (*n_inputs[x], *new)
            for t in cands:                  # the drop rule, then drop(t)
                if t in resident and lget(t, -1) <= k and not t_out[t] and (last_eff[t] <= q or off(tsto[t], q)):
                    resident.discard(t)
                    if alone[t]:
                        cur -= nb[t]
                        continue
                    s = tsto[t]
                    r = refs[s] - 1
                    refs[s] = r
                    if r == 0:
                        ab = pre_alloc.get(s)
                        if ab is None:
                            ab = allocated_before(s)
                        if not ab:
                            cur -= nb[s]
    # touched: the storages of every activation whose state the replay asked (the walk asks every input of
    # a node it recomputes, the loop every tensor it makes, the missing ones first): a window of one of them
    # that starts covering ``q`` changes the chain (``affected``), an output of a recomputed node found
    # resident (counted as transient) too, which is then made instead
    touched = frozenset([tsto[t] for t in cache if t_act[t]])
    nodes = tuple(nodes)
    ch = Chain(nodes, time_s, int(peak), int(cur), touched, feasible, tuple(waits),
               tuple(sorted(made)), tuple(vals), nodes if seq is None else tuple(seq), cache)
    if len(cache) < MEMO_MIN_QUERIES:
        return ch
    last_of = itemgetter(*cache)
    memo.add(key, _Entry(last_of, last_of(last_eff), tuple(offs),
                         tuple(offs.values()), tuple(swapped), tuple(swapped.values()), early, ch))
    return ch


def affected(wt, st, j: int, host_copy: bool = False) -> set[int]:
    """Regeneration points (positions) whose chain may change when window
    ``j``'s decision or end changes: the window's own points and the chains
    inside it that read its storage (``st.touch``); with ``host_copy`` (the
    change swaps the storage or stops swapping it), every chain after the
    window's start that reads it too: a chain that brings back a dead tensor
    of the storage (a base freed after its last use while a retained view
    keeps the storage) swaps it in only while the storage has a host copy
    (:func:`has_swap`), else recomputes its producer."""
    a, hi = int(wt.w_a[j]), int(st.w_maxhi[j])
    pts = set(st.w_pts[j])
    for q in st.touch.get(int(wt.w_s[j]), ()):
        if a < q and (q <= hi or host_copy):
            pts.add(q)
    return pts
