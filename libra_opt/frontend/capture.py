"""Capture: one training step of a model as a joint forward+backward aten graph.

:func:`capture` traces ``model(*args, **kwargs)`` (optionally followed by a
loss) with ``torch.compile(fullgraph=True, dynamic=False)`` and a backend built
from AOTAutograd (``torch._dynamo.backends.common.aot_autograd``).  The
partition hook receives the **joint graph**: a functionalized aten graph whose
placeholders are the primals (parameters, buffers, inputs: dynamo lifts
parameters and buffers as graph inputs) followed by the tangents, and whose
outputs are the forward outputs followed by one gradient per primal.  The hook
keeps the graph and aborts compilation, so the model's forward never runs:
buffers (BatchNorm running statistics) and the RNG state are left untouched.

:func:`build_problem` turns a :class:`CapturedStep` into the common problem IR
(:class:`~libra_opt.problem.RematProblem`): one node per ``call_function``
node (``getitem`` folded into its producer's outputs), storages from the fake
tensors' storages (views and ``_unsafe_view`` alias their base and own 0
bytes), node names equal to FX node names so that a plan maps back to the
graph.

Sources: PyTorch 2 (Ansel et al., ASPLOS 2024): TorchDynamo and AOTAutograd;
``torch._functorch.partitioners.default_partition`` (forward/backward split by
the ``partitioner_tag`` node metadata).  Checkmate (Jain et al., MLSys 2020,
sec. 3) for the graph-as-problem formulation.
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import operator
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from .. import CallableModule
from .capture_passes import RNG_STATE_META, storage_key, apply_graph_passes, apply_joint_passes, draws_random
from ..passes.costs import is_fusible_op
from ..errors import CaptureError
from ..ir.problem import (BACKWARD, FORWARD, INPUT, DeviceProfile, FixedMemory, Node, Provenance, RematProblem,
                          Tensor)

logger = logging.getLogger(__name__)

__all__ = ["CapturedStep", "capture", "step_function", "autocast_context", "example_input_shapes",
           "check_example_shapes", "example_tangents", "build_problem", "mutated_primals", "node_phase", "tensor_values", "fx_tensor_name",
           "OPTIMIZER_STATE_FACTOR", "GraphCaptured", "run_capture", "finish_capture", "check_data_independent"]

#: bytes of optimizer state per byte of trainable parameters
OPTIMIZER_STATE_FACTOR = {"none": 0, "sgd": 1, "adam": 2, "adamw": 2}


@dataclass
class CapturedStep:
    """One captured training step.

    Attributes
    ----------
    joint : torch.fx.GraphModule
        The joint forward+backward aten graph, as given to AOTAutograd's
        partition hook.  Placeholders ``primals_1..k`` then ``tangents_1..m``;
        outputs: ``num_fwd_outputs`` forward outputs (updated buffers, user
        outputs), then one gradient (or ``None``) per primal.
    num_fwd_outputs : int
    primals : list of torch.Tensor
        Real values for the primal placeholders, in placeholder order (the
        model's parameter and buffer objects themselves, and the inputs).
    primal_kinds : list of str
        ``"parameter"``, ``"buffer"`` or ``"input"`` per primal.
    tangents : list of torch.Tensor
        Real tangents for the tangent placeholders: ones for a scalar (the
        loss); for the other outputs zeros when a scalar output exists (what
        ``loss.backward()`` feeds them), ones otherwise.
    autocast_dtype : torch.dtype or None
        The autocast dtype the step was traced under.
    model_name : str
    example_shapes : list of tuple
        Shapes of the ``"input"`` primals (the runtime checks calls against them).
    passes : dict of str to int
        Rewrites made by the capture-fidelity passes, per pass
        (:mod:`libra_opt.capture_passes`).
    """

    joint: fx.GraphModule
    num_fwd_outputs: int
    primals: list
    primal_kinds: list
    tangents: list
    autocast_dtype: torch.dtype | None
    model_name: str
    example_shapes: list = field(default_factory=list)
    passes: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        """Device of the captured tensors (first parameter, else first primal)."""
        for t, k in zip(self.primals, self.primal_kinds):
            if k == "parameter":
                return t.device
        return self.primals[0].device if self.primals else torch.device("cpu")

    def placeholders(self) -> tuple[list[fx.Node], list[fx.Node]]:
        """Primal and tangent placeholder nodes of :attr:`joint`."""
        ph = list(self.joint.graph.find_nodes(op="placeholder"))
        prim = [n for n in ph if not n.name.startswith("tangents")]
        tang = [n for n in ph if n.name.startswith("tangents")]
        return prim, tang


class GraphCaptured(Exception):
    """Raised by a capture backend's partition hook to stop compilation once
    the joint graph is in hand (:func:`capture`,
    :func:`~libra_opt.runtime.split.capture_pieces`); :func:`run_capture`
    catches it, also when TorchDynamo wraps it in ``BackendCompilerFailed``.
    Never reaches the user."""


def _never_compile(gm, example_inputs):  # pragma: no cover - compilation is aborted before
    raise AssertionError("capture aborts before the forward compiler runs")


def _model_device(model: nn.Module, args, kwargs) -> torch.device:
    for p in model.parameters():
        return p.device
    for t in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast(device.type, dtype)`` or a null context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _describe_break(e: BaseException) -> str:
    msg = str(e).strip()
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    return "\n".join(lines[:12])


_step_counter = itertools.count()


def step_function(model: nn.Module, loss_fn: Callable | None = None, *, autocast_dtype: torch.dtype | None = None,
                  device: torch.device | None = None) -> Callable:
    """``model(*args, **kwargs)`` (then ``loss_fn`` of it) as a function with a
    code object of its own, run under ``torch.autocast(device.type,
    autocast_dtype)`` when ``autocast_dtype`` is given.

    TorchDynamo caches compiled frames per code object, and every cache entry
    counts against ``torch._dynamo.config.recompile_limit``.  Compiling a fresh
    code object per capture / per optimized module keeps them from evicting
    each other or the user's own compiled code, and yields the same graph
    (same node names) every time for the same model, inputs and loss.

    The autocast region is inside the traced function, so it covers the
    forward and the loss only, as in eager mixed-precision training
    (``with autocast: loss = ...`` then ``loss.backward()`` outside): under an
    ambient autocast AOTAutograd would trace the backward under autocast too,
    running backward matmuls of fp32 regions in the low dtype and recasting
    gradients (source: the ``torch.autocast`` docs, "backward passes under
    autocast are not recommended"; TorchDynamo traces the context manager into
    the graph).
    """

    if autocast_dtype is None:
        def libra_step(*args, **kwargs):
            out = model(*args, **kwargs)
            return out if loss_fn is None else loss_fn(out)
    else:
        device_type = torch.device(device if device is not None else _model_device(model, (), {})).type

        def libra_step(*args, **kwargs):
            with torch.autocast(device_type=device_type, dtype=autocast_dtype):
                out = model(*args, **kwargs)
                return out if loss_fn is None else loss_fn(out)

    code = libra_step.__code__.replace(co_name=f"libra_step_{next(_step_counter)}")
    fn = types.FunctionType(code, libra_step.__globals__, code.co_name, libra_step.__defaults__,
                            libra_step.__closure__)
    fn.__qualname__ = code.co_name
    return fn


def capture(model: nn.Module, args: tuple = (), kwargs: dict | None = None, *,
            autocast_dtype: torch.dtype | None = None, loss_fn: Callable | None = None) -> CapturedStep:
    """Capture one training step of ``model`` as a joint forward+backward graph.

    Parameters
    ----------
    model : torch.nn.Module
        In the mode it will be trained in (``model.train()``); its forward
        must be one graph (no graph break).
    args, kwargs :
        Example inputs; their shapes are the ones the step is made for.
    autocast_dtype : torch.dtype, optional
        Trace the forward and the loss under ``torch.autocast(device.type,
        autocast_dtype)``; the backward runs outside it, as in eager
        mixed-precision training (see :func:`step_function`).
    loss_fn : callable, optional
        ``loss_fn(output) -> scalar tensor``; if given the captured function
        is model plus loss (one scalar output).

    Returns
    -------
    CapturedStep

    Raises
    ------
    CaptureError
        The forward has a graph break or an unsupported op; the message names
        it (from ``torch._dynamo.exc.Unsupported``).

    Notes
    -----
    The forward is traced with fake tensors only; it is not executed, so
    buffers and the RNG state are unchanged.  Uses ``torch.compile`` with an
    AOTAutograd backend whose ``partition_fn`` keeps the joint graph.
    """
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    kwargs = dict(kwargs or {})
    device = _model_device(model, args, kwargs)
    fn = step_function(model, loss_fn, autocast_dtype=autocast_dtype, device=device)
    box: dict[str, Any] = {}

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
        box["passes"].update(apply_joint_passes(joint, num_fwd_outputs))
        box["joint"] = joint
        box["num_fwd_outputs"] = num_fwd_outputs
        raise GraphCaptured()

    def backend(gm, example_inputs):
        box["primals"] = list(example_inputs)
        box["passes"] = apply_graph_passes(gm)
        return aot_autograd(fw_compiler=_never_compile, bw_compiler=_never_compile,
                            partition_fn=partition)(gm, example_inputs)

    name = type(model).__name__
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
    try:
        return run_capture(box, compiled, model, args, kwargs, autocast_dtype, name)
    finally:
        # TorchDynamo may keep the backend (and so ``box``) alive after this call: without this, the
        # parameters and their gradients of every captured model stay allocated (seen across max-batch
        # probes), also when the capture fails
        box.clear()


def run_capture(box: dict, compiled, model: nn.Module, args: tuple, kwargs: dict, autocast_dtype,
                name: str) -> "CapturedStep":
    """Run ``compiled`` once (its backend fills ``box`` and aborts with
    :class:`GraphCaptured`), translate TorchDynamo's and AOTAutograd's errors
    into :class:`CaptureError`, and build the :class:`CapturedStep` from
    ``box`` (:func:`finish_capture`).

    Parameters
    ----------
    box : dict
        Filled by the backend: ``"joint"`` (the joint ``fx.GraphModule``),
        ``"num_fwd_outputs"`` (int), ``"primals"`` (the example inputs
        TorchDynamo passed, tensors), ``"passes"`` (dict of the graph passes
        applied, :func:`~libra_opt.capture_passes.apply_graph_passes`).
    compiled : callable
        The step under ``torch.compile`` with that backend.
    model : torch.nn.Module
    args, kwargs :
        The example inputs of the step.
    autocast_dtype : torch.dtype or None
        Recorded on the step.
    name : str
        The model's name, for messages.

    Raises
    ------
    CaptureError
        A graph break, a data-dependent branch or size, an AOTAutograd
        failure, or no joint graph (nothing requires grad); the message says
        what to change.
    """
    import torch._dynamo
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        with torch.enable_grad():
            compiled(*args, **kwargs)
    except GraphCaptured:
        pass
    except torch._dynamo.exc.BackendCompilerFailed as e:
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if not isinstance(inner, GraphCaptured):
            raise CaptureError(f"capturing {name}: AOTAutograd failed on the traced graph: "
                               f"{_describe_break(inner or e)}") from e
    except GuardOnDataDependentSymNode as e:
        raise CaptureError(f"{name}: a Python branch or size depends on tensor data ({_describe_break(e)})\n"
                           f"{_DATA_DEPENDENT_HINT}") from e
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.TorchDynamoException) as e:
        raise CaptureError(f"{name} does not capture as one graph (graph break): {_describe_break(e)}\n"
                           f"Remove the break (a print, logging, .item() or a data-dependent Python branch), "
                           f"or move it outside the model; for a transformers model set model.loss_type or "
                           f"compute the loss with loss_fn=") from e
    if "joint" not in box:
        raise CaptureError(f"{name}: no joint graph was produced; does the step compute anything that "
                           f"requires grad? (call model.train() and make sure parameters require grad)")
    return finish_capture(model, box, autocast_dtype, name)


_DATA_DEPENDENT_HINT = ("A plan needs every value's size before the step runs: move .item() / float(t) / "
                        "t.tolist() and data-dependent ops (nonzero, masked_select, boolean-mask indexing, "
                        "unique) out of the model, or use fixed-shape forms (torch.where(mask, x, 0), a "
                        "multiplication by the mask)")


def check_data_independent(joint: fx.GraphModule, name: str) -> None:
    """Check that every value of ``joint`` has a size known before the step
    runs (a plan needs every value's bytes).

    Raises
    ------
    CaptureError
        Naming the first op of ``joint`` whose result (a Python number from
        ``.item()``, or a tensor whose size depends on its values, e.g.
        ``torch.nonzero``) is data-dependent: an unbacked symbol in its fake
        value (``torch.fx.experimental.symbolic_shapes.free_unbacked_symbols``),
        with where it is in the model's source and the fixed-shape forms to
        use instead.  ``name`` is the model's name, for the message.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for n in joint.graph.nodes:
        if n.op != "call_function" or not free_unbacked_symbols(n.meta.get("val")):
            continue
        op = getattr(n.target, "_opname", None) or getattr(n.target, "__name__", str(n.target))
        what = (".item() (or float(t), int(t), t.tolist()): a Python number read from a tensor"
                if op == "_local_scalar_dense" else f"torch.{op}: a tensor whose size depends on its values")
        where = [ln.strip() for ln in (n.meta.get("stack_trace") or "").splitlines()
                 if ln.strip() and set(ln.strip()) - set("^~ ")]
        at = f" ({where[-2]}: {where[-1]})" if len(where) >= 2 else ""
        raise CaptureError(f"{name} computes {what}{at}; aten op {n.target}, node {n.name}.\n"
                           f"{_DATA_DEPENDENT_HINT}")


def finish_capture(model: nn.Module, box: dict, autocast_dtype, name: str) -> CapturedStep:
    """The :class:`CapturedStep` of a filled capture ``box`` (keys as in
    :func:`run_capture`): checks that the graph is data-independent
    (:func:`check_data_independent`) and that the primals match the joint
    graph's placeholders, classifies each primal as ``"parameter"``,
    ``"buffer"`` or ``"input"`` of ``model``, and makes the example tangents
    (:func:`example_tangents`).

    Raises
    ------
    CaptureError
        A data-dependent value; primals that do not match the placeholders
        (count, shape or dtype: duplicated or aliased inputs); a tangent
        without tensor metadata.
    """
    check_data_independent(box["joint"], name)
    joint: fx.GraphModule = box["joint"]
    step = CapturedStep(joint=joint, num_fwd_outputs=box["num_fwd_outputs"], primals=[], primal_kinds=[],
                        tangents=[], autocast_dtype=autocast_dtype, model_name=name, passes=dict(box["passes"]))
    prim_ph, tang_ph = step.placeholders()
    primals = box["primals"]
    if len(primals) != len(prim_ph):
        raise CaptureError(f"{name}: the joint graph has {len(prim_ph)} primal inputs but dynamo passed "
                           f"{len(primals)} example inputs (duplicated or aliased inputs?); pass each "
                           f"tensor once")
    for ph, t in zip(prim_ph, primals):
        v = ph.meta.get("val")
        if not isinstance(t, torch.Tensor) or (isinstance(v, torch.Tensor) and
                                               (tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype)):
            raise CaptureError(f"{name}: primal {ph.name} does not match its example input "
                               f"({getattr(v, 'shape', None)} vs {getattr(t, 'shape', None)})")
    params = {id(p) for p in model.parameters()}
    buffers = {id(b) for b in model.buffers()}
    step.primals = list(primals)
    step.primal_kinds = ["parameter" if id(t) in params else "buffer" if id(t) in buffers else "input"
                         for t in primals]
    step.example_shapes = example_input_shapes(model, primals)
    step.tangents = example_tangents(tang_ph, name)
    logger.info("captured %s: %d nodes, %d primals, %d tangents", name, len(joint.graph.nodes), len(primals),
                len(step.tangents))
    return step


def example_tangents(tangent_placeholders: list, name: str) -> list:
    """Real tangents for a joint graph's tangent placeholders (from their
    ``meta["val"]``): ones for a scalar output (the loss); for the other
    outputs zeros when a scalar output exists (what ``loss.backward()`` feeds
    them), ones otherwise.

    Raises
    ------
    CaptureError
        A tangent placeholder has no tensor metadata.
    """
    vals = [ph.meta.get("val") for ph in tangent_placeholders]
    has_scalar = any(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals)
    tangents = []
    for ph, v in zip(tangent_placeholders, vals):
        if not isinstance(v, torch.Tensor):
            raise CaptureError(f"{name}: tangent {ph.name} has no tensor metadata")
        fill = 1.0 if (v.dim() == 0 or not has_scalar) else 0.0
        t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
        tangents.append(t.fill_(fill))
    return tangents


def example_input_shapes(model: nn.Module, graph_inputs) -> list[tuple]:
    """Shapes of the graph inputs of a dynamo graph that are neither
    parameters nor buffers of ``model`` (the user's tensors), in order."""
    own = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
    return [tuple(t.shape) for t in graph_inputs if isinstance(t, torch.Tensor) and id(t) not in own]


def check_example_shapes(got: list, expected: list) -> None:
    """Raise :class:`~libra_opt.errors.ShapeMismatchError` unless the input
    shapes ``got`` equal the example's ``expected``
    (:class:`~libra_opt.errors.InputMismatchError` when their numbers differ)."""
    from ..errors import ShapeMismatchError

    got = [tuple(s) for s in got]
    expected = [tuple(s) for s in expected]
    if got == expected:
        return
    if len(got) != len(expected):
        from ..errors import InputMismatchError

        raise InputMismatchError(
            f"called with {len(got)} distinct input tensor(s) {got} but the plan was made for {len(expected)} "
            f"{expected}: pass the inputs the example did (an extra or missing argument; a tensor passed for "
            f"two arguments counts once), or call libra_opt.optimize again")
    raise ShapeMismatchError(
        f"called with input shapes {got} but the plan was made for {expected}; a plan is valid for "
        f"the example shapes only: pad or bucket the inputs to the example shapes, or call "
        f"libra_opt.optimize again with example inputs of the new shapes")


# ---------------------------------------------------------------- phases
def node_phase(joint: fx.GraphModule, num_fwd_outputs: int) -> dict[str, str]:
    """``"forward"`` or ``"backward"`` per FX node name of a joint graph.

    The forward part is every non-tangent node up to the last node tagged
    forward by AOTAutograd (``node.meta["partitioner_tag"] == "is_forward"``),
    exactly as ``torch._functorch.partitioners.default_partition`` splits it;
    without tags, up to the last ancestor of the first ``num_fwd_outputs``
    outputs.  Everything after, and the tangents, is backward.
    """
    nodes = list(joint.graph.nodes)
    last = None
    for n in nodes:
        if n.meta.get("partitioner_tag") == "is_forward" or (n.op == "placeholder"
                                                             and not n.name.startswith("tangents")):
            last = n
    if not any(n.meta.get("partitioner_tag") == "is_forward" for n in nodes if n.op == "call_function"):
        out = next(iter(joint.graph.find_nodes(op="output")))
        need: set[fx.Node] = set()
        stack = [a for a in out.args[0][:num_fwd_outputs] if isinstance(a, fx.Node)]
        while stack:
            a = stack.pop()
            if a not in need:
                need.add(a)
                stack.extend(a.all_input_nodes)
        for n in nodes:
            if n in need:
                last = n
    phase: dict[str, str] = {}
    fw = True
    for n in nodes:
        if n.op == "output":
            phase[n.name] = BACKWARD
            continue
        phase[n.name] = FORWARD if fw and not n.name.startswith("tangents") else BACKWARD
        if n is last:
            fw = False
    return phase


def mutated_primals(joint: fx.GraphModule, num_fwd_outputs: int) -> list[str]:
    """Names of the primal placeholders the step mutates (BatchNorm running
    statistics, ``num_batches_tracked``): AOTAutograd returns their new values
    as forward outputs (``InputMutationAOTOutput`` descriptors in the output
    node's ``meta["desc"]``) and copies them into the inputs after the forward."""
    out = next(iter(joint.graph.find_nodes(op="output")))
    descs = out.meta.get("desc") or []
    prim = [n for n in joint.graph.find_nodes(op="placeholder") if not n.name.startswith("tangents")]
    names = []
    for d in descs[:num_fwd_outputs]:
        if type(d).__name__ == "InputMutationAOTOutput":
            idx = getattr(getattr(d, "mutated_input", None), "idx", None)
            if isinstance(idx, int) and 0 <= idx < len(prim):
                names.append(prim[idx].name)
    return names


def _reads_only_for_discarded_outputs(n: fx.Node, mutated: set[str]) -> bool:
    """True for a training-mode functional batch norm: its normalized output
    and saved statistics use the batch statistics only; the running statistics
    (mutated inputs) feed only the new running statistics, which a recompute
    discards (they are forward outputs, already resident)."""
    if n.target is not torch.ops.aten._native_batch_norm_legit_functional.default:
        return False
    training = n.args[5] if len(n.args) > 5 else n.kwargs.get("training", False)
    reads = {a.name for a in n.all_input_nodes}
    return bool(training) and reads & mutated <= {a.name for a in n.args[3:5] if isinstance(a, fx.Node)}


# ---------------------------------------------------------------- tensors
def fx_tensor_name(node: fx.Node, index: int | None) -> str:
    """Problem tensor name for output ``index`` of ``node`` that no ``getitem`` reads."""
    return node.name if index is None else f"{node.name}#{index}"


def _getitem_users(node: fx.Node) -> dict[int, list[fx.Node]]:
    out: dict[int, list[fx.Node]] = {}
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem:
            out.setdefault(int(u.args[1]), []).append(u)
    return out


def tensor_values(joint: fx.GraphModule) -> list[tuple[str, fx.Node, int | None, Any]]:
    """Every tensor value of a joint graph in graph order.

    Returns
    -------
    list of (name, producer, index, fake)
        ``producer`` is the placeholder / get_attr / call_function node that
        makes it; ``index`` the position in a multi-output op's result (``None``
        for single-output ones); ``fake`` its ``meta["val"]``.  ``name`` is the
        ``getitem`` node's name for a read output of a multi-output op, else
        :func:`fx_tensor_name`.  Multi-output ops are those whose value is a
        tuple or list; several ``getitem`` nodes of one index share the first one's name.
    """
    out = []
    for n in joint.graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            continue
        if n.op == "output":
            continue
        v = n.meta.get("val")
        if n.op == "get_attr" and v is None:
            try:
                v = getattr(joint, n.target)
            except AttributeError:
                v = None
        if isinstance(v, torch.Tensor):
            out.append((n.name, n, None, v))
        elif isinstance(v, (tuple, list)):
            gi = _getitem_users(n)
            for i, e in enumerate(v):
                if isinstance(e, torch.Tensor):
                    name = gi[i][0].name if i in gi else fx_tensor_name(n, i)
                    out.append((name, n, i, e))
    return out


def _is_mutating(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _recomputable(n: fx.Node, mutated: set[str]) -> bool:
    if (draws_random(n) and RNG_STATE_META not in n.meta) or _is_mutating(n.target):
        return False
    if mutated and any(a.name in mutated for a in n.all_input_nodes):
        # a recompute in the backward would read the buffer after the forward's update
        return _reads_only_for_discarded_outputs(n, mutated)
    return True


def _module_path(n: fx.Node) -> str:
    for key in ("nn_module_stack", "fwd_nn_module_stack"):
        st = n.meta.get(key)
        if st:
            path = list(st.values())[-1]
            path = path[0] if isinstance(path, tuple) else path
            return str(path).replace("L['self'].", "").replace("L['self']", "")
    return ""


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return int(t.numel() * t.element_size())


def build_problem(step: CapturedStep, *, times: dict[str, float] | None = None,
                  workspace: dict[str, int] | None = None, device: DeviceProfile | None = None,
                  optimizer: str = "adam", provenance: Provenance | None = None) -> RematProblem:
    """The :class:`~libra_opt.problem.RematProblem` of a captured step.

    Parameters
    ----------
    step : CapturedStep
    times : dict of str to float, optional
        Compute time per node name, seconds (default 0).
    workspace : dict of str to int, optional
        Transient workspace per node name, bytes (default 0).
    device : DeviceProfile, optional
        Default: the captured device's name; copies overlap compute on CUDA only.
    optimizer : {"adam", "adamw", "sgd", "none"}
        Sets the optimizer state in :class:`~libra_opt.problem.FixedMemory`
        (2x, 2x, 1x, 0x trainable parameter bytes).
    provenance : Provenance, optional

    Returns
    -------
    RematProblem
        One node per ``call_function`` node (``getitem`` folded), names equal
        to FX node names; tensors named by :func:`tensor_values`; storages
        from the fake tensors (views own 0 bytes).  A view of a graph input
        (``t(primals_3)``) is an activation with a 0-byte storage of its own.
        Not recomputable: ops tagged ``nondeterministic_seeded`` (dropout,
        rand) unless their generator state is saved (then the saved state,
        a tensor of its own, is one of their inputs; see
        :func:`libra_opt.capture_passes.make_random_ops_replayable`), the
        state-saving nodes themselves, mutating ops, and ops reading a mutated input (a buffer updated
        after the forward) except training-mode batch norm, whose recompute
        does not depend on the running statistics.
        Outputs: every tensor the joint graph returns.

    Raises
    ------
    CaptureError
        A multi-output op's result is read other than through ``getitem``.
    ValueError
        Unknown ``optimizer``.
    """
    if optimizer not in OPTIMIZER_STATE_FACTOR:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATE_FACTOR)}")
    times = times or {}
    workspace = workspace or {}
    joint = step.joint
    phase = node_phase(joint, step.num_fwd_outputs)
    values = tensor_values(joint)

    tensor_id: dict[tuple[str, int | None], int] = {}     # (producer name, index) -> tensor id
    outs_of: dict[str, list[int]] = {}                      # producer name -> its tensor ids
    storage_of: dict[Any, int] = {}                         # fake storage key -> base tensor id
    specs: list[dict] = []
    for name, prod, idx, fake in values:
        tid = len(specs)
        is_input = prod.op in ("placeholder", "get_attr")
        key = storage_key(fake)
        base = storage_of.get(key) if key is not None else None
        kind = INPUT if is_input else "activation"
        if base is not None and specs[base]["kind"] != kind:
            base = None          # a view of a graph input: a 0-byte activation of its own
            nbytes = 0
        else:
            nbytes = _nbytes(fake) if base is None else 0
        if base is None:
            base = tid
            if key is not None and key not in storage_of:
                storage_of[key] = tid
        specs.append(dict(id=tid, name=name, producer=None, storage=base, nbytes=nbytes, kind=kind,
                          shape=tuple(int(s) for s in fake.shape), dtype=str(fake.dtype).replace("torch.", "")))
        tensor_id[(prod.name, idx)] = tid
        outs_of.setdefault(prod.name, []).append(tid)

    def tid_of(a: fx.Node) -> int | None:
        if a.op == "call_function" and a.target is operator.getitem:
            return tensor_id.get((a.args[0].name, int(a.args[1])))
        return tensor_id.get((a.name, None))

    mutated = set(mutated_primals(joint, step.num_fwd_outputs))
    by_name = {n.name: n for n in joint.graph.nodes}
    nodes: list[dict] = []
    for n in joint.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        nid = len(nodes)
        ins = []
        for a in n.all_input_nodes:
            t = tid_of(a)
            if t is None:
                v = a.meta.get("val")
                if isinstance(v, (tuple, list)):
                    raise CaptureError(f"node {n.name} reads the whole result of multi-output op {a.name}; "
                                       f"only getitem reads are supported")
                continue
            ins.append(t)
        if RNG_STATE_META in n.meta:
            # a replayable random op reads the generator state saved just before it (capture_passes)
            ins.append(tid_of(by_name[n.meta[RNG_STATE_META]]))
        outs = outs_of.get(n.name, [])
        for t in outs:
            specs[t]["producer"] = nid
        target = str(n.target)
        nodes.append(dict(id=nid, name=n.name, target=target, phase=phase[n.name],
                          time_s=float(times.get(n.name, 0.0)), workspace_bytes=int(workspace.get(n.name, 0)),
                          recomputable=_recomputable(n, mutated), pointwise=is_fusible_op(n.target),
                          inputs=tuple(dict.fromkeys(ins)), outputs=tuple(sorted(outs)), module=_module_path(n)))
    _keep_rng_states(joint, nodes, by_name, tid_of)
    # views must come after their base's producer; a base whose producer is later than a view's
    # (cannot happen in a topological graph) would be caught by RematProblem.validate.
    out_node = next(iter(joint.graph.find_nodes(op="output")))
    outputs = []
    for a in out_node.args[0]:
        if isinstance(a, fx.Node):
            t = tid_of(a)
            if t is not None:
                outputs.append(t)
    consumers: dict[int, list[int]] = {}
    for nd in nodes:
        for t in nd["inputs"]:
            consumers.setdefault(t, []).append(nd["id"])
    tensors = [Tensor(consumers=tuple(consumers.get(s["id"], ())), **s) for s in specs]
    node_objs = [Node(**nd) for nd in nodes]
    fixed = _fixed_memory(step, optimizer)
    if device is None:
        dev = step.device
        device = DeviceProfile(name=str(dev), copies_overlap_compute=dev.type == "cuda")
    if provenance is None:
        inputs = [t for t, k in zip(step.primals, step.primal_kinds) if k == "input"]
        batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() > 0 else None
        seq = int(inputs[0].shape[1]) if inputs and inputs[0].dim() == 2 else None
        dtype = step.autocast_dtype or next((t.dtype for t, k in zip(step.primals, step.primal_kinds)
                                             if k == "parameter"), None)
        provenance = Provenance(source="capture", model=step.model_name, batch=batch, seq=seq,
                                dtype=str(dtype).replace("torch.", "") if dtype else "",
                                torch_version=torch.__version__,
                                date=datetime.date.today().isoformat(),
                                extra={"capture_passes": dict(step.passes)})
    return RematProblem(node_objs, tensors, outputs, fixed=fixed, device=device, provenance=provenance,
                        name=step.model_name)


def _keep_rng_states(joint: fx.GraphModule, nodes: list[dict], by_name: dict, tid_of) -> None:
    """Keep each saved generator state resident while its random op may be recomputed.

    A random op is recomputed in the backward only for a value derived from
    it that the backward reads; its saved state (tensor ``s``) must then still
    be resident.  ``s`` is made an input of the last backward node reading a
    forward value that depends on the random op, so the no-remat plan (and
    every plan that does not evict ``s``) keeps it, a few bytes, until then.
    In the graphs that node does not read ``s``; the runtime frees ``s`` there.
    """
    index = {nd["name"]: k for k, nd in enumerate(nodes)}

    def readers(a: fx.Node):
        for u in a.users:
            if u.op == "call_function" and u.target is operator.getitem:
                yield from readers(u)
            elif u.name in index:
                yield index[u.name]

    for n in joint.graph.nodes:
        sname = n.meta.get(RNG_STATE_META) if n.op == "call_function" else None
        if sname is None:
            continue
        fwd, stack, last = {index[n.name]}, [n], None
        while stack:
            for k in readers(stack.pop()):
                if nodes[k]["phase"] == BACKWARD:
                    last = k if last is None else max(last, k)
                elif k not in fwd:
                    fwd.add(k)
                    stack.append(by_name[nodes[k]["name"]])
        if last is not None:
            nd = nodes[last]
            nd["inputs"] = tuple(dict.fromkeys((*nd["inputs"], tid_of(by_name[sname]))))


def _fixed_memory(step: CapturedStep, optimizer: str) -> FixedMemory:
    seen: set = set()
    acc = {"parameter": 0, "buffer": 0, "input": 0}
    grads = 0

    def once(t: torch.Tensor) -> int:
        k = (t.untyped_storage().data_ptr(), t.device)
        if k in seen or t.untyped_storage().data_ptr() == 0:
            return 0
        seen.add(k)
        return int(t.untyped_storage().nbytes())

    for t, kind in zip(step.primals, step.primal_kinds):
        b = once(t)
        acc[kind] += b
        if kind == "parameter" and t.requires_grad:
            grads += b
    for t in step.tangents:
        acc["input"] += once(t)
    for n in step.joint.graph.find_nodes(op="get_attr"):
        v = getattr(step.joint, n.target, None)
        if isinstance(v, torch.Tensor):
            acc["input"] += once(v)
    return FixedMemory(parameters_bytes=acc["parameter"], buffers_bytes=acc["buffer"], gradients_bytes=grads,
                       optimizer_state_bytes=OPTIMIZER_STATE_FACTOR[optimizer] * grads,
                       inputs_bytes=acc["input"], optimizer=optimizer if optimizer != "adamw" else "adam")


sys.modules[__name__].__class__ = CallableModule   # libra_opt.capture(...) whichever import ran first
