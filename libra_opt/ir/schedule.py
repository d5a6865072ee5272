"""The plan IR: a :class:`Schedule` is one instruction list every solver returns.

Instructions (``DESIGN.md``, "The plan IR"):

- ``Compute(node)``: run a node, first time or recompute; its outputs become resident.
- ``Free(tensor)``: drop a resident tensor; its storage is released once no
  tensor on it is resident (after any swap-out of it has finished).
- ``SwapOut(tensor)``: copy a base tensor's storage to pinned host memory on
  the device-to-host queue.
- ``SwapIn(tensor)``: copy it back on the host-to-device queue; the storage is
  allocated when the instruction is issued.
- ``Wait(tensor)``: the compute stream waits for the copy of ``tensor`` in
  flight, either direction:

  - after ``SwapIn(tensor)``: for that swap-in; the tensor is usable only
    after it;
  - otherwise after ``SwapOut(tensor)`` (typically after ``Free(tensor)``):
    for that copy out, so that a freed storage's bytes are released at that
    point (a stall where the copy has not ended yet).  The tensor's residency
    does not change.  This is how a plan makes memory go down where a forward
    pass produces activations faster than the link can move them.

  A ``Wait`` with no copy of the tensor in flight (never issued, or already
  waited for) is an error.  :func:`wait_kinds` tells the two apart.

Format versions: 1 has no swap-out waits; 2 adds them.  :meth:`Schedule.to_dict`
writes version 1 for a schedule without swap-out waits (older readers read
it) and 2 otherwise; :meth:`Schedule.from_dict` reads both.

The same shape as Rockmate's ``OpSchedule`` (``ComputeOp``/``DeleteOp``/
``OffloadOp``/``PrefetchOp``), one list shared by every solver.
"""
from __future__ import annotations

import json
from enum import IntEnum
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from .problem import RematProblem

SCHEDULE_SCHEMA = "libra-opt/schedule"
#: the newest schedule format version (2: ``Wait`` also waits for a swap-out)
SCHEDULE_VERSION = 2
#: every version this libra-opt reads
SCHEDULE_VERSIONS = (1, 2)


class Op(IntEnum):
    """Instruction opcodes."""

    COMPUTE = 0
    FREE = 1
    SWAP_OUT = 2
    SWAP_IN = 3
    WAIT = 4


_OP_NAMES = {Op.COMPUTE: "Compute", Op.FREE: "Free", Op.SWAP_OUT: "SwapOut", Op.SWAP_IN: "SwapIn",
             Op.WAIT: "Wait"}
_NAME_OPS = {v: k for k, v in _OP_NAMES.items()}


class Instr(NamedTuple):
    """One instruction: ``op`` and its argument (a node id for ``COMPUTE``, a
    tensor id otherwise)."""

    op: Op
    arg: int

    def __repr__(self) -> str:
        return f"{_OP_NAMES[self.op]}({self.arg})"

    def describe(self, problem: "RematProblem | None" = None) -> str:
        """Text with names, e.g. ``Compute(addmm_3)``, when a problem is given."""
        if problem is None:
            return repr(self)
        if self.op == Op.COMPUTE:
            return f"Compute({problem.nodes[self.arg].name})"
        return f"{_OP_NAMES[self.op]}({problem.tensors[self.arg].name})"


def Compute(node: int) -> Instr:
    """Run node ``node`` (first computation or recomputation)."""
    return Instr(Op.COMPUTE, int(node))


def Free(tensor: int) -> Instr:
    """Drop resident tensor ``tensor``."""
    return Instr(Op.FREE, int(tensor))


def SwapOut(tensor: int) -> Instr:
    """Copy base tensor ``tensor``'s storage to host (device-to-host queue)."""
    return Instr(Op.SWAP_OUT, int(tensor))


def SwapIn(tensor: int) -> Instr:
    """Copy ``tensor``'s storage back to the device (host-to-device queue)."""
    return Instr(Op.SWAP_IN, int(tensor))


def Wait(tensor: int) -> Instr:
    """Make the compute stream wait for the copy of ``tensor`` in flight: its
    swap-in if one is issued and not yet waited for, otherwise its swap-out
    (the storage's bytes are then released once the copy ends)."""
    return Instr(Op.WAIT, int(tensor))


def wait_kinds(instructions: Iterable[Instr]) -> dict[int, Op]:
    """Which copy each ``Wait`` waits for: instruction index -> ``Op.SWAP_IN``
    or ``Op.SWAP_OUT``, decided from the instruction order alone.

    A ``Wait(t)`` waits for the swap-in of ``t`` if a ``SwapIn(t)`` is issued
    and not yet waited for, else for the swap-out of ``t`` if a ``SwapOut(t)``
    is issued and neither waited for nor followed by a ``SwapIn(t)`` (a
    swap-in starts after the copy out anyway).  A ``Wait`` matching neither
    is left out (the simulator rejects it).
    """
    inflight_in: set[int] = set()
    inflight_out: set[int] = set()
    out: dict[int, Op] = {}
    for k, (op, a) in enumerate(instructions):
        if op == Op.SWAP_OUT:
            inflight_out.add(a)
        elif op == Op.SWAP_IN:
            inflight_in.add(a)
            inflight_out.discard(a)
        elif op == Op.WAIT:
            if a in inflight_in:
                inflight_in.discard(a)
                out[k] = Op.SWAP_IN
            elif a in inflight_out:
                inflight_out.discard(a)
                out[k] = Op.SWAP_OUT
    return out


class Schedule:
    """An instruction list plus free-form metadata (``meta``: solver name,
    options, decisions, explanations).

    Parameters
    ----------
    instructions : iterable of Instr
    meta : dict, optional
        JSON-serialisable metadata.
    """

    def __init__(self, instructions: Iterable[Instr], meta: dict | None = None):
        self.instructions: list[Instr] = [i if isinstance(i, Instr) else Instr(Op(i[0]), int(i[1]))
                                          for i in instructions]
        self.meta: dict = dict(meta or {})

    @classmethod
    def of(cls, instructions: list[Instr], meta: dict | None = None) -> "Schedule":
        """A schedule of ``instructions`` that are :class:`Instr` already (the
        lowering's, or another schedule's ``instructions``), copied as a list
        without the constructor's conversion of each (10 ms for the 200k
        instructions of a 20k-op plan); they are not checked, so pass only
        :class:`Instr` (the constructor converts ``(op, arg)`` pairs).
        ``meta`` as in the constructor."""
        new = cls.__new__(cls)
        new.instructions = list(instructions)
        new.meta = dict(meta or {})
        return new

    def with_meta(self, meta: dict) -> "Schedule":
        """A copy of this schedule (its own instruction list) with metadata ``meta``."""
        return Schedule.of(self.instructions, meta)

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self) -> Iterator[Instr]:
        return iter(self.instructions)

    def __getitem__(self, i):
        return self.instructions[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, Schedule) and self.instructions == other.instructions

    def __repr__(self) -> str:
        c = self.counts()
        return (f"Schedule({len(self)} instructions: {c['compute']} compute, {c['free']} free, "
                f"{c['swap_out']} swap-out, {c['swap_in']} swap-in)")

    def counts(self) -> dict[str, int]:
        """Number of instructions per opcode (keys ``compute``, ``free``,
        ``swap_out``, ``swap_in``, ``wait``)."""
        out = {op.name.lower(): 0 for op in Op}
        for ins in self.instructions:
            out[ins.op.name.lower()] += 1
        return out

    def recomputed_nodes(self) -> list[int]:
        """Node ids computed more than once, in first-recompute order."""
        seen: set[int] = set()
        again: dict[int, None] = {}
        for ins in self.instructions:
            if ins.op == Op.COMPUTE:
                if ins.arg in seen:
                    again[ins.arg] = None
                seen.add(ins.arg)
        return list(again)

    def swapped_tensors(self) -> list[int]:
        """Tensor ids swapped out at least once."""
        return list(dict.fromkeys(i.arg for i in self.instructions if i.op == Op.SWAP_OUT))

    def to_text(self, problem: "RematProblem | None" = None) -> str:
        """One instruction per line, with names when ``problem`` is given."""
        return "\n".join(f"{k:6d}  {ins.describe(problem)}" for k, ins in enumerate(self.instructions))

    # ---------------------------------------------------------------- JSON
    def waits_for_swap_out(self) -> bool:
        """True if some ``Wait`` waits for a swap-out (format version 2)."""
        if not any(i.op == Op.WAIT for i in self.instructions):
            return False
        return Op.SWAP_OUT in wait_kinds(self.instructions).values()

    def to_dict(self) -> dict:
        """JSON-ready dict: schema, version, meta and ``[op name, arg]`` pairs.
        The version is 1 unless some ``Wait`` waits for a swap-out (then 2), so
        that a libra-opt reading only version 1 reads every plan it can run."""
        version = SCHEDULE_VERSION if self.waits_for_swap_out() else 1
        return {"schema": SCHEDULE_SCHEMA, "version": version, "meta": self.meta,
                "instructions": [[_OP_NAMES[i.op], i.arg] for i in self.instructions]}

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """Inverse of :meth:`to_dict`.

        Reads format versions 1 and 2 (:data:`SCHEDULE_VERSIONS`).
        Types are checked, never coerced: ``version`` and every instruction's
        argument must be JSON integers (not ``1.7``, ``"3"`` or ``true``), an
        op one of the instruction names, ``meta`` an object.

        Raises
        ------
        ProblemFileError
            A wrong schema or version or a mistyped field; ``field`` names it
            (``"instructions[12]"``).
        """
        from ..errors import ProblemFileError

        if not isinstance(d, dict) or d.get("schema") != SCHEDULE_SCHEMA:
            raise ProblemFileError(f"not a libra-opt schedule (expected schema {SCHEDULE_SCHEMA!r})", "schema")
        version = d.get("version")
        if not _is_int(version) or version not in SCHEDULE_VERSIONS:
            raise ProblemFileError(f"schedule version {version!r} is not supported; this libra-opt "
                                   f"reads versions {', '.join(map(str, SCHEDULE_VERSIONS))} (an integer): "
                                   f"upgrade libra-opt to read a newer plan", "version")
        items = d.get("instructions", [])
        if not isinstance(items, list):
            raise ProblemFileError(f"instructions must be a list of [op, int] pairs, not {type(items).__name__}",
                                   "instructions")
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise ProblemFileError(f"meta must be an object, not {type(meta).__name__}", "meta")
        out = []
        for k, item in enumerate(items):
            if (not isinstance(item, (list, tuple)) or len(item) != 2 or item[0] not in _NAME_OPS
                    or not _is_int(item[1]) or item[1] < 0):
                raise ProblemFileError(f"bad instruction {item!r}; expected [op, id] with op one of "
                                       f"{sorted(_NAME_OPS)} and id a non-negative integer (not a float, "
                                       f"string or boolean)", f"instructions[{k}]")
            out.append(Instr(_NAME_OPS[item[0]], item[1]))
        return cls(out, meta or {})

    def save(self, path) -> None:
        """Write JSON to ``path``, gzip-compressed if the name ends in ``.gz``.

        Written with :func:`libra_opt.atomic.atomic_write`: a failed or
        interrupted write leaves the old file, and no temporary file, behind.

        Raises
        ------
        OutputPathError
            ``path`` cannot be written (a missing or read-only directory, a
            full disk).
        """
        from ..atomic import atomic_write
        from .problem_io import gzip_bytes

        data = json.dumps(self.to_dict()).encode("utf-8")
        if str(path).endswith(".gz"):
            data = gzip_bytes(data)
        with atomic_write(path, "wb") as f:
            f.write(data)

    @classmethod
    def load(cls, path) -> "Schedule":
        """Read a schedule JSON file (gunzipped first if the name ends in ``.gz``).

        Raises
        ------
        FileNotFoundError
            No such file.
        ProblemFileError
            Not valid (gzip-compressed) JSON, or a bad field (see :meth:`from_dict`).
        """
        from .problem_io import read_json

        return cls.from_dict(read_json(path))


def _is_int(v) -> bool:
    """A JSON integer: ``int`` but not ``bool``."""
    return isinstance(v, int) and not isinstance(v, bool)


def no_remat_schedule(problem: "RematProblem") -> Schedule:
    """The plan eager PyTorch follows: every node once in eager order, each
    tensor freed right after its last use (outputs kept to the end).

    This is ``torch.fx``'s free-after-last-use schedule and the reference peak
    that relative budgets (``"60%"``) refer to.
    """
    last_use: dict[int, int] = {}
    for t in problem.tensors:
        if t.kind != "activation" or t.id in problem.output_set:
            continue
        last_use[t.id] = t.consumers[-1] if t.consumers else t.producer
    frees: dict[int, list[int]] = {}
    for t, pos in last_use.items():
        frees.setdefault(pos, []).append(t)
    out: list[Instr] = []
    for n in problem.nodes:
        out.append(Compute(n.id))
        for t in sorted(frees.get(n.id, ())):
            out.append(Free(t))
    return Schedule(out, {"solver": "none"})
