"""The problem IR: :class:`RematProblem`, one training step as a DAG.

Nodes are aten ops in a valid execution order (the eager order); tensors carry
their producer, consumers and **storage**.  Views alias their base's storage
and own 0 bytes: memory is accounted per storage, never per node.  Graph
inputs (parameters, buffers, user inputs, tangents) have no producer, are
always resident and belong to :class:`FixedMemory`, outside the activation
budget.

Source: the problem statement of Checkmate (Jain et al., MLSys 2020, sec. 3)
extended with storages/aliasing and a device profile, as laid out in
``DESIGN.md``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ..errors import ProblemError

if TYPE_CHECKING:
    from .tables import ProblemTables

FORWARD = "forward"
BACKWARD = "backward"
PHASES = (FORWARD, BACKWARD)

ACTIVATION = "activation"  #: produced by a node of the graph
INPUT = "input"            #: graph input: always resident, part of fixed memory
TENSOR_KINDS = (ACTIVATION, INPUT)

#: executor cost models (:mod:`libra_opt.costs`): how a recompute is priced
EXECUTORS = ("eager", "inductor")


@dataclass(frozen=True)
class Node:
    """One op of the step.

    Attributes
    ----------
    id : int
        Position in the eager order (``problem.nodes[id] is self``).
    name : str
        Unique name (the FX node name for captured graphs).
    target : str
        The op, e.g. ``"aten.mm.default"``.
    phase : {"forward", "backward"}
    time_s : float
        Measured compute time, seconds.
    workspace_bytes : int
        Transient bytes the op needs while it runs beyond its outputs.
    recomputable : bool
        False for RNG ops whose RNG state is not replayed and for mutating ops.
    inputs : tuple of int
        Tensor ids read (each at most once).
    outputs : tuple of int
        Tensor ids produced.
    module : str
        Module path the op came from (``""`` if unknown); used for grouping.
    pointwise : bool
        A memory-bound op that a compiler fuses into its neighbours
        (elementwise ops, casts, reductions: what PyTorch's min-cut
        partitioner recomputes freely, see :func:`libra_opt.costs.is_fusible_op`);
        compute-bound ops (matmul, convolution, attention) are False.  Only
        the Inductor cost model reads it (:func:`libra_opt.costs.for_executor`).
    """

    id: int
    name: str
    target: str
    phase: str
    time_s: float
    workspace_bytes: int
    recomputable: bool
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    module: str = ""
    pointwise: bool = False


@dataclass(frozen=True)
class Tensor:
    """One value of the graph.

    Attributes
    ----------
    id : int
        Index in ``problem.tensors``.
    name : str
    producer : int or None
        Producing node id; ``None`` for graph inputs.
    consumers : tuple of int
        Node ids that read it, ascending.
    storage : int
        Id of the base tensor whose storage this tensor uses (itself for a base).
    nbytes : int
        Bytes of storage this tensor owns: the storage size for a base, 0 for a view.
    kind : {"activation", "input"}
        A view produced by a node is an activation even when its storage is a
        graph input's (``aten.t`` of a weight): it owns 0 bytes and its storage
        is always resident.
    shape : tuple of int, optional
    dtype : str, optional
    """

    id: int
    name: str
    producer: int | None
    consumers: tuple[int, ...]
    storage: int
    nbytes: int
    kind: str = ACTIVATION
    shape: tuple[int, ...] | None = None
    dtype: str | None = None

    @property
    def is_view(self) -> bool:
        """True if this tensor aliases another tensor's storage."""
        return self.storage != self.id


@dataclass(frozen=True)
class FixedMemory:
    """Memory outside the activation budget but inside the device total (bytes).

    ``gradients_bytes`` is reported for the device total, but gradients are
    graph outputs and appear in the simulated timeline as they are produced,
    so :attr:`resident_bytes` (what is resident for the whole step) excludes them.
    ``optimizer`` is ``"none"``, ``"sgd"`` (momentum: 1x params) or ``"adam"``
    (2x params).
    """

    parameters_bytes: int = 0
    buffers_bytes: int = 0
    gradients_bytes: int = 0
    optimizer_state_bytes: int = 0
    inputs_bytes: int = 0
    optimizer: str = "none"

    @property
    def resident_bytes(self) -> int:
        """Bytes resident for the whole step: parameters, buffers, optimizer
        state and inputs."""
        return self.parameters_bytes + self.buffers_bytes + self.optimizer_state_bytes + self.inputs_bytes


@dataclass(frozen=True)
class DeviceProfile:
    """The device the problem was profiled on.

    Attributes
    ----------
    name : str
    total_memory_bytes : int or None
    h2d_bytes_per_s, d2h_bytes_per_s : float
        Measured pinned host<->device bandwidth, bytes per second.
    copies_overlap_compute : bool
        True on a GPU (copies run on their own stream); False on a CPU, where a
        copy occupies the compute timeline.
    memory_bytes_per_s : float or None
        Measured device-memory bandwidth, bytes moved (read + written) per
        second (:func:`libra_opt.profiling.measure_memory_bandwidth`); ``None``
        when not measured (problems profiled before it was recorded).  The
        Inductor cost model prices a recomputed pointwise op with it.
    """

    name: str = "abstract"
    total_memory_bytes: int | None = None
    h2d_bytes_per_s: float = 55e9
    d2h_bytes_per_s: float = 55e9
    copies_overlap_compute: bool = True
    memory_bytes_per_s: float | None = None


@dataclass(frozen=True)
class Provenance:
    """Where a problem came from: ``source`` is ``"capture"`` or ``"import"``."""

    source: str = "manual"
    model: str = ""
    batch: int | None = None
    seq: int | None = None
    dtype: str = ""
    torch_version: str = ""
    date: str = ""
    extra: dict = field(default_factory=dict)


class RematProblem:
    """One training step as a DAG of ops over storages (the common problem IR).

    Parameters
    ----------
    nodes : sequence of Node
        In eager execution order; ``nodes[i].id == i``.
    tensors : sequence of Tensor
        ``tensors[j].id == j``.
    outputs : sequence of int
        Tensor ids returned by the step (loss, model outputs, gradients,
        updated buffers): they must be produced and stay resident to the end.
    fixed : FixedMemory, optional
    device : DeviceProfile, optional
    provenance : Provenance, optional
    name : str, optional
    executor : {"eager", "inductor"}
        The cost model of a recompute (:mod:`libra_opt.costs`): ``"eager"``
        (default) charges a recomputed node its measured ``time_s``;
        ``"inductor"`` charges a recomputed ``pointwise`` node the bytes it
        moves over the device-memory bandwidth, as it runs fused in a compiled
        backward graph.  Set it with :func:`libra_opt.costs.for_executor`.

    Raises
    ------
    ProblemError
        An invariant is broken: ids out of order, a consumer before its
        producer, inconsistent consumers, a view owning bytes, a storage whose
        base is a view, an unknown phase/kind.

    Notes
    -----
    A problem is **immutable**: setting or deleting an attribute raises
    ``AttributeError``; :meth:`replace` (and :meth:`with_device`) build a
    changed, re-validated copy.  Its parts are immutable too: ``nodes``,
    ``tensors`` and ``outputs`` are tuples of frozen dataclasses and ints,
    and ``fixed``, ``device`` and ``provenance`` are frozen dataclasses (only
    ``provenance.extra``, a free-form dict that no pass reads, could still be
    changed in place).  This is what lets everything derived from a problem
    (the cached properties and :attr:`tables`, :class:`~libra_opt.ir.tables.ProblemTables`)
    be computed once and shared.  Equality and hashing are by identity.
    """

    def __init__(self, nodes: Sequence[Node], tensors: Sequence[Tensor], outputs: Iterable[int],
                 fixed: FixedMemory | None = None, device: DeviceProfile | None = None,
                 provenance: Provenance | None = None, name: str = "", executor: str = "eager"):
        provenance = provenance or Provenance()
        init = object.__setattr__   # the one place attributes are set: the instance is immutable after
        init(self, "nodes", tuple(nodes))
        init(self, "tensors", tuple(tensors))
        init(self, "outputs", tuple(dict.fromkeys(int(o) for o in outputs)))
        init(self, "fixed", fixed or FixedMemory())
        init(self, "device", device or DeviceProfile())
        init(self, "provenance", provenance)
        init(self, "name", name or provenance.model or "problem")
        init(self, "executor", executor)
        self.validate()

    #: the constructor's arguments: what :meth:`replace` copies and what a pickle or copy holds
    _FIELDS = ("nodes", "tensors", "outputs", "fixed", "device", "provenance", "name", "executor")

    # ------------------------------------------------------------ immutable
    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(_immutable(name))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(_immutable(name))

    def __getstate__(self) -> dict:
        """State for :mod:`pickle` and :mod:`copy`: the constructor's
        arguments only; derived values (:attr:`tables`, the cached
        properties) are rebuilt on first use."""
        return {k: self.__dict__[k] for k in self._FIELDS}

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check every invariant of the IR; raise :class:`ProblemError` naming
        the first violation."""
        if self.executor not in EXECUTORS:
            raise ProblemError(f"unknown executor cost model {self.executor!r}; use one of {EXECUTORS}")
        nt = len(self.tensors)
        consumers: list[list[int]] = [[] for _ in range(nt)]
        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise ProblemError(f"node {n.name!r} has id {n.id} but is at position {i}; ids must equal eager order")
            if n.phase not in PHASES:
                raise ProblemError(f"node {n.name!r} has phase {n.phase!r}; use one of {PHASES}")
            if n.time_s < 0 or n.workspace_bytes < 0:
                raise ProblemError(f"node {n.name!r} has negative time or workspace")
            for t in n.inputs:
                if not 0 <= t < nt:
                    raise ProblemError(f"node {n.name!r} reads unknown tensor {t}")
                p = self.tensors[t].producer
                if p is not None and p >= i:
                    raise ProblemError(f"node {n.name!r} (position {i}) reads tensor "
                                       f"{self.tensors[t].name!r} produced later, by node {p}: order is not topological")
                consumers[t].append(i)
            for t in n.outputs:
                if not 0 <= t < nt or self.tensors[t].producer != i:
                    raise ProblemError(f"node {n.name!r} lists output {t} whose producer is not this node")
        for j, t in enumerate(self.tensors):
            if t.id != j:
                raise ProblemError(f"tensor {t.name!r} has id {t.id} but is at position {j}")
            if t.kind not in TENSOR_KINDS:
                raise ProblemError(f"tensor {t.name!r} has kind {t.kind!r}; use one of {TENSOR_KINDS}")
            if (t.producer is None) != (t.kind == INPUT):
                raise ProblemError(f"tensor {t.name!r}: inputs have no producer and activations have one")
            if t.producer is not None and j not in self.nodes[t.producer].outputs:
                raise ProblemError(f"tensor {t.name!r} names producer {t.producer} which does not list it")
            if tuple(consumers[j]) != tuple(t.consumers):
                raise ProblemError(f"tensor {t.name!r} lists consumers {list(t.consumers)} but nodes "
                                   f"{consumers[j]} read it")
            if t.nbytes < 0:
                raise ProblemError(f"tensor {t.name!r} has negative nbytes")
            if not 0 <= t.storage < nt:
                raise ProblemError(f"tensor {t.name!r} has unknown storage {t.storage}")
            if t.is_view:
                base = self.tensors[t.storage]
                if t.nbytes != 0:
                    raise ProblemError(f"view {t.name!r} owns {t.nbytes} bytes; views own 0 bytes")
                if base.is_view:
                    raise ProblemError(f"view {t.name!r} names storage {base.name!r}, itself a view; name the base")
                if t.kind == INPUT and base.kind != INPUT:
                    raise ProblemError(f"input view {t.name!r} aliases activation {base.name!r}; an input can "
                                       f"only alias another input")
                if t.producer is not None and base.producer is not None and base.producer > t.producer:
                    raise ProblemError(f"view {t.name!r} is produced before its base {base.name!r}")
                if t.producer is not None and not any(self.tensors[u].storage == t.storage
                                                      for u in self.nodes[t.producer].inputs):
                    raise ProblemError(f"view {t.name!r} of {base.name!r} is made by node "
                                       f"{self.nodes[t.producer].name!r}, which reads no tensor on that storage")
        for o in self.outputs:
            if not 0 <= o < nt:
                raise ProblemError(f"output {o} is not a tensor id")

    # -------------------------------------------------------------- derived
    def __repr__(self) -> str:
        return (f"RematProblem({self.name!r}, nodes={len(self.nodes)}, tensors={len(self.tensors)}, "
                f"outputs={len(self.outputs)})")

    @property
    def num_nodes(self) -> int:
        """Number of nodes (ops) in the step."""
        return len(self.nodes)

    @cached_property
    def storage_views(self) -> dict[int, tuple[int, ...]]:
        """Storage id -> ids of every tensor on that storage (base first)."""
        out: dict[int, list[int]] = {}
        for t in self.tensors:
            out.setdefault(t.storage, []).append(t.id)
        return {s: tuple(sorted(v, key=lambda i: (i != s, i))) for s, v in out.items()}

    def storage_bytes(self, tensor_id: int) -> int:
        """Bytes of the storage that ``tensor_id`` lives on."""
        return self.tensors[self.tensors[tensor_id].storage].nbytes

    @cached_property
    def node_time(self) -> np.ndarray:
        """Compute time per node, seconds, shape ``(num_nodes,)``; read-only
        (shared by every caller: copy it to change it)."""
        a = np.array([n.time_s for n in self.nodes], dtype=np.float64)
        a.setflags(write=False)
        return a

    @cached_property
    def recompute_time(self) -> np.ndarray:
        """Time a recompute of each node costs under this problem's
        ``executor`` cost model, seconds, shape ``(num_nodes,)``: equal to
        :attr:`node_time` for ``"eager"`` (see :func:`libra_opt.costs.recompute_times`);
        read-only (shared by every caller: copy it to change it)."""
        from ..passes.costs import recompute_times

        a = recompute_times(self)
        a.setflags(write=False)
        return a

    @cached_property
    def tables(self) -> "ProblemTables":
        """The flat per-problem tables the simulator, the lowering, the bounds
        and the solvers read (:class:`~libra_opt.ir.tables.ProblemTables`),
        built on first use and shared: safe because a problem is immutable."""
        from .tables import ProblemTables

        return ProblemTables(self)

    @cached_property
    def total_compute_s(self) -> float:
        """Sum of compute times: the step time without rematerialization (s)."""
        return float(self.node_time.sum())

    @cached_property
    def boundary(self) -> int:
        """Position of the first backward node (``num_nodes`` if none)."""
        for n in self.nodes:
            if n.phase == BACKWARD:
                return n.id
        return len(self.nodes)

    @cached_property
    def output_set(self) -> frozenset[int]:
        """``outputs`` as a frozenset, for membership tests."""
        return frozenset(self.outputs)

    @cached_property
    def input_bytes(self) -> int:
        """Bytes of graph-input storages (parameters, inputs, tangents)."""
        return sum(t.nbytes for t in self.tensors if t.kind == INPUT)

    def node_by_name(self, name: str) -> Node:
        """The node called ``name``; raises ``KeyError`` listing nothing else."""
        try:
            return self.nodes[self._names[name]]
        except KeyError:
            raise KeyError(f"no node named {name!r} in {self.name}") from None

    @cached_property
    def _names(self) -> dict[str, int]:
        return {n.name: n.id for n in self.nodes}

    def replace(self, **changes) -> "RematProblem":
        """A copy with some of ``nodes``, ``tensors``, ``outputs``, ``fixed``,
        ``device``, ``provenance``, ``name``, ``executor`` replaced (as
        :func:`dataclasses.replace`): the way to change a problem, which is
        immutable.

        Raises
        ------
        TypeError
            A keyword that is not one of those fields.
        ProblemError
            The copy breaks an invariant (it is validated as a new problem).
        """
        unknown = sorted(set(changes) - set(self._FIELDS))
        if unknown:
            raise TypeError(f"RematProblem.replace() got unknown field(s) {unknown}; use some of {self._FIELDS}")
        kw = {k: getattr(self, k) for k in self._FIELDS}
        kw.update(changes)
        return RematProblem(**kw)

    def with_device(self, **changes) -> "RematProblem":
        """A copy whose :class:`DeviceProfile` has ``changes`` applied."""
        return self.replace(device=dataclasses.replace(self.device, **changes))


def _immutable(name: str) -> str:
    """The message of the error raised on assigning or deleting attribute ``name``."""
    if name in RematProblem._FIELDS:
        return (f"RematProblem is immutable: cannot change {name!r} in place; build a changed copy with "
                f"problem.replace({name}=...)")
    return (f"RematProblem is immutable: cannot set or delete attribute {name!r}; build a changed copy with "
            f"problem.replace(...) (fields: {', '.join(RematProblem._FIELDS)})")


class ProblemBuilder:
    """Builds a :class:`RematProblem` op by op (tests, importers, capture).

    Example
    -------
    >>> b = ProblemBuilder()
    >>> x = b.input("x", 4)
    >>> (y,) = b.op("f", [x], [("y", 8)], time_s=1.0)
    >>> p = b.build(outputs=[y])
    """

    def __init__(self) -> None:
        self._nodes: list[dict] = []
        self._tensors: list[dict] = []

    def input(self, name: str, nbytes: int, *, shape=None, dtype=None) -> int:
        """Add a graph input (always resident); returns its tensor id."""
        tid = len(self._tensors)
        self._tensors.append(dict(id=tid, name=name, producer=None, storage=tid, nbytes=int(nbytes),
                                  kind=INPUT, shape=shape, dtype=dtype))
        return tid

    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[tuple], *, time_s: float = 0.0,
           target: str = "", phase: str = FORWARD, workspace_bytes: int = 0,
           recomputable: bool = True, module: str = "", pointwise: bool = False) -> tuple[int, ...]:
        """Add a node.

        ``outputs`` holds ``(name, nbytes)`` for a new storage, or
        ``(name, 0, view_of)`` for a view of tensor ``view_of``.  Returns the
        new tensor ids.
        """
        nid = len(self._nodes)
        outs = []
        for spec in outputs:
            tname, nbytes = spec[0], int(spec[1])
            tid = len(self._tensors)
            base = tid
            if len(spec) > 2 and spec[2] is not None:
                base = self._tensors[spec[2]]["storage"]
                nbytes = 0
            self._tensors.append(dict(id=tid, name=tname, producer=nid, storage=base, nbytes=nbytes,
                                      kind=ACTIVATION,
                                      shape=spec[3] if len(spec) > 3 else None,
                                      dtype=spec[4] if len(spec) > 4 else None))
            outs.append(tid)
        self._nodes.append(dict(id=nid, name=name, target=target or name, phase=phase, time_s=float(time_s),
                                workspace_bytes=int(workspace_bytes), recomputable=bool(recomputable),
                                inputs=tuple(dict.fromkeys(inputs)), outputs=tuple(outs), module=module,
                                pointwise=bool(pointwise)))
        return tuple(outs)

    def build(self, outputs: Iterable[int], **kwargs) -> RematProblem:
        """Finish: compute consumers and return the validated problem."""
        consumers: dict[int, list[int]] = {}
        for n in self._nodes:
            for t in n["inputs"]:
                consumers.setdefault(t, []).append(n["id"])
        nodes = [Node(**n) for n in self._nodes]
        tensors = [Tensor(consumers=tuple(consumers.get(t["id"], ())), **t) for t in self._tensors]
        return RematProblem(nodes, tensors, outputs, **kwargs)
