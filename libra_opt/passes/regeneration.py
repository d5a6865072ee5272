"""The regeneration rule: how evicted tensors come back before a node reads them.

One rule, used by both the lowering (:mod:`libra_opt.passes.lowering`, which
emits the instructions) and the ``libra`` estimate
(:mod:`libra_opt.solvers.libra.chains`, which counts the chain's bytes and
seconds without emitting anything), so that the estimate replays exactly
what the lowering will run (the estimate runs the walk with its state
queries inlined, ``chains._walk``, which
``tests/test_libra_state.py`` holds equal to :func:`regeneration_steps`
over whole solves):

1. **The walk** (:func:`regeneration_steps`): a post-order over the missing
   tensors a node needs.  A missing tensor comes back by a swap-in (the
   caller says which, ``by_swap``) or by recomputing its producer, whose
   missing inputs come back first.  A producer with several missing outputs
   is recomputed once.
2. **Pending uses**: per tensor, the reads still to come inside the chain
   (the recomputed producers' inputs) plus one per read of the node itself.
3. **The drop rule** (:func:`dropped_after_step`): after each step, a tensor
   the chain made resident, or one retained for this chain alone (its
   retention ends at the node), is freed as soon as no read in the chain or
   at the node is pending, it is not a step output, and its last use (or the
   end of its retention) is at or before the node, or its storage is meant
   to be off the device there.  The estimate runs this test inline, in the loop every
   candidate evaluation runs (``chains._replay``); the tests that hold the
   estimate equal to the simulation of the lowered plan
   (``tests/test_libra.py``, ``test_estimate_matches_the_simulator*``) hold
   the two equal.

Source: Checkmate's plan generation with freeing of temporaries (Jain et
al., "Checkmate", MLSys 2020, sec. 4.5, Algorithm 2), extended to swap-ins.
"""
from __future__ import annotations

from typing import Callable, Container, Iterable, Sequence

__all__ = ["regeneration_steps", "dropped_after_step"]


def regeneration_steps(needed: Sequence[int], missing: Sequence[int], is_missing: Callable[[int], bool],
                       by_swap: Callable[[int], bool] | None, producer: Sequence, inputs: Sequence
                       ) -> tuple[list[tuple[bool, int]], dict[int, int]]:
    """The steps that regenerate ``missing`` before a node reading ``needed``.

    Parameters
    ----------
    needed : sequence of int
        Tensor ids the node reads (its inputs, plus any tensors regenerated
        early before it); each read counts one pending use.
    missing : sequence of int
        The tensors of ``needed`` that are not resident, in ``needed``'s order.
    is_missing : callable (int) -> bool
        Whether a tensor is not resident before the chain (a producer's input
        that is resident is read in place; parameters and inputs never are
        missing).
    by_swap : callable (int) -> bool, or None
        Whether a missing tensor comes back by a swap-in (else by recomputing
        its producer); ``None``: none does.  Called once per missing tensor the walk reaches, in
        the walk's order, when it is entered (it is one of ``missing``, or
        ``is_missing`` returned True for it).
    producer : sequence
        ``producer[t]``: node id producing tensor ``t``.
    inputs : sequence
        ``inputs[n]``: tensor ids node ``n`` reads.

    Returns
    -------
    steps : list of (bool, int)
        In execution order: ``(True, t)`` swaps tensor ``t`` in, ``(False,
        n)`` recomputes node ``n`` (each node once).
    pending : dict of int -> int
        Reads of each tensor still to come: by the recomputed nodes of
        ``steps`` and by the node itself.  Callers decrement it as they run
        the steps and pass it to :func:`dropped_after_step`.

    Source: post-order of the regeneration DAG, Checkmate (MLSys 2020),
    sec. 4.5.
    """
    visited: set[int] = set()
    steps: list[tuple[bool, int]] = []
    pending: dict[int, int] = {}
    seen: set[int] = set()          # nodes emitted (a producer of several missing outputs runs once)
    get = pending.get
    # entries: t (enter tensor t) and ~t (t's inputs are done: emit its step); every tensor entered is
    # missing (``missing`` is, and an input is pushed only where is_missing says so)
    stack = list(reversed(missing))
    swapped: set[int] = set()       # tensors entered that come back by a swap-in
    pop, push, visit, emit = stack.pop, stack.append, visited.add, steps.append   # hot loop: bound once
    while stack:
        t = pop()
        if t < 0:
            t = ~t
            if t in swapped:
                emit((True, t))
                continue
            n = producer[t]
            if n not in seen:
                seen.add(n)
                emit((False, n))
                for u in inputs[n]:
                    pending[u] = get(u, 0) + 1
            continue
        if t in visited:
            continue
        visit(t)
        push(~t)
        if by_swap is not None and by_swap(t):
            swapped.add(t)
            continue
        for u in reversed(inputs[producer[t]]):
            if u not in visited and is_missing(u):
                push(u)
    for u in needed:
        pending[u] = get(u, 0) + 1
    return steps, pending


def dropped_after_step(candidates: Iterable[int], resident: Container[int], pending: dict, q: int,
                       is_output: Sequence, last_use: Sequence, storage: Sequence,
                       storage_off: Callable[[int, int], bool]) -> list[int]:
    """Tensors the chain frees right after a step (the drop rule).

    Parameters
    ----------
    candidates : iterable of int
        Tensors the step read or made (a recomputed node's inputs and new
        outputs; a swapped-in tensor).
    resident : container of int
        Tensors the chain may free that are still resident: those it made
        resident, and those retained for it alone (the caller filters
        ``candidates`` to these).
    pending : dict of int -> int
        From :func:`regeneration_steps`, decremented for the steps run so far.
    q : int
        Position of the node the chain runs before.
    is_output : sequence of bool
        Per tensor, whether it is a step output (never freed).
    last_use : sequence of int
        Per tensor, its last use, or the end of its retention (position).
    storage : sequence of int
        Per tensor, its storage (base tensor id).
    storage_off : callable (int, int) -> bool
        Whether a storage is meant to be off the device at the end of
        position ``q`` (an eviction window covers it).

    Returns
    -------
    list of int
        The candidates to free, in order, each once (a node may read a
        tensor twice).  The caller frees them (the
        lowering may hold a base a view still needs; the estimate counts the
        storage's bytes as released when no tensor of it stays resident).
    """
    out: list[int] = []
    for t in candidates:
        if t in resident and pending.get(t, 0) == 0 and not is_output[t] and (
                last_use[t] <= q or storage_off(storage[t], q)) and t not in out:
            out.append(t)
    return out
