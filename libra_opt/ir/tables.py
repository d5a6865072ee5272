"""Per-problem tables: the flat lists and arrays every pass reads, built once.

The simulator, the lowering, the bounds and the ``libra`` solver's
``Timeline`` all read the same facts of a :class:`~libra_opt.ir.problem.RematProblem`
in their hot loops: per tensor its storage, bytes, producer, consumers, last
use; per node its inputs, outputs, times, workspace; the no-remat memory per
position.  Attribute access through ``problem.tensors[t].storage`` costs two
lookups and a dataclass read each time, so each of them used to build its own
lists, cached in its own ``WeakKeyDictionary``.  :class:`ProblemTables` holds
them once, obtained as ``problem.tables``.

Why sharing is safe: a :class:`~libra_opt.ir.problem.RematProblem` is
**immutable** (assigning an attribute raises; ``problem.replace(...)``
builds a new problem, with new tables), so tables built from it never go
stale.  They are not keyed by the problem's content: two equal problems
built separately have two tables objects.

Groups of tables are built on first use (``functools.cached_property``), so
the simulator does not pay for the lowering's tables, and each group is built
at most once per problem.  Everything here is shared by every caller: the
lists and arrays must not be changed in place (the numpy arrays are
read-only; copy before writing).

Sources: the accounting rules of :mod:`libra_opt.passes.simulator` (per
storage, outputs allocated at their op's start, workspace transient), the
free-after-last-use rule of :func:`libra_opt.ir.schedule.no_remat_schedule`
and :mod:`libra_opt.passes.lowering`, and the static section of the
``libra`` solver's ``Timeline`` (Libra, Wang, NTHU 2024, "memory reduction
estimation").
"""
from __future__ import annotations

import weakref
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .problem import ACTIVATION, INPUT
from .schedule import Instr, Op

if TYPE_CHECKING:
    from .problem import RematProblem

__all__ = ["ProblemTables"]


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class ProblemTables:
    """Flat per-problem tables (lists for scalar reads in hot loops, read-only
    numpy arrays for vector work), built once per problem.

    Obtain it as ``problem.tables`` (built on first access and kept on the
    problem; safe because :class:`~libra_opt.ir.problem.RematProblem` is
    immutable, see the module docstring).  ``T`` is the number of tensors,
    ``N`` the number of nodes; positions are eager-order node ids.  Each
    table is built on first access; its docstring gives its shape and units.

    - per tensor (lists of length ``T``): :attr:`t_act`, :attr:`t_input`,
      :attr:`t_storage`, :attr:`t_prod`, :attr:`t_cons`, :attr:`t_nbytes`,
      :attr:`t_out`, :attr:`t_last`, :attr:`t_last_read`, :attr:`t_freeable`,
      :attr:`t_alone`;
    - per node (lists of length ``N``): :attr:`n_inputs`, :attr:`n_outputs`,
      :attr:`n_time`, :attr:`n_rtime`, :attr:`n_ws`, :attr:`n_recomp`,
      :attr:`n_facts`;
    - problem-wide: :attr:`views`, :attr:`node_time`, :attr:`cum`, :attr:`C0`,
      :attr:`newws`;
    - the lowering's: :attr:`uses`, :attr:`default_windows`,
      :attr:`compute_instr`, :attr:`free_instr`, :attr:`free_cands`,
      :attr:`free_static`, :attr:`storage_nodes`;
    - results of passes derived from the problem alone (the no-remat peak,
      the lower bounds): :meth:`memo`.

    The names and meanings of ``t_*``, ``n_*``, ``views``, ``node_time``,
    ``cum``, ``C0`` and ``newws`` are those of the ``libra`` solver's
    ``Timeline`` (``tests/test_tables.py`` checks that they agree).
    """

    def __init__(self, problem: "RematProblem"):
        # a weak reference: the problem holds its tables, the tables must not keep the problem alive
        self._problem = weakref.ref(problem)
        self._memo: dict[str, Any] = {}

    @property
    def problem(self) -> "RematProblem":
        """The problem these tables describe.

        Raises
        ------
        ReferenceError
            The problem was garbage-collected (keep a reference to the
            problem, not only to its tables)."""
        p = self._problem()
        if p is None:
            raise ReferenceError("the RematProblem of these tables no longer exists; keep a reference to the "
                                 "problem, not only to problem.tables")
        return p

    def memo(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` computed once per problem and kept under ``key``.

        For passes that derive a value from the problem alone (the simulator's
        no-remat peak, :mod:`libra_opt.passes.bounds`): the value is shared by
        every caller, so return copies of mutable values.  ``key`` names the
        pass (``"simulator.no_remat_peak"``)."""
        try:
            return self._memo[key]
        except KeyError:
            v = self._memo[key] = build()
            return v

    # ------------------------------------------------------------- sizes and device
    @cached_property
    def N(self) -> int:
        """Number of nodes (eager positions)."""
        return self.problem.num_nodes

    @cached_property
    def overlap(self) -> bool:
        """The device's copies overlap compute (``problem.device.copies_overlap_compute``)."""
        return bool(self.problem.device.copies_overlap_compute)

    @cached_property
    def h2d(self) -> float:
        """Host-to-device copy bandwidth, bytes/s (``problem.device.h2d_bytes_per_s``)."""
        return float(self.problem.device.h2d_bytes_per_s)

    @cached_property
    def d2h(self) -> float:
        """Device-to-host copy bandwidth, bytes/s (``problem.device.d2h_bytes_per_s``)."""
        return float(self.problem.device.d2h_bytes_per_s)

    # ------------------------------------------------------------- tensors
    @cached_property
    def t_act(self) -> list[bool]:
        """Per tensor, ``kind == "activation"`` (produced by a node; a view of a graph input made by
        a node is one too); list of bool, length ``T``."""
        return [t.kind == ACTIVATION for t in self.problem.tensors]

    @cached_property
    def t_input(self) -> list[bool]:
        """Per tensor, ``kind == "input"`` (a graph input: always resident, fixed memory): the
        negation of :attr:`t_act`; list of bool, length ``T``."""
        return [t.kind == INPUT for t in self.problem.tensors]

    @cached_property
    def t_storage(self) -> list[int]:
        """Per tensor, the id of the base tensor whose storage it lives on; list of int, length
        ``T``."""
        return [t.storage for t in self.problem.tensors]

    @cached_property
    def t_prod(self) -> list[int | None]:
        """Per tensor, its producing node (``None`` for a graph input); list, length ``T``."""
        return [t.producer for t in self.problem.tensors]

    @cached_property
    def t_cons(self) -> list[tuple[int, ...]]:
        """Per tensor, its consumer nodes, ascending; list of tuple of int, length ``T``."""
        return [t.consumers for t in self.problem.tensors]

    @cached_property
    def t_nbytes(self) -> list[int]:
        """Per tensor, the bytes it owns (0 for a view); list of int, length ``T``, bytes."""
        return [t.nbytes for t in self.problem.tensors]

    @cached_property
    def t_out(self) -> list[bool]:
        """Per tensor, whether it is a step output (never freed); list of bool, length ``T``."""
        p = self.problem
        out = [False] * len(p.tensors)
        for o in p.outputs:
            out[o] = True
        return out

    @cached_property
    def t_last(self) -> list[int]:
        """Per tensor, the last position that uses it: its last consumer, else its producer, else -1
        (the ``Timeline``'s meaning); list of int, length ``T``."""
        return [max(t.consumers) if t.consumers else (t.producer if t.producer is not None else -1)
                for t in self.problem.tensors]

    @cached_property
    def t_last_read(self) -> list[int]:
        """Per tensor, the last position that *reads* it (its last consumer), -1 if none: the
        lowering's free-after-last-use rule; list of int, length ``T``."""
        return [t.consumers[-1] if t.consumers else -1 for t in self.problem.tensors]

    @cached_property
    def t_freeable(self) -> list[bool]:
        """Per tensor, an activation that is not a step output (the tensors a plan may free); list
        of bool, length ``T``."""
        outputs = self.problem.output_set
        return [t.kind == ACTIVATION and t.id not in outputs for t in self.problem.tensors]

    @cached_property
    def t_alone(self) -> list[bool]:
        """Per tensor, an activation that is its storage's only tensor (its own base, no view on
        it): its storage is allocated exactly while it is; list of bool, length ``T``."""
        views = self.problem.storage_views
        return [t.kind == ACTIVATION and t.storage == t.id and len(views[t.id]) == 1
                for t in self.problem.tensors]

    # --------------------------------------------------------------- nodes
    @cached_property
    def n_inputs(self) -> list[tuple[int, ...]]:
        """Per node, the tensor ids it reads; list of tuple of int, length ``N``."""
        return [n.inputs for n in self.problem.nodes]

    @cached_property
    def n_outputs(self) -> list[tuple[int, ...]]:
        """Per node, the tensor ids it produces; list of tuple of int, length ``N``."""
        return [n.outputs for n in self.problem.nodes]

    @cached_property
    def n_time(self) -> list[float]:
        """Per node, the measured time of a first computation; list of float, length ``N``, seconds."""
        return [n.time_s for n in self.problem.nodes]

    @cached_property
    def n_rtime(self) -> list[float]:
        """Per node, the time of a recompute under the problem's executor cost model
        (``problem.recompute_time``, :func:`libra_opt.passes.costs.recompute_times`); list of float,
        length ``N``, seconds."""
        return self.problem.recompute_time.tolist()

    @cached_property
    def n_ws(self) -> list[int]:
        """Per node, its transient workspace; list of int, length ``N``, bytes."""
        return [n.workspace_bytes for n in self.problem.nodes]

    @cached_property
    def n_recomp(self) -> list[bool]:
        """Per node, whether it may run again; list of bool, length ``N``."""
        return [n.recomputable for n in self.problem.nodes]

    @cached_property
    def n_facts(self) -> list[tuple]:
        """Per node, ``(inputs, outputs, recomputable, time_s, workspace_bytes)``: what the
        simulator unpacks per ``Compute``; list of tuple, length ``N``."""
        return [(n.inputs, n.outputs, n.recomputable, n.time_s, n.workspace_bytes) for n in self.problem.nodes]

    # -------------------------------------------------------- problem-wide
    @property
    def views(self) -> dict[int, tuple[int, ...]]:
        """``problem.storage_views``: storage -> tensor ids on it, base first."""
        return self.problem.storage_views

    @property
    def node_time(self) -> np.ndarray:
        """``problem.node_time``: per node, seconds; read-only ndarray of float64, shape ``(N,)``."""
        return self.problem.node_time

    @cached_property
    def cum(self) -> np.ndarray:
        """``cum[i]``: the start of node ``i`` in the no-remat plan (the sum of the times before
        it), ``cum[N]`` the step's compute time; read-only ndarray of float64, shape ``(N + 1,)``,
        seconds."""
        return _frozen(np.concatenate([[0.0], np.cumsum(self.problem.node_time)]))

    @cached_property
    def C0(self) -> np.ndarray:
        """Graph memory while node ``i`` runs in the no-remat plan: every activation storage of
        nonzero bytes is live from its producer through the last use of any tensor on it (through
        ``N - 1`` if it holds a step output), plus node ``i``'s workspace; equal to the simulator's
        memory at each ``Compute`` of the no-remat schedule.  Read-only ndarray of int64, shape
        ``(N,)``, bytes."""
        self._no_remat_memory()
        return self.__dict__["C0"]

    @cached_property
    def newws(self) -> np.ndarray:
        """Per node, its workspace plus the bytes of the activation storages it allocates (memory
        that exists only from node ``i`` on); read-only ndarray of int64, shape ``(N,)``, bytes."""
        self._no_remat_memory()
        return self.__dict__["newws"]

    def _no_remat_memory(self) -> None:
        """Build ``C0`` and ``newws`` together (the ``Timeline``'s static section)."""
        p = self.problem
        T = p.tensors
        N = len(p.nodes)
        t_out, t_last = self.t_out, self.t_last
        diff = np.zeros(N + 1, dtype=np.int64)
        newws = np.array(self.n_ws, dtype=np.int64)
        for s, ts in self.views.items():
            base = T[s]
            if base.kind != ACTIVATION or base.nbytes == 0:
                continue
            end = N - 1 if any(t_out[t] for t in ts) else max(t_last[t] for t in ts)
            diff[base.producer] += base.nbytes
            diff[end + 1] -= base.nbytes
            newws[base.producer] += base.nbytes
        self.__dict__["C0"] = _frozen(np.cumsum(diff[:N]) + np.array(self.n_ws, dtype=np.int64))
        self.__dict__["newws"] = _frozen(newws)

    # ------------------------------------------------------------ lowering
    @cached_property
    def uses(self) -> dict[int, list[int]]:
        """Activation storage holding no step output -> the sorted positions that produce or read a
        tensor on it (:func:`libra_opt.passes.lowering.storage_uses`); dict of int to list of int."""
        p = self.problem
        out: dict[int, set[int]] = {}
        banned = {p.tensors[o].storage for o in p.output_set}
        for t in p.tensors:
            if t.kind != ACTIVATION or t.storage in banned or p.tensors[t.storage].kind != ACTIVATION:
                continue
            u = out.setdefault(t.storage, set())
            u.add(t.producer)
            u.update(t.consumers)
        return {s: sorted(u) for s, u in out.items()}

    @cached_property
    def default_windows(self) -> dict[int, tuple[int, int]]:
        """Storage -> ``(after, before)``, its candidate eviction window
        (:func:`libra_opt.passes.lowering.default_windows`: last forward use to first backward use;
        on a single-phase graph the largest gap; gaps of at least 2 positions)."""
        p = self.problem
        b = p.boundary
        out: dict[int, tuple[int, int]] = {}
        for s, uses in self.uses.items():
            if b < p.num_nodes:
                fwd = [u for u in uses if u < b]
                bwd = [u for u in uses if u >= b]
                if fwd and bwd and bwd[0] - fwd[-1] >= 2:
                    out[s] = (fwd[-1], bwd[0])
            else:
                best = None
                for x, y in zip(uses, uses[1:]):
                    if y - x >= 2 and (best is None or y - x > best[1] - best[0]):
                        best = (x, y)
                if best:
                    out[s] = best
        return out

    @cached_property
    def compute_instr(self) -> list[Instr]:
        """``Compute(i)`` per node, shared by every schedule of the problem (instructions are
        immutable); list of Instr, length ``N``."""
        return [Instr(Op.COMPUTE, i) for i in range(len(self.problem.nodes))]

    @cached_property
    def free_instr(self) -> list[Instr]:
        """``Free(t)`` per tensor, shared by every schedule of the problem; list of Instr, length
        ``T``."""
        return [Instr(Op.FREE, t) for t in range(len(self.problem.tensors))]

    @cached_property
    def free_cands(self) -> list[list[int]]:
        """Per node, its inputs and outputs that are freeable (:attr:`t_freeable`), sorted; list of
        list of int, length ``N``."""
        freeable = self.t_freeable
        return [sorted({t for t in (*n.inputs, *n.outputs) if freeable[t]}) for n in self.problem.nodes]

    @cached_property
    def free_static(self) -> list[list[int]]:
        """Per node, those of :attr:`free_cands` last read at or before it (freed there by the no-
        remat rule); list of list of int, length ``N``."""
        last = self.t_last_read
        return [[t for t in ts if last[t] <= i] for i, ts in enumerate(self.free_cands)]

    @cached_property
    def storage_nodes(self) -> dict[int, list[int]]:
        """Storage -> the nodes with a free candidate on it, ascending; dict of int to list of int."""
        storage = self.t_storage
        out: dict[int, list[int]] = {}
        for i, ts in enumerate(self.free_cands):
            for s in {storage[t] for t in ts}:
                out.setdefault(s, []).append(i)
        return out
