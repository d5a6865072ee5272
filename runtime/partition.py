"""Lowering a plan to two FX graphs: the forward part and the backward part.

A :class:`~libra_opt.schedule.Schedule` over a captured problem (node names
= FX node names of the joint graph) becomes the pair AOTAutograd's partition
hook returns:

- **forward part** = the instruction prefix up to the point where every
  forward-phase node has been computed once (plus the ``Free`` / ``SwapOut``
  instructions right after it).  Tensors resident, or on the host, at that
  point and used (or freed) later become the **saved values**: outputs of the forward
  graph after its ``num_fwd_outputs`` forward outputs, and the first
  placeholders of the backward graph (then the tangents), the calling
  convention of ``torch._functorch.partitioners._extract_fwd_bwd_modules``.
  A reload still in flight at that point is waited for in the forward graph.
- **backward part** = the rest.

Instructions map to graph nodes: ``Compute`` copies the joint node (a second
``Compute`` of a node is a recompute: the forward node copied into the graph
again, with fresh ``getitem`` nodes for its outputs); ``Free`` drops the
value: FX's generated code deletes each value after its last use, and where
the plan frees a value later than its last reader a :func:`release` node
marks the ``Free``, so the graphs' liveness is exactly the plan's (the
graphs use the boxed calling convention, so saved values are released inside
the backward graph too); ``SwapOut`` / ``SwapIn`` / ``Wait`` call
:class:`~libra_opt.runtime.swap.SwapManager` methods (a ``Wait`` for a
swap-out, see :func:`~libra_opt.schedule.wait_kinds`, calls
:meth:`~libra_opt.runtime.swap.SwapManager.wait_offload` on the host copy:
the compute stream waits for the copy and the storage returns to the
allocator there).  An output of a
recomputed node that is still resident keeps its value (the recomputed one
is dropped at once), exactly as the simulator counts it; this is also why a
recomputed functional BatchNorm never updates the running statistics twice:
the new statistics are forward outputs, copied into the buffers once by
AOTAutograd's epilogue.  A recompute of a random op (dropout, ``rand_like``)
runs as :func:`libra_opt.capture_passes.replay_random` with the generator
state saved just before its first run (a node of the joint graph, see
:func:`~libra_opt.capture_passes.make_random_ops_replayable`): the same random
numbers, and the generator left where the step had it.

Sources: ``torch._functorch.partitioners`` (``default_partition``,
``_extract_fwd_bwd_modules``) for the forward/backward calling convention;
Checkmate (Jain et al., MLSys 2020, sec. 4.3) for turning a schedule into an
executable graph.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from libra_opt.frontend.capture import mutated_primals, tensor_values
from libra_opt.frontend.capture_passes import RNG_STATE_META, replay_random
from libra_opt.errors import RuntimeExecutionError
from libra_opt.passes.interpreter import ScheduleInterpreter
from libra_opt.ir.problem import BACKWARD, FORWARD, RematProblem
from libra_opt.ir.schedule import Op, Schedule, wait_kinds

logger = logging.getLogger(__name__)

__all__ = ["LoweredPlan", "lower_plan", "release", "forward_split", "run_lowered", "check_graph_matches"]


@dataclass
class LoweredPlan:
    """A plan as a forward and a backward graph.

    Attributes
    ----------
    fw, bw : torch.fx.GraphModule
        Boxed calling convention: call with one list (it is cleared).
        ``fw([*primals]) -> [*forward outputs, *saved]``;
        ``bw([*saved, *tangents]) -> [one gradient or None per primal]``.
    num_fwd_outputs : int
    split : int
        Number of schedule instructions in the forward part.
    saved : list of str
        Names of the saved values (device tensors, then host buffers ``*_host``).
    recomputed : list of str
        Names of nodes computed more than once.
    swapped : list of str
        Names of tensors swapped out.
    """

    fw: fx.GraphModule
    bw: fx.GraphModule
    num_fwd_outputs: int
    split: int
    saved: list = field(default_factory=list)
    recomputed: list = field(default_factory=list)
    swapped: list = field(default_factory=list)


class _Binding:
    """Maps problem ids to the joint graph's FX nodes."""

    def __init__(self, joint: fx.GraphModule, problem: RematProblem):
        check_graph_matches(joint, problem)
        self.joint = joint
        self.problem = problem
        self.fx = {n.name: n for n in joint.graph.nodes}
        self.key_to_tid: dict[tuple[str, Any], int] = {}
        self.tid_index: list[Any] = []
        self.tid_fake: list[Any] = []
        self.tid_producer: list[fx.Node] = []
        for tid, (name, prod, idx, fake) in enumerate(tensor_values(joint)):
            self.key_to_tid.setdefault((prod.name, idx), tid)
            self.tid_index.append(idx)
            self.tid_fake.append(fake)
            self.tid_producer.append(prod)

    def tid_of(self, a: fx.Node) -> int | None:
        if a.op == "call_function" and a.target is operator.getitem:
            return self.key_to_tid.get((a.args[0].name, int(a.args[1])))
        return self.key_to_tid.get((a.name, None))


def check_graph_matches(joint: fx.GraphModule, problem: RematProblem) -> None:
    """Raise :class:`~libra_opt.errors.RuntimeExecutionError` unless ``problem``
    was built from a graph identical to ``joint`` (same nodes, targets, tensors)."""
    names = [(n.name, str(n.target)) for n in joint.graph.nodes
             if n.op == "call_function" and n.target is not operator.getitem]
    mine = [(n.name, n.target) for n in problem.nodes]
    tvals = [v[0] for v in tensor_values(joint)]
    if names != mine or tvals != [t.name for t in problem.tensors]:
        first = next((f"{a} vs {b}" for a, b in zip(names, mine) if a != b), f"{len(names)} vs {len(mine)} nodes")
        raise RuntimeExecutionError(
            "the model traced to a different graph than the one the plan was made for "
            f"(first difference: {first}); call it in the same mode (train/eval, autocast dtype, "
            "requires_grad of parameters) and with inputs of the same shapes as the example, or re-optimize")


def forward_split(problem: RematProblem, schedule: Schedule) -> int:
    """Number of instructions in the forward part of ``schedule``.

    The prefix ends at the instruction that computes the last forward-phase
    node not yet computed, extended over the ``Free`` and ``SwapOut``
    instructions that follow it.

    Raises
    ------
    RuntimeExecutionError
        Some forward-phase node is never computed.
    """
    todo = {n.id for n in problem.nodes if n.phase == FORWARD}
    k = 0
    if todo:
        for k, ins in enumerate(schedule.instructions):
            if ins.op == Op.COMPUTE:
                todo.discard(ins.arg)
                if not todo:
                    break
        if todo:
            name = problem.nodes[min(todo)].name
            raise RuntimeExecutionError(f"the plan never computes forward node {name!r}; it cannot be executed")
        k += 1
    else:
        k = 0
    instrs = schedule.instructions
    while k < len(instrs) and instrs[k].op in (Op.FREE, Op.SWAP_OUT):
        k += 1
    return k


def release(*values) -> None:
    """A graph node that marks where the plan frees ``values``: FX's generated
    code deletes each value after its last use, so a value the plan keeps
    beyond its last reader gets this node as its last use and is released
    exactly where the plan's ``Free`` is."""
    return None


def _host_fake(fake):
    """Fake value of a host buffer holding ``fake``'s storage (AOTAutograd
    reads ``meta["val"]`` of saved values)."""
    mode = getattr(fake, "fake_mode", None)
    nbytes = fake.untyped_storage().nbytes()
    if mode is None:
        return torch.empty(nbytes, dtype=torch.uint8, device="meta")
    with mode:
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu")


class _Emitter(ScheduleInterpreter):
    """Emits instructions into one FX graph: one handler per instruction,
    dispatched by :meth:`ScheduleInterpreter.walk` (``self.index`` is the
    instruction's position in the whole schedule)."""

    def __init__(self, b: _Binding, graph: fx.Graph, swap, last_swap_in: dict[int, int], phase: str,
                 out_waits: frozenset = frozenset()):
        super().__init__(b.problem)
        self.b = b
        self.out_waits = out_waits   # instruction indices of the Waits for a swap-out
        self.p = b.problem
        self.g = graph
        self.swap = swap
        self.last_swap_in = last_swap_in
        self.phase = phase
        self.env: dict[int, fx.Node] = {}       # tensor id -> usable value
        self.host: dict[int, fx.Node] = {}      # storage id -> host copy
        self.pending: dict[int, fx.Node] = {}   # tensor id -> reload in flight
        self.attrs: dict[str, fx.Node] = {}
        self.swapping: set[int] = set()         # storages offloaded in this graph (for poll)
        self.computed: set[int] = set()
        self.recomputed: list[str] = []
        self.last_read: set[fx.Node] = set()    # values read by the latest instruction's node
        self.last_made: set[fx.Node] = set()    # values made by the latest instruction
        self.to_release: list[fx.Node] = []
        self.need_poll = False

    def flush(self) -> None:
        """Emit one :func:`release` node for the values freed since the last flush."""
        if self.to_release:
            self.g.call_function(release, tuple(dict.fromkeys(self.to_release)))
            self.to_release = []
        if self.need_poll or (self.swapping and self.swap is not None and self.swap.cuda):
            # drop the references to storages whose copy-out has finished since the last poll
            self.g.call_function(self.swap.poll, ())
            self.need_poll = False

    def value(self, a: fx.Node, user: str) -> fx.Node:
        if a.op == "get_attr":
            if a.target not in self.attrs:
                nd = self.g.get_attr(a.target)
                nd.meta = dict(a.meta)
                self.attrs[a.target] = nd
            return self.attrs[a.target]
        tid = self.b.tid_of(a)
        if tid is None:
            raise RuntimeExecutionError(f"node {user!r} reads {a.name!r}, which is not a tensor of the problem")
        if tid not in self.env:
            self.not_resident(tid, user)
        return self.env[tid]

    def not_resident(self, tid: int, user: str):
        """Raise: node ``user`` reads tensor ``tid``, which the plan does not keep resident here."""
        where = "the forward part" if self.phase == FORWARD else "the backward part"
        raise RuntimeExecutionError(
            f"plan error in {where}: node {user!r} reads tensor {self.p.tensors[tid].name!r}, which is not "
            f"resident there (check the plan with libra_opt.simulate)")

    def compute(self, nid: int) -> None:
        node = self.p.nodes[nid]
        jn = self.b.fx[node.name]
        args = fx.map_arg(jn.args, lambda a: self.value(a, node.name))
        kwargs = fx.map_arg(jn.kwargs, lambda a: self.value(a, node.name))
        for t in node.inputs:          # inputs the graph node does not read (a saved RNG state) must be resident too
            if t not in self.env and self.b.tid_producer[t].op != "get_attr":
                self.not_resident(t, node.name)
        target = jn.target
        if nid in self.computed and RNG_STATE_META in jn.meta:
            # recompute of a random op: replay the generator state saved before its first run
            state = self.value(self.b.fx[jn.meta[RNG_STATE_META]], node.name)
            target, args = replay_random, (state, jn.target, *args)
        self.flush()
        new = self.g.create_node("call_function", target, args, kwargs, name=jn.name)
        new.meta = dict(jn.meta)
        self.last_read = set(new.all_input_nodes)
        self.last_made = {new}
        if nid in self.computed:
            self.recomputed.append(node.name)
        self.computed.add(nid)
        for tid in node.outputs:
            if tid in self.env:
                continue           # still resident: keep it (the simulator does the same)
            idx = self.b.tid_index[tid]
            if idx is None:
                self.env[tid] = new
            else:
                gi = self.g.call_function(operator.getitem, (new, idx))
                gi.meta = {"val": self.b.tid_fake[tid]}
                self.env[tid] = gi
                self.last_made.add(gi)

    def free(self, tid: int) -> None:
        v = self.env.pop(tid, None)
        # FX deletes v after its last reader; when that is the instruction just before this Free (or v
        # was just made and is never read) that is where the plan frees it; otherwise mark the Free
        if v is not None and not (v in self.last_read or (v in self.last_made and not v.users)):
            if v not in self.host.values():
                self.to_release.append(v)
        if self.p.tensors[tid].storage in self.swapping and self.swap is not None and self.swap.cuda:
            self.need_poll = True

    def swap_out(self, tid: int) -> None:
        t = self.p.tensors[tid]
        if t.nbytes == 0:     # a 0-byte storage (view of a graph input): keep the reference
            self.host[tid] = self.env[tid]
            return
        if self.swap is None:
            raise RuntimeExecutionError("the plan swaps but no SwapManager was given")
        self.flush()
        nd = self.g.call_function(self.swap.offload, (self.env[tid],))
        self.last_read, self.last_made = {self.env[tid]}, {nd}
        nd.meta = {"val": _host_fake(self.b.tid_fake[tid])}
        self.host[tid] = nd
        self.swapping.add(tid)

    def swap_in(self, tid: int) -> None:
        t = self.p.tensors[tid]
        if t.nbytes == 0:
            self.pending[tid] = self.host[tid]
            return
        self.flush()
        fake = self.b.tid_fake[tid]
        nd = self.g.call_function(self.swap.reload, (self.host[tid], fake.dtype, list(fake.shape),
                                                     list(fake.stride()), int(fake.storage_offset()),
                                                     self.last_swap_in.get(tid) == self.index))
        nd.meta = {"val": fake}
        self.pending[tid] = nd
        self.last_read, self.last_made = {self.host[tid]}, {nd}

    def wait_out(self, tid: int) -> None:
        """A ``Wait`` for the swap-out of ``tid``: the compute stream waits for
        the copy into its host buffer, and the storage is released there."""
        if self.p.tensors[tid].nbytes == 0:
            return
        self.flush()
        host = self.host[tid]
        self.g.call_function(self.swap.wait_offload, (host,))
        self.last_read, self.last_made = {host}, set()

    def wait(self, tid: int) -> None:
        if self.index in self.out_waits:
            self.wait_out(tid)
            return
        if tid not in self.pending and tid in self.env:
            return                 # waited for at the end of the forward part already
        src = self.pending.pop(tid)
        if self.p.tensors[tid].nbytes == 0:
            self.env[tid] = src
            return
        self.flush()
        nd = self.g.call_function(self.swap.wait, (src,))
        nd.meta = dict(src.meta)
        self.env[tid] = nd
        self.last_read, self.last_made = {src}, {nd}

    def walk(self, instructions, first: int = 0) -> None:
        """Emit ``instructions`` (the first is instruction ``first`` of the
        schedule); a value the plan reads but never made available is a
        :class:`~libra_opt.errors.RuntimeExecutionError` naming the instruction."""
        try:
            super().walk(instructions, first)
        except KeyError as e:
            ins = instructions[self.index - first]
            raise RuntimeExecutionError(f"instruction {self.index} ({ins.describe(self.p)}): the plan refers to a "
                                        f"value that is not available ({e}); check it with "
                                        f"libra_opt.simulate") from None


class _SavedValues(ScheduleInterpreter):
    """Liveness of the forward part's values over the backward part's
    instructions: which tensors / host copies the backward part reads, or
    frees, before redefining them (see :func:`_needed_after`)."""

    def __init__(self, problem: RematProblem, env: set[int], host: set[int], out_waits: frozenset = frozenset()):
        super().__init__(problem)
        self.out_waits = out_waits   # instruction indices of the Waits for a swap-out (they read the host copy)
        self.origin = {t: True for t in env}     # True: value comes from the forward part
        self.horigin = {t: True for t in host}
        self.need_env: dict[int, None] = {}
        self.need_host: dict[int, None] = {}

    def compute(self, nid: int) -> None:
        node = self.problem.nodes[nid]
        for t in node.inputs:
            if self.origin.get(t):
                self.need_env[t] = None
        for t in node.outputs:
            self.origin.setdefault(t, False)

    def free(self, tid: int) -> None:
        if self.origin.pop(tid, None):
            self.need_env[tid] = None        # the plan keeps it resident into the backward part

    def swap_out(self, tid: int) -> None:
        if self.origin.get(tid):
            self.need_env[tid] = None
        self.horigin[tid] = False

    def swap_in(self, tid: int) -> None:
        if self.horigin.get(tid):
            self.need_host[tid] = None

    def wait(self, tid: int) -> None:
        if self.index in self.out_waits:
            if self.horigin.get(tid):
                self.need_host[tid] = None
            return
        self.origin.setdefault(tid, False)

    def read_at_end(self, tids) -> None:
        """The backward graph's outputs read ``tids``."""
        for t in tids:
            if self.origin.get(t):
                self.need_env[t] = None


def _needed_after(problem: RematProblem, instrs, env: set[int], host: set[int], end_uses: list[int],
                  out_waits: frozenset = frozenset(), start: int = 0):
    """Tensors of ``env`` / storages of ``host`` that instructions ``instrs``
    (then the backward outputs ``end_uses``) read, or free, before redefining
    them: a value the plan frees only in the backward part stays resident
    until then, as the simulator counts it.  ``out_waits``: indices (the
    first instruction being ``start``) of the Waits for a swap-out, which
    read the host copy."""
    live = _SavedValues(problem, env, host, out_waits)
    live.walk(instrs, start)
    live.read_at_end(end_uses)
    return sorted(live.need_env), sorted(live.need_host)


def lower_plan(joint: fx.GraphModule, num_fwd_outputs: int, problem: RematProblem, schedule: Schedule,
               swap=None) -> LoweredPlan:
    """Build the forward and backward graphs of ``schedule``.

    Parameters
    ----------
    joint : torch.fx.GraphModule
        The joint graph (as given to AOTAutograd's partition hook).
    num_fwd_outputs : int
    problem : RematProblem
        Built from ``joint`` by :func:`libra_opt.capture.build_problem`.
    schedule : Schedule
        A plan the simulator accepts for ``problem``.
    swap : SwapManager, optional
        Needed if the plan swaps.

    Returns
    -------
    LoweredPlan

    Raises
    ------
    RuntimeExecutionError
        ``problem`` does not match ``joint``, the plan reads a value that is
        not resident, or never computes a forward node.
    """
    b = _Binding(joint, problem)
    instrs = schedule.instructions
    split = forward_split(problem, schedule)
    last_swap_in = {}
    for k, ins in enumerate(instrs):
        if ins.op == Op.SWAP_IN:
            last_swap_in[ins.arg] = k
    out_waits = frozenset(k for k, op in wait_kinds(instrs).items() if op == Op.SWAP_OUT)
    out_node = next(iter(joint.graph.find_nodes(op="output")))
    outs = list(out_node.args[0])
    fwd_outs, bwd_outs = outs[:num_fwd_outputs], outs[num_fwd_outputs:]
    placeholders = list(joint.graph.find_nodes(op="placeholder"))
    primal_ph = [n for n in placeholders if not n.name.startswith("tangents")]
    tangent_ph = [n for n in placeholders if n.name.startswith("tangents")]

    # ---------------------------------------------------------------- forward
    fg = fx.Graph()
    fe = _Emitter(b, fg, swap, last_swap_in, FORWARD, out_waits)
    for ph in primal_ph:
        nd = fg.placeholder(ph.name)
        nd.meta = dict(ph.meta)
        fe.env[b.tid_of(ph)] = nd
    fe.walk(instrs[:split], 0)
    for tid in list(fe.pending):            # a reload still in flight: wait for it here
        fe.wait(tid)
    fe.flush()

    def fmap(em: _Emitter, a, what: str):
        if not isinstance(a, fx.Node):
            return a
        return em.value(a, what)

    fwd_vals = [fmap(fe, a, "forward output") for a in fwd_outs]
    end_uses = [b.tid_of(a) for a in bwd_outs if isinstance(a, fx.Node) and a.op != "get_attr"]
    tangent_ids = {b.tid_of(ph) for ph in tangent_ph}
    need_env, need_host = _needed_after(problem, instrs[split:], set(fe.env) | tangent_ids, set(fe.host),
                                        [t for t in end_uses if t is not None], out_waits, split)
    need_env = [t for t in need_env if t not in tangent_ids]
    # Saved values: tensors autograd checks for in-place changes first, then the ones it must not check
    # (AOTAutograd's convention, "saved_tensor_with_no_vc_check" last): primals the step mutates (the
    # epilogue updates BatchNorm statistics after the forward; only a discarded output of a recompute
    # reads them) and our host buffers (views of one pooled chunk, whose version counter other
    # offloads bump).
    mutated = {b.tid_of(n) for n in primal_ph if n.name in set(mutated_primals(joint, num_fwd_outputs))}
    need_env = [t for t in need_env if t not in mutated] + [t for t in need_env if t in mutated]
    saved_vals = [fe.env[t] for t in need_env] + [fe.host[t] for t in need_host]
    for t in need_env:
        if t in mutated:
            fe.env[t].meta["saved_tensor_with_no_vc_check"] = True
    for t in need_host:
        fe.host[t].meta["saved_tensor_with_no_vc_check"] = True
    fg.output(tuple(fwd_vals + saved_vals))

    # ---------------------------------------------------------------- backward
    bg = fx.Graph()
    be = _Emitter(b, bg, swap, last_swap_in, BACKWARD, out_waits)
    be.computed = set(fe.computed)
    be.swapping = set(fe.swapping)          # copies issued in the forward may still be in flight
    saved_names = []
    for t in need_env:
        nm = problem.tensors[t].name
        nd = bg.placeholder(nm)
        nd.meta = dict(fe.env[t].meta)
        be.env[t] = nd
        saved_names.append(nd.name)
    for t in need_host:
        nd = bg.placeholder(problem.tensors[t].name + "_host")
        nd.meta = dict(fe.host[t].meta)
        be.host[t] = nd
        saved_names.append(nd.name)
    for ph in tangent_ph:
        nd = bg.placeholder(ph.name)
        nd.meta = dict(ph.meta)
        be.env[b.tid_of(ph)] = nd
    be.walk(instrs[split:], split)
    be.flush()
    if be.pending:
        names = ", ".join(problem.tensors[t].name for t in be.pending)
        raise RuntimeExecutionError(f"the plan swaps in {names} but never waits for it")
    bwd_vals = [fmap(be, a, "gradient output") for a in bwd_outs]
    bg.output(tuple(bwd_vals))

    fw = _module(joint, fg, "LibraForward")
    bw = _module(joint, bg, "LibraBackward")
    recomputed = list(dict.fromkeys(fe.recomputed + be.recomputed))
    swapped = [problem.tensors[t].name for t in schedule.swapped_tensors()]
    logger.debug("lowered plan: %d forward instructions, %d saved values, %d recomputed nodes, %d swapped",
                 split, len(saved_names), len(recomputed), len(swapped))
    return LoweredPlan(fw=fw, bw=bw, num_fwd_outputs=num_fwd_outputs, split=split, saved=saved_names,
                       recomputed=recomputed, swapped=swapped)


def _module(root: fx.GraphModule, graph: fx.Graph, name: str) -> fx.GraphModule:
    from torch.fx.graph import _BoxedCodeGen

    graph.set_codegen(_BoxedCodeGen())
    graph.lint()
    return fx.GraphModule(root, graph, class_name=name)


def run_lowered(lowered: LoweredPlan, primals, tangents) -> tuple[list, list]:
    """Run a lowered plan directly, as AOTAutograd would (no autograd):
    ``(forward outputs, gradients)``.

    Runs under ``torch.no_grad()`` like AOTAutograd's compiled forward and
    backward.  Used by tests and by the CPU allocation-tracker measurements.
    """
    with torch.no_grad():
        out = lowered.fw([t.detach() if isinstance(t, torch.Tensor) else t for t in primals])
        out = list(out)
        n = lowered.num_fwd_outputs
        fwd, saved = out[:n], out[n:]
        del out
        args = saved + [t.detach() for t in tangents]
        del saved
        grads = lowered.bw(args)
    return fwd, list(grads)
