"""Named records of the ``libra`` estimate: what an evaluation returns
(:class:`Effect`), the hypothetical decision a chain replay is asked about
(:class:`Hypothesis`), an early window end (:class:`EarlyEnd`) and a saved
window end (:class:`WindowEnd`).

This module imports no other module of the estimate, so every one of them can
use these records (annotations naming ``SwapLayer`` or ``Chain`` are strings:
:mod:`solvers/libra/swaps.py <libra_opt.solvers.libra.swaps>` and
:mod:`solvers/libra/chains.py <libra_opt.solvers.libra.chains>` define them).

Source: Libra (Wang, NTHU 2024), the greedy refinement's candidate scoring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass
class Effect:
    """What applying or undoing one decision would do (from ``Timeline.evaluate``).

    Attributes
    ----------
    cost_s : float
        Added step time (s): chain time plus stalls, all chains that change included.
    chains : dict
        Regeneration point (position) -> new ``Chain`` (``None``: the chain disappears).
    swap : SwapLayer or None
        The new swap layer if swaps change.
    raised_max : int
        Largest new memory value among the points that go up (bytes; ``NEG`` if none).
    raised_at : int
        Position of ``raised_max`` (-1 if none).
    feasible : bool
        False when a changed chain would recompute a non-recomputable node.
    floor : int
        For a swap: its swap-in is issued no earlier than after this position (0: no floor).
    wait : int
        For a swap: the position before which the compute stream waits for its copy out (-1: none).
    """

    cost_s: float
    chains: dict
    swap: "SwapLayer | None"
    raised_max: int
    raised_at: int
    feasible: bool = True
    floor: int = 0
    wait: int = -1


@dataclass(slots=True)
class Hypothesis:
    """The decision a chain replay is asked about without it being applied
    (``Timeline.evaluate`` sets it for the duration of its replays).

    Attributes
    ----------
    window : int
        The window id whose policy is hypothetical.
    policy : int
        Its hypothetical policy (``KEEP``, ``REC`` or ``SWAP`` of :mod:`.codes`).
    storage : int
        The window's storage id (the chain replay checks it before the window).
    prefetch : dict or None
        Swap window id -> position after which its swap-in is issued under the
        hypothesis (the new swap layer's), for the swaps whose position
        differs from the state's (``TimelineState.pos``, read for the others)
        and the window itself if swapped; ``None`` when swaps do not change.

    Not frozen: a frozen dataclass takes about 3x as long to build, and one
    is built per evaluation (read speed is a tuple's; measured with timeit).
    """

    window: int
    policy: int
    storage: int
    prefetch: dict | None


class EarlyEnd(NamedTuple):
    """A recomputed window that ends early (``TimelineState.w_early`` values): its
    chain runs before node ``at``, which does not read the storage, and
    regenerates ``tensors``, resident from there until their use (lowered as
    ``Eviction.regenerate``).  A tuple, so plans' keys that sort and compare
    ``w_early`` items are unchanged.

    Attributes
    ----------
    at : int
        The position before which the early chain runs (the window's end).
    tensors : tuple of int
        Tensors of the storage regenerated there.
    """

    at: int
    tensors: tuple


class WindowEnd(NamedTuple):
    """The end of one window as ``Timeline.window_state`` saves it, for
    ``Timeline.move_end(..., state=)`` or ``Timeline.move_window_back`` to
    put back.

    Attributes
    ----------
    before : int
        The window's end (position of the chain that regenerates it).
    hi : dict
        Tensor -> last position it is off for (``tables.window_hi``).
    points : tuple of int
        The window's regeneration points, ascending.
    max_hi : int
        Its last regeneration point.
    """

    before: int
    hi: dict
    points: tuple
    max_hi: int
