"""Capture fidelity: FX passes that make the captured step run what eager runs.

The joint graph AOTAutograd traces is not always the computation eager
PyTorch does on the device (``gpu-measurements/README.md``, "Capture
fidelity"): ``transformers`` materializes attention masks under tracing that
it skips in eager (so the fused attention kernels are refused), functional
dropout with ``p = 0`` becomes a ``clone``, batch norm is decomposed away from
cuDNN, and random ops cannot be recomputed.  Each rewrite here is one FX pass
with a name, applied at capture (:func:`libra_opt.capture.capture`) and again
when the runtime re-traces the model (:class:`~libra_opt.runtime.module.OptimizedModule`),
so both see the same graph:

on the TorchDynamo graph (torch-level ops, before AOTAutograd):

- :func:`drop_constant_attention_masks` -- an attention mask that depends on
  no input and is all-true (or exactly causal) is removed (``is_causal=True``),
  as ``transformers`` does in eager after looking at the mask's values;
- :func:`fold_repeated_kv_into_gqa` -- then grouped-query attention reads
  the shared key/value heads (``enable_gqa=True``) instead of per-head copies;

on the joint forward+backward aten graph (AOTAutograd's partition hook),
:func:`apply_joint_passes` runs, in order:

- :func:`dedupe_casts` -- identical dtype casts of one value in one phase are
  made once (eager's autocast caches parameter casts the same way);
- :func:`remove_identity_clones` -- a ``clone`` that keeps the layout of a
  value nobody mutates is dropped (``dropout(p=0)`` and friends);
- :func:`use_cudnn_batch_norm` -- on CUDA, where eager would pick cuDNN,
  ``_native_batch_norm_legit_functional`` / ``native_batch_norm_backward``
  become ``cudnn_batch_norm`` / ``cudnn_batch_norm_backward`` with cuDNN's
  reserve space as a saved tensor;
- :func:`make_random_ops_replayable` -- each forward random op gets a node
  that saves the generator state just before it, so a recompute replays the
  same random numbers (:func:`replay_random`), as ``torch.utils.checkpoint``
  preserves the RNG state.

Sources: ``torch.fx`` graph rewriting; ``torch.nn.functional.scaled_dot_product_attention``
(``attn_mask`` / ``is_causal`` semantics); ``torch._decomp`` (``dropout``
decomposes to ``clone`` when ``p = 0``); ``aten/src/ATen/native/Normalization.cpp``
(``_select_batch_norm_backend``: when eager uses cuDNN); ``torch.utils.checkpoint``
and ``torch._prims.rng_prims.run_with_rng_state`` (RNG state replay; AOTAutograd's
``functionalize_rng_ops`` uses the same get / set state pair on CUDA, whose
state is the Philox seed and offset).
"""
from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx as fx

logger = logging.getLogger(__name__)

__all__ = ["drop_constant_attention_masks", "fold_repeated_kv_into_gqa", "apply_graph_passes", "dedupe_casts",
           "remove_identity_clones", "use_cudnn_batch_norm", "make_random_ops_replayable", "apply_joint_passes",
           "replay_random", "rng_state_bytes", "draws_random", "storage_key", "RNG_STATE_META", "JOINT_PASSES"]

aten = torch.ops.aten

#: ``node.meta`` key of a replayable random op: the name of the node that saves its generator state
RNG_STATE_META = "libra_rng_state"


# ---------------------------------------------------------------- TorchDynamo graph
_SDPA = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}
_SDPA_MASK, _SDPA_CAUSAL = 3, 5          # positions in scaled_dot_product_attention(q, k, v, attn_mask, p, is_causal)


def _arg(n: fx.Node, pos: int, name: str, default=None):
    return n.args[pos] if len(n.args) > pos else n.kwargs.get(name, default)


def _set_arg(n: fx.Node, pos: int, name: str, value) -> None:
    if len(n.args) > pos:
        args = list(n.args)
        args[pos] = value
        n.args = tuple(args)
    else:
        kw = dict(n.kwargs)
        kw[name] = value
        n.kwargs = kw


def _ancestors(n: fx.Node) -> list[fx.Node]:
    seen: dict[fx.Node, None] = {}
    stack = [n]
    while stack:
        a = stack.pop()
        if a in seen:
            continue
        seen[a] = None
        stack.extend(a.all_input_nodes)
    order = {x: i for i, x in enumerate(n.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _is_randomish(n: fx.Node) -> bool:
    name = getattr(n.target, "__name__", str(n.target)).lower()
    return any(w in name for w in ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform"))


def _mutates(n: fx.Node) -> bool:
    """Whether a TorchDynamo-graph node may write one of its inputs (an in-place method or function)."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return n.target is operator.setitem or (name.endswith("_") and not name.endswith("__"))


def _example(n: fx.Node):
    return n.meta.get("example_value", n.meta.get("val"))


def _constant_value(gm: fx.GraphModule, mask: fx.Node):
    """The value of ``mask`` if it depends on no graph input and no random op, else None."""
    nodes = _ancestors(mask)
    if any(a.op == "placeholder" or _is_randomish(a) for a in nodes):
        return None
    inside = set(nodes)
    if any(u not in inside and _mutates(u) for a in nodes for u in a.users):
        return None                        # an in-place op outside the mask's chain changes one of its values
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in nodes:
        env[a] = g.node_copy(a, lambda x: env[x])
    g.output(env[mask])
    try:
        with torch.no_grad():
            return fx.GraphModule(gm, g)()
    except Exception as e:  # noqa: BLE001 - a mask we cannot evaluate is left as it is
        logger.debug("attention mask %s not evaluated: %s", mask.name, e)
        return None


def _mask_kind(m, q_len: int, kv_len: int) -> str | None:
    """``"none"`` (masks nothing), ``"causal"`` (exactly the lower triangle) or None."""
    if not isinstance(m, torch.Tensor) or m.dim() < 2 or tuple(m.shape[-2:]) not in ((q_len, kv_len), (1, kv_len)):
        return None
    keep = m if m.dtype == torch.bool else (m == 0)
    if m.dtype != torch.bool and not bool(((m == 0) | (m == float("-inf"))).all()):
        return None
    if bool(keep.all()):
        return "none"
    if q_len == kv_len and m.shape[-2] == q_len:
        tril = torch.ones(q_len, kv_len, dtype=torch.bool, device=m.device).tril()
        if bool((keep == tril).all()):
            return "causal"
    return None


def drop_constant_attention_masks(gm: fx.GraphModule) -> int:
    """Remove attention masks that eager would not pass to the attention kernel.

    ``transformers`` decides in eager, by reading the mask's values, to call
    ``scaled_dot_product_attention`` with ``attn_mask=None`` (and
    ``is_causal=True`` for a causal mask); under TorchDynamo it cannot read
    values and passes the materialized mask (packed-sequence detection from
    ``position_ids``; ``torch.compiler.is_exporting()`` folded to True on
    torch <= 2.13).  A mask refuses the flash kernels and, when its last
    dimension is not aligned (ViT's 197 tokens), every fused kernel: the
    attention decomposes to math (bmm, ``_safe_softmax``) in fp32.

    This pass evaluates each ``scaled_dot_product_attention`` mask that
    depends on no graph input (only on constants such as ``arange``) and
    removes it when it masks nothing, or replaces it by ``is_causal=True``
    when it is exactly the causal lower triangle with equal query and key
    lengths: the same results, bitwise (the kernels compute the same thing).

    Parameters
    ----------
    gm : torch.fx.GraphModule
        A TorchDynamo graph (torch-level calls), changed in place.

    Returns
    -------
    int
        Number of attention calls changed.
    """
    done: dict[fx.Node, str | None] = {}
    changed = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _SDPA:
            continue
        mask = _arg(n, _SDPA_MASK, "attn_mask")
        if not isinstance(mask, fx.Node) or bool(_arg(n, _SDPA_CAUSAL, "is_causal", False)):
            continue
        q, k = _example(n.args[0]) if n.args else None, _example(n.args[1]) if len(n.args) > 1 else None
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            continue
        if mask not in done:
            val = _constant_value(gm, mask)
            done[mask] = None if val is None else _mask_kind(val, int(q.shape[-2]), int(k.shape[-2]))
        kind = done[mask]
        if kind is None:
            continue
        _set_arg(n, _SDPA_MASK, "attn_mask", None)
        if kind == "causal":
            _set_arg(n, _SDPA_CAUSAL, "is_causal", True)
        changed += 1
    for mask, kind in done.items():
        if kind is not None:
            for a in reversed(_ancestors(mask)):
                if not a.users and a.op != "placeholder":
                    gm.graph.erase_node(a)
    if changed:
        gm.recompile()
        logger.info("dropped %d constant attention masks", changed)
    return changed


_NEW_AXIS_2 = (slice(None), slice(None), None, slice(None), slice(None))


def _repeated_kv_base(a) -> fx.Node | None:
    """``base`` if ``a`` is ``base[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)``
    (``transformers``' ``repeat_kv``), else None."""
    if not (isinstance(a, fx.Node) and a.op == "call_method" and a.target == "reshape"):
        return None
    e = a.args[0]
    if not (isinstance(e, fx.Node) and e.op == "call_method" and e.target == "expand" and len(e.users) == 1):
        return None
    gi = e.args[0]
    if not (isinstance(gi, fx.Node) and gi.target is operator.getitem and tuple(gi.args[1]) == _NEW_AXIS_2
            and len(gi.users) == 1):
        return None
    base, out = _example(gi.args[0]), _example(a)
    if not (isinstance(base, torch.Tensor) and isinstance(out, torch.Tensor) and base.dim() == 4 and out.dim() == 4):
        return None
    b, h, s, d = base.shape
    if out.shape[0] != b or out.shape[2:] != (s, d) or out.shape[1] % h:
        return None
    return gi.args[0]


def fold_repeated_kv_into_gqa(gm: fx.GraphModule) -> int:
    """Let grouped-query attention read the shared key/value heads, as eager does.

    ``transformers`` calls ``scaled_dot_product_attention(..., enable_gqa=True)``
    on the key/value heads when no mask is passed, and copies them per query
    head (``repeat_kv``: ``[:, :, None].expand(...).reshape(...)``, a copy in
    the forward and a reduction in the backward) when a mask is.  After
    :func:`drop_constant_attention_masks` has removed the mask, this pass
    undoes the copies of a mask-free attention call whose key and value are
    both ``repeat_kv`` results (head dimension <= 256, ``transformers``'
    condition) and sets ``enable_gqa=True``: the same attention, computed by
    the kernel eager runs.

    Returns
    -------
    int
        Number of attention calls changed.
    """
    changed = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _SDPA or len(n.args) < 3:
            continue
        if _arg(n, _SDPA_MASK, "attn_mask") is not None or n.kwargs.get("enable_gqa") or len(n.args) > 7:
            continue
        k, v = _repeated_kv_base(n.args[1]), _repeated_kv_base(n.args[2])
        kv, vv = (_example(k), _example(v)) if k is not None and v is not None else (None, None)
        if kv is None or vv is None or kv.shape[1] != vv.shape[1] or not kv.shape[-1] == vv.shape[-1] <= 256:
            continue
        old = n.args[1:3]
        n.args = (n.args[0], k, v, *n.args[3:])
        n.kwargs = {**n.kwargs, "enable_gqa": True}
        for a in old:                       # the repeat_kv chain: reshape <- expand <- getitem
            chain = [a, a.args[0], a.args[0].args[0]]
            for x in chain:
                if not x.users:
                    gm.graph.erase_node(x)
        changed += 1
    if changed:
        gm.recompile()
    return changed


def apply_graph_passes(gm: fx.GraphModule) -> dict[str, int]:
    """Run the TorchDynamo-graph passes (in place): :func:`drop_constant_attention_masks`,
    then :func:`fold_repeated_kv_into_gqa`.  Deterministic.

    Returns
    -------
    dict of str to int
        Number of rewrites per pass.
    """
    return {"drop_constant_attention_masks": drop_constant_attention_masks(gm),
            "fold_repeated_kv_into_gqa": fold_repeated_kv_into_gqa(gm)}


# ---------------------------------------------------------------- joint graph: casts and clones
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _outputs(joint: fx.GraphModule) -> set[fx.Node]:
    out = next(iter(joint.graph.find_nodes(op="output")))
    return {a for a in out.args[0] if isinstance(a, fx.Node)}


def _vals(v):
    return [x for x in (v if isinstance(v, (tuple, list)) else (v,)) if isinstance(x, torch.Tensor)]


def _replace_value(old: fx.Node, new: fx.Node) -> None:
    """Make ``old``'s readers read ``new`` (same shape, strides and dtype) and
    give the views made from it (fake values sharing ``old``'s storage) fake
    values on ``new``'s storage, so the problem IR's storages stay right."""
    key = storage_key(old.meta.get("val"))
    users = list(old.users)
    old.replace_all_uses_with(new)
    mode = getattr(new.meta.get("val"), "fake_mode", None)
    if key is None or mode is None:
        return
    stack, seen = users, set()
    while stack:
        u = stack.pop()
        if u in seen or u.op != "call_function" or not any(storage_key(x) == key for x in _vals(u.meta.get("val"))):
            continue
        seen.add(u)
        if u.target is operator.getitem:
            u.meta["val"] = u.args[0].meta["val"][u.args[1]]
        else:
            args, kwargs = fx.map_arg((u.args, u.kwargs), lambda a: a.meta.get("val"))
            with mode:
                u.meta["val"] = u.target(*args, **kwargs)
        stack.extend(u.users)


def dedupe_casts(joint: fx.GraphModule, phase: dict[str, str]) -> int:
    """Make each dtype cast of a value once per phase.

    Eager's autocast casts a parameter once per forward (its weight cache);
    the traced graph may cast one value several times (a tied weight, the
    same activation fed to three projections).  Identical ``_to_copy`` /
    ``convert_element_type`` nodes (same input, same arguments) in the same
    phase are merged into the first: the same values, fewer copies.

    Parameters
    ----------
    joint : torch.fx.GraphModule
        Changed in place.
    phase : dict of str to str
        ``"forward"`` / ``"backward"`` per node name
        (:func:`libra_opt.capture.node_phase`).

    Returns
    -------
    int
        Number of casts removed.
    """
    first: dict[Any, fx.Node] = {}
    outs = _outputs(joint)
    removed = 0
    for n in list(joint.graph.nodes):
        if n.op != "call_function" or n.target not in _CASTS or n in outs:
            continue
        key = (phase.get(n.name), n.target, n.args, tuple(sorted((k, str(v)) for k, v in n.kwargs.items())))
        try:
            hash(key)
        except TypeError:
            continue
        keep = first.setdefault(key, n)
        if keep is not n:
            _replace_value(n, keep)
            joint.graph.erase_node(n)
            removed += 1
    return removed


def storage_key(v):
    """The identity of ``v``'s storage (``untyped_storage()._cdata``), or
    ``None`` for a non-tensor or a tensor without one; shared with
    :mod:`libra_opt.capture`."""
    try:
        return v.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def remove_identity_clones(joint: fx.GraphModule) -> int:
    """Drop ``clone`` nodes that only copy.

    In the functional joint graph nothing is mutated, so a ``clone`` whose
    result has its input's shape, strides and dtype is the identity.  They
    come from decompositions that copy where eager aliases: ``dropout`` with
    ``p = 0`` (``transformers``' default for ViT, BERT, GPT-2 here) decomposes
    to ``clone`` while eager returns its input.  Kept: clones of a graph input
    (BatchNorm running statistics are updated after the forward), clones that
    are graph outputs, and layout-changing clones.

    Returns
    -------
    int
        Number of clones removed.
    """
    inputs = {storage_key(ph.meta.get("val")) for ph in joint.graph.find_nodes(op="placeholder")}
    inputs.discard(None)
    outs = _outputs(joint)
    removed = 0
    for n in list(joint.graph.nodes):
        if n.op != "call_function" or n.target is not aten.clone.default or n in outs:
            continue
        src = n.args[0]
        a, b = src.meta.get("val") if isinstance(src, fx.Node) else None, n.meta.get("val")
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if (a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype
                or storage_key(a) in inputs):
            continue
        _replace_value(n, src)
        joint.graph.erase_node(n)
        removed += 1
    return removed


# ---------------------------------------------------------------- joint graph: cuDNN batch norm
def _cudnn_applies(x, w, b, rm, rv, training: bool, eps: float) -> bool:
    """Whether eager's ``batch_norm`` would run cuDNN on these values
    (``torch._C._select_batch_norm_backend``; its condition restated where
    the binding is missing)."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    select = getattr(torch._C, "_select_batch_norm_backend", None)
    if select is not None:
        try:
            return select(x, w, b, rm, rv, training, eps) == torch._C._BatchNormBackend.Cudnn
        except Exception:  # noqa: BLE001 - fall back to the restated condition
            pass
    return bool(torch.backends.cudnn.enabled and torch.backends.cudnn.is_available()
                and x.dtype != torch.bfloat16 and w.dtype != torch.bfloat16
                and (x.dtype != torch.half or w.dtype == torch.float) and x.dim() >= 3
                and x.shape[0] <= 880801 and eps >= 1e-5 and x.numel() < 2 ** 31 - 1)


def _reserve_bytes(x, training: bool, fallback: int) -> int:
    size = getattr(torch._C, "_get_cudnn_batch_norm_reserve_space_size", None)
    if size is None:
        return fallback
    try:
        return int(size(x, training))
    except Exception:  # noqa: BLE001 - a fake input the binding does not take
        return fallback


def use_cudnn_batch_norm(joint: fx.GraphModule, *, applies=None) -> int:
    """Run batch norm with cuDNN where eager does.

    AOTAutograd decomposes eager's ``cudnn_batch_norm`` to the functional
    ``_native_batch_norm_legit_functional`` (and its backward to
    ``native_batch_norm_backward``), aten's own kernels (ResNet-50 b64 on an
    H100: backward 10.5 ms against cuDNN's 5.7 ms).  For each training-mode
    pair where cuDNN applies (:func:`_cudnn_applies`: CUDA, cuDNN enabled,
    eager's dtype / size conditions) this pass emits, as eager does::

        rm, rv = clone(running_mean), clone(running_var)
        out, save_mean, save_invstd, reserve = cudnn_batch_norm(x, w, b, rm, rv, True, momentum, eps)
        ... cudnn_batch_norm_backward(x, grad, w, running_mean, running_var, save_mean, save_invstd, eps, reserve)

    cuDNN updates ``rm`` / ``rv`` in place (its schema does not say so): they
    are fresh clones, read afterwards only as the new running statistics (the
    forward outputs AOTAutograd copies into the buffers), so the running
    statistics are cuDNN's, as in eager, and a recompute of the batch norm
    never touches the buffers.  ``reserve`` (cuDNN's reserve space) is a new
    tensor saved for the backward; its fake value gets cuDNN's size.

    Parameters
    ----------
    joint : torch.fx.GraphModule
        Changed in place.
    applies : callable, optional
        ``applies(x, w, b, rm, rv, training, eps) -> bool`` replacing
        :func:`_cudnn_applies` (tests on machines without CUDA).

    Returns
    -------
    int
        Number of batch norms rewritten.
    """
    applies = applies or _cudnn_applies
    g = joint.graph
    bwd_of: dict[fx.Node, fx.Node] = {}
    for n in g.nodes:
        if n.op == "call_function" and n.target is aten.native_batch_norm_backward.default:
            sm = n.args[5]
            if isinstance(sm, fx.Node) and sm.target is operator.getitem and sm.args[1] == 1:
                bwd_of[sm.args[0]] = n
    changed = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not aten._native_batch_norm_legit_functional.default:
            continue
        x, w, b, rm, rv, training, momentum, eps = n.args[:8]
        bw = bwd_of.get(n)
        vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in (x, w, b, rm, rv)]
        if not training or bw is None or not isinstance(rm, fx.Node) or not isinstance(rv, fx.Node):
            continue
        xv = vals[0]
        if not applies(*vals, bool(training), float(eps)):
            continue
        fmt = torch.channels_last if xv.dim() == 4 and xv.is_contiguous(memory_format=torch.channels_last) \
            and not xv.is_contiguous() else torch.contiguous_format
        grad = bw.args[0]
        gv = grad.meta.get("val") if isinstance(grad, fx.Node) else None
        if not xv.is_contiguous(memory_format=fmt) or not (isinstance(gv, torch.Tensor)
                                                           and gv.is_contiguous(memory_format=fmt)):
            continue
        getters = {u.args[1]: u for u in n.users if u.target is operator.getitem}
        if set(getters) - {0, 1, 2, 3, 4}:
            continue
        with g.inserting_before(n):
            stats = []
            for a, v in ((rm, vals[3]), (rv, vals[4])):
                c = g.call_function(aten.clone.default, (a,))
                c.meta["val"] = v.clone() if v is not None else None
                c.meta.update({k: n.meta[k] for k in ("partitioner_tag", "nn_module_stack") if k in n.meta})
                stats.append(c)
            new = g.call_function(aten.cudnn_batch_norm.default, (x, w, b, stats[0], stats[1], True, momentum, eps))
        new.meta = dict(n.meta)
        fake = n.meta["val"]
        mode = getattr(xv, "fake_mode", None)
        nres = _reserve_bytes(xv, True, 0)
        if mode is not None:
            with mode:
                reserve = torch.empty(nres, dtype=torch.uint8, device=xv.device)
        else:
            reserve = torch.empty(nres, dtype=torch.uint8, device="meta")
        new.meta["val"] = (fake[0], fake[1], fake[2], reserve)
        with g.inserting_after(new):
            res = g.call_function(operator.getitem, (new, 3))
        res.meta = {"val": reserve, **{k: n.meta[k] for k in ("partitioner_tag",) if k in n.meta}}
        for i, u in getters.items():
            if i in (3, 4):
                u.replace_all_uses_with(stats[i - 3])
                g.erase_node(u)
            else:
                u.args = (new, i)
        mean_get = getters.get(1)
        inv_get = getters.get(2)
        with g.inserting_before(bw):
            nb = g.call_function(aten.cudnn_batch_norm_backward.default,
                                 (bw.args[1], grad, bw.args[2], bw.args[3], bw.args[4], mean_get, inv_get,
                                  bw.args[8], res))
        nb.meta = dict(bw.meta)
        bw.replace_all_uses_with(nb)
        g.erase_node(bw)
        g.erase_node(n)
        changed += 1
    if changed:
        logger.info("batch norm: %d pairs rewritten to cuDNN", changed)
    return changed


# ---------------------------------------------------------------- joint graph: random ops
_lib = torch.library.Library("libra", "FRAGMENT")
_lib.define("rng_state(Device device) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))


def _rng_state(device: torch.device) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def rng_state_bytes(device: torch.device) -> int:
    """Bytes of one saved generator state on ``device``: the Philox seed and
    offset on CUDA (16), the Mersenne-Twister state on the CPU (5056)."""
    return 16 if torch.device(device).type == "cuda" else int(torch.get_rng_state().numel())


_lib.impl("rng_state", _rng_state, "CompositeExplicitAutograd")


@torch.library.register_fake("libra::rng_state", lib=_lib)
def _rng_state_fake(device):
    return torch.empty(rng_state_bytes(device), dtype=torch.uint8, device="cpu")


#: ``torch.ops.libra.rng_state(device) -> uint8 tensor`` (on the host): the default generator's state of ``device``
RNG_STATE = torch.ops.libra.rng_state.default


def _tensor_device(args, kwargs) -> torch.device | None:
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def replay_random(state: torch.Tensor, op, *args, **kwargs):
    """``op(*args, **kwargs)`` with the default generator of the args' device
    set to ``state``, then restored: the random numbers of the run that
    ``state`` was saved before, and the RNG stream left as it was.

    Eager-executor equivalent of ``torch._prims.rng_prims.run_with_rng_state``
    (that higher-order op has no rule for Python dispatch modes such as
    :class:`~libra_opt.runtime.executor.StorageTracker`).

    Raises
    ------
    RuntimeError
        ``args`` hold no tensor (the device is unknown).
    """
    dev = _tensor_device(args, kwargs)
    if dev is None:
        raise RuntimeError(f"replay_random({op}): no tensor argument gives the device whose generator to set")
    if state.device.type != "cpu":
        state = state.cpu()          # a plan that swapped the state brought it back on the device
    if dev.type == "cuda":
        current = torch.cuda.get_rng_state(dev)
        torch.cuda.set_rng_state(state, dev)
        try:
            return op(*args, **kwargs)
        finally:
            torch.cuda.set_rng_state(current, dev)
    current = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        return op(*args, **kwargs)
    finally:
        torch.set_rng_state(current)


def draws_random(n: fx.Node) -> bool:
    """Whether the op of ``n`` draws from a random generator: it is tagged
    ``nondeterministic_seeded`` and is not an attention op called with
    ``dropout_p = 0`` (fused attention is tagged for its dropout; without
    dropout it is deterministic and draws nothing)."""
    t = n.target
    if n.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(t, "tags", ()):
        return False
    schema = getattr(t, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name == "dropout_p":
                p = n.args[i] if i < len(n.args) else n.kwargs.get("dropout_p", a.default_value)
                return not (isinstance(p, (int, float)) and p == 0)
    return True


def _replayable(n: fx.Node) -> torch.device | None:
    """The device of a forward random op whose generator state can be replayed, else None."""
    t = n.target
    if not isinstance(t, torch._ops.OpOverload) or t is RNG_STATE or not draws_random(n):
        return None
    if n.kwargs.get("generator") is not None:
        return None
    v = next((a.meta.get("val") for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)), None)
    if v is None or v.device.type not in ("cpu", "cuda"):
        return None
    return v.device


def make_random_ops_replayable(joint: fx.GraphModule, phase: dict[str, str]) -> int:
    """Make forward random ops recomputable by saving their generator state.

    Before each forward op tagged ``nondeterministic_seeded`` that reads a
    tensor (``native_dropout``, ``rand_like``, ``bernoulli``, ...) this pass
    inserts ``s = libra.rng_state(device)`` (the default generator's state:
    the Philox seed and offset on CUDA, 16 bytes; the CPU generator's 5056
    bytes) and records ``node.meta[RNG_STATE_META] = s.name``.  The problem
    IR counts ``s`` as a tensor read by the random op (so a plan keeps it, or
    swaps it, until the last recompute) and marks the op recomputable; the
    runtime runs the first computation as is (it draws from the generator as
    eager does) and a recompute as :func:`replay_random` ``(s, op, ...)``:
    the same numbers, the generator left where it was.  Ops with an explicit
    ``generator`` or without tensor arguments are left unreplayable.

    Returns
    -------
    int
        Number of random ops made replayable.
    """
    g = joint.graph
    mode = next((v.fake_mode for v in (n.meta.get("val") for n in g.nodes)
                 if hasattr(v, "fake_mode")), None)
    count = 0
    for n in list(g.nodes):
        if phase.get(n.name) != "forward" or RNG_STATE_META in n.meta:
            continue
        dev = _replayable(n)
        if dev is None:
            continue
        with g.inserting_before(n):
            s = g.call_function(RNG_STATE, (dev,))
        if mode is not None:
            with mode:
                s.meta["val"] = torch.empty(rng_state_bytes(dev), dtype=torch.uint8)
        else:
            s.meta["val"] = torch.empty(rng_state_bytes(dev), dtype=torch.uint8, device="meta")
        s.meta.update({k: n.meta[k] for k in ("partitioner_tag", "nn_module_stack") if k in n.meta})
        phase[s.name] = "forward"
        n.meta[RNG_STATE_META] = s.name
        count += 1
    return count


# ---------------------------------------------------------------- all of them
#: the joint-graph passes in the order :func:`apply_joint_passes` runs them
JOINT_PASSES = ("dedupe_casts", "remove_identity_clones", "use_cudnn_batch_norm", "make_random_ops_replayable")


def apply_joint_passes(joint: fx.GraphModule, num_fwd_outputs: int) -> dict[str, int]:
    """Run :data:`JOINT_PASSES` on a joint graph (in place) and recompile it.

    Deterministic: the same graph in gives the same graph out (same node
    names), which the runtime relies on to match a plan to its re-traced
    graph.

    Returns
    -------
    dict of str to int
        Number of rewrites per pass.
    """
    from .capture import node_phase

    phase = node_phase(joint, num_fwd_outputs)
    done = {"dedupe_casts": dedupe_casts(joint, phase),
            "remove_identity_clones": remove_identity_clones(joint),
            "use_cudnn_batch_norm": use_cudnn_batch_norm(joint)}
    phase = node_phase(joint, num_fwd_outputs)
    done["make_random_ops_replayable"] = make_random_ops_replayable(joint, phase)
    joint.graph.lint()
    joint.recompile()
    logger.debug("joint passes: %s", done)
    return done
