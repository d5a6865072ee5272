"""The mutable state of the ``libra`` estimate, every field declared once.

:class:`TimelineState` holds what the decisions change: policies, window
ends, retentions, memory points, chains and the swap layer.  Each field is a
:class:`Field` in :data:`FIELDS`, saying what it holds (units: bytes, seconds,
eager positions), how it starts (:meth:`TimelineState.reset`) and how an
independent copy gets it (:meth:`TimelineState.copy`): both are generated
from the declarations, so a new field is declared in one place and a
forgotten copy cannot alias two timelines.

The static tables the state is read with are in
:mod:`solvers/libra/tables.py <libra_opt.solvers.libra.tables>`; the rules
that change the state are in :mod:`.chains` (chain replay), :mod:`.swaps`
(the swap layer), :mod:`.reshape` (window ends, retentions) and
:mod:`.estimate` (evaluate / apply).

``W`` windows, ``N`` eager positions.

Source: Libra (Wang, NTHU 2024), the incremental re-simulation of the greedy
refinement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .chains import ChainMemo
from .codes import KEEP
from .swaps import empty_swap_layer
from .tables import ProblemTables, WindowTables


# how a field is copied by TimelineState.copy: value -> value (the state being copied as the 2nd argument)
def shared(v, st):
    """Copy rule: the same object (immutable values, or replaced rather than mutated)."""
    return v


def array_copy(v, st):
    """Copy rule: a new ndarray with the same values."""
    return v.copy()


def list_copy(v, st):
    """Copy rule: a new list of the same items."""
    return list(v)


def dict_copy(v, st):
    """Copy rule: a new dict of the same items."""
    return dict(v)


def set_copy(v, st):
    """Copy rule: a new set of the same items."""
    return set(v)


def dict_of_lists_copy(v, st):
    """Copy rule: a new dict of new lists."""
    return {k: list(x) for k, x in v.items()}


def dict_of_sets_copy(v, st):
    """Copy rule: a new dict of new sets."""
    return {k: set(x) for k, x in v.items()}


def dict_of_dicts_copy(v, st):
    """Copy rule: a new dict of new dicts."""
    return {k: dict(x) for k, x in v.items()}


def dropped(v, st):
    """Copy rule: ``None`` in the copy (what belongs to the original's trial only)."""
    return None


def copy_on_write_last_use(v, st):
    """Copy rule of ``t_last_eff``: shared while no retention is active
    (``reshape.retain`` copies it before it writes a list it does not own:
    ``t_last_own``), else a new list."""
    return list(v) if st.t_until else v


def last_use_owner(v, st):
    """Copy rule of ``t_last_own``: the copy owns its ``t_last_eff`` where it
    got a new list (a retention active); where the list is shared, neither
    the copy nor the original owns it any more (the original is marked
    here)."""
    if st.t_until:
        return True
    st.t_last_own = False
    return False


@dataclass(frozen=True)
class Field:
    """One declared field of :class:`TimelineState`.

    Attributes
    ----------
    name : str
        Attribute name.
    init : callable
        ``init(pt, wt)`` -> the value after :meth:`TimelineState.reset` (the no-remat plan).
    copy : callable
        ``copy(value, state)`` -> the value in an independent copy (one of the copy rules above).
    doc : str
        What the field holds, with units.
    cache : bool
        A cache, not state: what it holds is checked against the state
        before use, so no plan depends on its content (it may be shared
        by copies and grow while the state does not change).
    """

    name: str
    init: Callable[[ProblemTables, WindowTables], Any]
    copy: Callable[[Any, Any], Any]
    doc: str
    cache: bool = False


#: every field of the timeline state, in reset order
FIELDS: tuple[Field, ...] = (
    # decisions
    Field("pol", lambda pt, wt: np.zeros(wt.nw, dtype=np.int8), array_copy,
          "int8 (W,): policy per window (KEEP, REC, SWAP of .codes)"),
    Field("pol_l", lambda pt, wt: [KEEP] * wt.nw, list_copy,
          "list (W,): mirror of pol for scalar reads in the hot loops"),
    Field("n_swap", lambda pt, wt: 0, shared,
          "int: windows whose policy is SWAP (0: nothing comes back by a swap-in)"),
    Field("floor", lambda pt, wt: np.zeros(wt.nw, dtype=np.int64), array_copy,
          "int64 (W,): per swap, its swap-in is issued no earlier than after this position (0: none)"),
    Field("wait", lambda pt, wt: np.full(wt.nw, -1, dtype=np.int64), array_copy,
          "int64 (W,): per swap, the position before which the compute stream waits for its copy out "
          "(the lowering's Eviction.out_wait; -1: none)"),
    Field("s_win", lambda pt, wt: {}, dict_of_lists_copy,
          "storage -> list of its windows with a decision (not KEEP)"),
    # window ends (reshape)
    Field("w_b", lambda pt, wt: wt.orig_b.copy(), array_copy,
          "int64 (W,): current end of each window (position of the use, or an earlier regeneration point)"),
    Field("w_hi", lambda pt, wt: list(wt.orig_hi), list_copy,
          "list (W,) of dict tensor -> last position it is off for (dicts replaced, never mutated)"),
    Field("w_pts", lambda pt, wt: list(wt.orig_pts), list_copy,
          "list (W,) of tuples: each window's regeneration points, ascending"),
    Field("w_maxhi", lambda pt, wt: wt.orig_maxhi.copy(), array_copy,
          "int64 (W,): each window's last regeneration point"),
    Field("w_early", lambda pt, wt: {}, dict_copy,
          "window -> EarlyEnd(at, tensors): a window ending early, regenerating tensors before node at"),
    Field("early_at", lambda pt, wt: {}, dict_of_sets_copy,
          "position q -> windows that may regenerate before node q"),
    # retentions (reshape)
    Field("t_last_eff", lambda pt, wt: list(pt.t_last), copy_on_write_last_use,
          "list (T,): last use of each tensor, or the end of its retention (position)"),
    Field("t_last_own", lambda pt, wt: True, last_use_owner,
          "bool: t_last_eff is this state's own list, shared with no copy (reshape.retain writes it in place; "
          "a trial retention taken back then copies nothing: the list was copied once per retention before); "
          "bookkeeping of the copies, not of the plan", cache=True),
    Field("t_until", lambda pt, wt: {}, dict_copy,
          "retained tensor -> position it stays resident through"),
    Field("s_retained", lambda pt, wt: {}, dict_copy,
          "storage -> how many of its tensors are retained"),
    # memory points
    Field("R_rec", lambda pt, wt: np.zeros(pt.N, dtype=np.int64), array_copy,
          "int64 (N,): bytes off the device by recomputation at each position"),
    Field("C", lambda pt, wt: pt.C0.copy(), array_copy,
          "int64 (N,): graph memory while each node runs under the decisions (bytes)"),
    # chains (estimate, chains)
    Field("chains", lambda pt, wt: {}, dict_copy,
          "position -> Chain run before that node (absent: none)"),
    Field("regen_off", lambda pt, wt: -pt.newws.astype(np.int64), array_copy,
          "int64 (N,): each chain's peak above C, held bytes included (bytes; where no chain runs, the "
          "memory before the node allocates its outputs and workspace: -newws)"),
    Field("regen_time", lambda pt, wt: np.zeros(pt.N), array_copy,
          "float (N,): each chain's time (s)"),
    Field("T_cache", lambda pt, wt: None, shared,
          "float (N,) or None: start times for regen_time (s), replaced (never mutated) when it changes"),
    Field("touch", lambda pt, wt: {}, dict_of_sets_copy,
          "storage -> positions whose chain reads or regenerates it"),
    Field("waits", lambda pt, wt: {}, dict_of_dicts_copy,
          "storage -> {position: chain time before the chain waits for its swap-in (s)}"),
    Field("dirty", lambda pt, wt: set(), set_copy,
          "storages whose chains changed since their windows' swap marks were refreshed (swaps.update_marks)"),
    # swap marks and the swap layer (swaps)
    Field("touch_first", lambda pt, wt: np.full(wt.nw, pt.N + 1, dtype=np.int64), array_copy,
          "int64 (W,): first chain inside each window that reads its storage (N + 1: none)"),
    Field("wait_q", lambda pt, wt: np.full(wt.nw, -1, dtype=np.int64), array_copy,
          "int64 (W,): first chain inside each window that waits for its swap-in (-1: none)"),
    Field("wait_off", lambda pt, wt: np.zeros(wt.nw), array_copy,
          "float (W,): chain time before that wait (s)"),
    Field("sw_r0", lambda pt, wt: np.full(wt.nw, pt.N + 1, dtype=np.int64), array_copy,
          "int64 (W,): per swap, first position it is off the device (N + 1: not swapped)"),
    Field("sw_pos", lambda pt, wt: np.full(wt.nw, -1, dtype=np.int64), array_copy,
          "int64 (W,): per swap, the position after which its swap-in is issued (-1: not swapped)"),
    Field("swap", lambda pt, wt: empty_swap_layer(pt.N), shared,
          "SwapLayer of the current swaps (frozen; replaced)"),
    Field("pos", lambda pt, wt: {}, dict_copy,
          "swap window -> position after which its swap-in is issued"),
    Field("tend_cache", lambda pt, wt: None, shared,
          "(start times, end times) the swap layer last used (s), keyed by the identity of the first"),
    # trials
    Field("hyp", lambda pt, wt: None, shared,
          "Hypothesis the chain replay is asked about (None outside Timeline.evaluate)"),
    Field("journal", lambda pt, wt: None, dropped,
          "position -> chain before a Timeline.recording block, or None (a copy records nothing)"),
    Field("version", lambda pt, wt: 0, shared,
          "int: counts the changes applied"),
    # caches
    Field("memo", lambda pt, wt: ChainMemo(), shared,
          "ChainMemo: chains replayed before with the state queries they answer (a cache shared by copies, "
          "each entry checked against the state that reads it)", cache=True),
)


class TimelineState:
    """The mutable state of a ``Timeline``: one slot per :data:`FIELDS` entry
    (see there for what each holds).  ``TimelineState(pt, wt)`` is the
    no-remat plan of the tables ``pt`` and windows ``wt``."""

    __slots__ = tuple(f.name for f in FIELDS)

    def __init__(self, pt: ProblemTables, wt: WindowTables):
        self.reset(pt, wt)

    def reset(self, pt: ProblemTables, wt: WindowTables) -> None:
        """Every field back to its :attr:`Field.init` value: the no-remat plan."""
        for f in FIELDS:
            setattr(self, f.name, f.init(pt, wt))

    def copy(self) -> "TimelineState":
        """An independent copy, each field copied by its :attr:`Field.copy` rule."""
        new = object.__new__(TimelineState)
        for f in FIELDS:
            setattr(new, f.name, f.copy(getattr(self, f.name), self))
        return new


#: every field's description, for the docs of the classes that expose them
FIELD_DOCS = {f.name: f.doc for f in FIELDS}
