"""A small zoo of real architectures with random weights, built offline.

Every model is built from a ``transformers`` config object (never
``from_pretrained``), so nothing is downloaded: weights are random, the
architecture, shapes and op mix are the real ones.  Each entry gives example
inputs and a loss so one training step can be captured and profiled
(:func:`libra_opt.profiling.profile`).

=============  ==============================================================
name           architecture
=============  ==============================================================
gpt2           GPT-2 small: 12 layers, 768 hidden, 12 heads, vocab 50257
gpt2-medium    GPT-2 medium: 24 layers, 1024 hidden, 16 heads
bert-base      BERT-base masked LM: 12 layers, 768 hidden, vocab 30522
llama          Llama-style decoder: 8 layers, 1024 hidden, 16 heads, 4 KV
               heads (grouped-query attention), SwiGLU 2816, vocab 32000
vit-base       ViT-B/16 image classifier at 224x224, 1000 classes
resnet50       ResNet-50 (bottleneck, depths 3-4-6-3) at 224x224, 1000 classes
\\*-tiny       2-layer / few-channel versions of each for tests and the CPU demo
=============  ==============================================================

Language models take ``input_ids`` and ``labels`` (the model computes its own
loss; ``model.loss_type`` is set so that ``transformers`` does not log a
warning, which would be a graph break).  Vision models take ``pixel_values``;
their loss is the cross-entropy of the logits against random labels.
Dropout is set to 0 by default so a step is deterministic and every op is
recomputable (pass ``dropout=`` to keep the architecture's dropout).

A user's own model is named ``"package.module:callable"``; see
:func:`build_model`.

Sources: ``transformers`` model classes and configs
(``GPT2LMHeadModel``, ``BertForMaskedLM``, ``LlamaForCausalLM``,
``ViTForImageClassification``, ``ResNetForImageClassification``).
"""
from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..errors import LibraOptError

logger = logging.getLogger(__name__)

__all__ = ["ZooModel", "ZooError", "build_model", "known_models", "transformers_classes", "MODELS"]


class ZooError(LibraOptError, ValueError):
    """An unknown zoo name or a user model spec that cannot be built; the
    message lists the known names or says what the callable must return."""


@dataclass
class ZooModel:
    """A model with example inputs and a loss: one training step's worth.

    Attributes
    ----------
    model : torch.nn.Module
        In training mode, on the requested device and dtype.
    args : tuple
        Positional example inputs for ``model(*args, **kwargs)``.
    kwargs : dict
        Keyword example inputs.
    loss_fn : callable or None
        ``loss_fn(output) -> scalar tensor``; ``None`` means the output itself
        is differentiated with ones as its tangent.
    description : str
        One line: architecture and sizes.
    name : str
        Zoo name (or the ``module:callable`` spec).
    batch : int or None
        Batch size of the example inputs.
    seq : int or None
        Sequence length (language models) or image side in pixels (vision).
    dtype : torch.dtype
        Parameter dtype.
    """

    model: nn.Module
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    description: str = ""
    name: str = ""
    batch: int | None = None
    seq: int | None = None
    dtype: torch.dtype = torch.float32

    def step_loss(self) -> torch.Tensor:
        """Run the eager forward and return the loss (or the output when there
        is no ``loss_fn``)."""
        out = self.model(*self.args, **self.kwargs)
        return self.loss_fn(out) if self.loss_fn is not None else out

    @property
    def num_parameters(self) -> int:
        """Number of parameter elements."""
        return sum(p.numel() for p in self.model.parameters())


@dataclass(frozen=True)
class _Entry:
    kind: str                      # "causal-lm" | "masked-lm" | "vision"
    builder: Callable[[float, int], nn.Module]   # (dropout, seq) -> model
    default_seq: int
    description: str


# ------------------------------------------------------------------ builders
def transformers_classes(*names: str) -> tuple:
    """``transformers.<name>`` for each name, in order (e.g.
    ``transformers_classes("GPT2Config", "GPT2LMHeadModel")``), importing
    ``transformers`` on first use.

    Raises
    ------
    MissingExtraError
        ``transformers`` is not installed; the message gives
        ``pip install libra-opt[zoo]``.
    AttributeError
        This ``transformers`` has no class of that name.
    """
    from ..extras import require

    transformers = require("transformers", "zoo", "the model zoo")
    return tuple(getattr(transformers, n) for n in names)


def _hf(config: str, model: str, config_kwargs: Callable[[float, int], dict], loss_type: str | None = None):
    """A zoo builder ``(dropout, seq) -> model``: ``transformers.<model>(transformers.<config>(
    **config_kwargs(dropout, seq)))``, its ``loss_type`` set when given (the loss the model computes
    from ``labels``).  Raises what :func:`transformers_classes` and ``config_kwargs`` raise."""
    def build(dropout, seq):
        config_cls, model_cls = transformers_classes(config, model)
        m = model_cls(config_cls(**config_kwargs(dropout, seq)))
        if loss_type is not None:
            m.loss_type = loss_type
        return m
    return build


def _gpt2(n_layer, n_embd, n_head, vocab, n_positions):
    return _hf("GPT2Config", "GPT2LMHeadModel", lambda dropout, seq: dict(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=max(n_positions, seq),
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False, bos_token_id=vocab - 1,
        eos_token_id=vocab - 1), "ForCausalLM")


def _bert(layers, hidden, heads, intermediate, vocab, max_pos):
    return _hf("BertConfig", "BertForMaskedLM", lambda dropout, seq: dict(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
        vocab_size=vocab, max_position_embeddings=max(max_pos, seq), hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout), "ForMaskedLM")


def _llama(layers, hidden, heads, kv_heads, intermediate, vocab):
    return _hf("LlamaConfig", "LlamaForCausalLM", lambda dropout, seq: dict(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, vocab_size=vocab, max_position_embeddings=max(2048, seq),
        attention_dropout=dropout, use_cache=False), "ForCausalLM")


def _vit(layers, hidden, heads, intermediate, patch, labels):
    def config(dropout, seq):
        if seq % patch:
            raise ZooError(f"ViT image size {seq} is not a multiple of its patch size {patch}; "
                           f"pass a --seq that is")
        return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=intermediate, patch_size=patch, image_size=seq, num_labels=labels,
                    hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return _hf("ViTConfig", "ViTForImageClassification", config)


def _resnet(embedding, hidden_sizes, depths, layer_type, labels):
    return _hf("ResNetConfig", "ResNetForImageClassification", lambda dropout, seq: dict(
        embedding_size=embedding, hidden_sizes=list(hidden_sizes), depths=list(depths), layer_type=layer_type,
        num_labels=labels))


#: zoo name -> entry (kind, builder, default sequence length / image side, description)
MODELS: dict[str, _Entry] = {
    "gpt2": _Entry("causal-lm", _gpt2(12, 768, 12, 50257, 1024), 128,
                   "GPT-2 small (12 layers, 768 hidden, 12 heads, vocab 50257)"),
    "gpt2-medium": _Entry("causal-lm", _gpt2(24, 1024, 16, 50257, 1024), 128,
                          "GPT-2 medium (24 layers, 1024 hidden, 16 heads, vocab 50257)"),
    "bert-base": _Entry("masked-lm", _bert(12, 768, 12, 3072, 30522, 512), 128,
                        "BERT-base masked LM (12 layers, 768 hidden, 12 heads, vocab 30522)"),
    "llama": _Entry("causal-lm", _llama(8, 1024, 16, 4, 2816, 32000), 128,
                    "Llama-style decoder (8 layers, 1024 hidden, 16 heads / 4 KV heads, SwiGLU 2816, "
                    "vocab 32000)"),
    "vit-base": _Entry("vision", _vit(12, 768, 12, 3072, 16, 1000), 224,
                       "ViT-B/16 image classifier (12 layers, 768 hidden, 1000 classes)"),
    "resnet50": _Entry("vision", _resnet(64, (256, 512, 1024, 2048), (3, 4, 6, 3), "bottleneck", 1000), 224,
                       "ResNet-50 image classifier (bottleneck 3-4-6-3, 1000 classes)"),
    "gpt2-tiny": _Entry("causal-lm", _gpt2(2, 64, 4, 1000, 128), 32,
                        "GPT-2 tiny (2 layers, 64 hidden, 4 heads, vocab 1000)"),
    "bert-tiny": _Entry("masked-lm", _bert(2, 64, 4, 256, 1000, 128), 32,
                        "BERT tiny masked LM (2 layers, 64 hidden, 4 heads, vocab 1000)"),
    "llama-tiny": _Entry("causal-lm", _llama(2, 64, 4, 2, 128, 1000), 32,
                         "Llama tiny (2 layers, 64 hidden, 4 heads / 2 KV heads, vocab 1000)"),
    "vit-tiny": _Entry("vision", _vit(2, 64, 4, 128, 8, 10), 32,
                       "ViT tiny (2 layers, 64 hidden, patch 8, 10 classes)"),
    "resnet-tiny": _Entry("vision", _resnet(16, (16, 32), (1, 1), "basic", 10), 32,
                          "ResNet tiny (basic blocks 1-1, 16-32 channels, 10 classes)"),
}


def known_models() -> list[str]:
    """Names :func:`build_model` accepts (besides ``"module:callable"``)."""
    return list(MODELS)


def _vocab_size(model: nn.Module) -> int:
    return int(model.config.vocab_size)


def _num_labels(model: nn.Module) -> int:
    return int(model.config.num_labels)


def build_model(name: str, batch: int, seq: int | None = None, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, *, dropout: float = 0.0, seed: int = 0) -> ZooModel:
    """Build a zoo model with random weights and example inputs; no download.

    Parameters
    ----------
    name : str
        A zoo name (see :data:`MODELS`) or ``"package.module:callable"``.  The
        callable is called with the keyword arguments it accepts among
        ``batch``, ``seq``, ``device``, ``dtype`` and returns a
        :class:`ZooModel`, a ``(model, args)`` or ``(model, args, kwargs)``
        tuple, or a bare ``transformers`` model (inputs are then made from its
        config: ``input_ids`` of length ``seq`` or ``pixel_values``).
    batch : int
        Batch size, >= 1.
    seq : int, optional
        Sequence length for language models (default 128, 32 for ``*-tiny``);
        image side in pixels for vision models (default 224, 32 for ``*-tiny``).
    device : str or torch.device
    dtype : torch.dtype
        Parameter (and ``pixel_values``) dtype, e.g. ``torch.bfloat16``.
    dropout : float
        Dropout probability for the architectures that have dropout (default
        0: deterministic steps, every op recomputable).
    seed : int
        Seed of the random weights and inputs.

    Returns
    -------
    ZooModel
        Model in training mode; for language models ``kwargs`` holds
        ``input_ids`` and ``labels`` of shape ``(batch, seq)`` (int64) and the
        loss is the model's own; for vision ``kwargs`` holds ``pixel_values``
        of shape ``(batch, 3, seq, seq)`` and the loss is
        ``cross_entropy(logits, labels)`` with random labels of shape
        ``(batch,)``.

    Raises
    ------
    ZooError
        Unknown name (the message lists the known ones), bad batch/seq, or a
        callable that returns something else.

    Notes
    -----
    Built from ``transformers`` config objects (``GPT2Config``,
    ``BertConfig``, ``LlamaConfig``, ``ViTConfig``, ``ResNetConfig``).
    """
    if batch is None or int(batch) < 1:
        raise ZooError(f"batch must be a positive integer, got {batch!r}")
    batch = int(batch)
    if seq is not None and int(seq) < 1:
        raise ZooError(f"seq must be a positive integer, got {seq!r}")
    device = torch.device(device)
    if ":" in name and name not in MODELS:
        return _build_user(name, batch, seq, device, dtype, seed)
    entry = MODELS.get(name)
    if entry is None:
        raise ZooError(f"unknown model {name!r}; known models: {', '.join(MODELS)}, "
                       f"or 'package.module:callable' for your own")
    seq = int(seq) if seq is not None else entry.default_seq
    torch.manual_seed(seed)
    model = entry.builder(float(dropout), seq)
    model = model.to(device=device, dtype=dtype).train()
    gen = torch.Generator().manual_seed(seed + 1)
    if entry.kind in ("causal-lm", "masked-lm"):
        ids = torch.randint(0, _vocab_size(model), (batch, seq), generator=gen).to(device)
        kwargs = {"input_ids": ids, "labels": ids.clone()}
        loss_fn = _model_loss
        desc = f"{entry.description}; batch {batch}, sequence {seq}"
    else:
        pixels = torch.randn(batch, 3, seq, seq, generator=gen).to(device=device, dtype=dtype)
        labels = torch.randint(0, _num_labels(model), (batch,), generator=gen).to(device)
        kwargs = {"pixel_values": pixels}
        loss_fn = _CrossEntropyOnLogits(labels)
        desc = f"{entry.description}; batch {batch}, image {seq}x{seq}"
    return ZooModel(model, (), kwargs, loss_fn, desc, name=name, batch=batch, seq=seq, dtype=dtype)


def _model_loss(output) -> torch.Tensor:
    """The loss a ``transformers`` model computed from ``labels``."""
    return output.loss


class _CrossEntropyOnLogits:
    """``loss_fn(output) = cross_entropy(output.logits, labels)`` (mean over the batch)."""

    def __init__(self, labels: torch.Tensor):
        self.labels = labels

    def __call__(self, output) -> torch.Tensor:
        logits = output.logits if hasattr(output, "logits") else output
        return nn.functional.cross_entropy(logits.float(), self.labels)


def _build_user(spec: str, batch: int, seq: int | None, device: torch.device, dtype: torch.dtype,
                seed: int) -> ZooModel:
    mod_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ZooError(f"cannot import {mod_name!r} from model spec {spec!r}: {e}; "
                       f"use 'package.module:callable' with an importable module") from e
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ZooError(f"module {mod_name!r} has no attribute {attr!r} (model spec {spec!r})")
    if not callable(fn):
        raise ZooError(f"{spec!r} is not callable; name a function or class that returns a model")
    offered = {"batch": batch, "seq": seq, "device": device, "dtype": dtype}
    try:
        params = inspect.signature(fn).parameters
        takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kw = {k: v for k, v in offered.items() if takes_var_kw or k in params}
    except (TypeError, ValueError):
        kw = {}
    torch.manual_seed(seed)
    got = fn(**kw)
    if isinstance(got, ZooModel):
        got.name = got.name or spec
        got.batch = got.batch if got.batch is not None else batch
        return got
    if isinstance(got, tuple) and got and isinstance(got[0], nn.Module) and len(got) in (2, 3):
        model, args = got[0], got[1]
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        kwargs = dict(got[2]) if len(got) == 3 else {}
        return ZooModel(model.train(), args, kwargs, None, f"{spec} (user model)", name=spec,
                        batch=batch, seq=seq, dtype=dtype)
    if isinstance(got, nn.Module):
        return _inputs_for_hf(got, spec, batch, seq, device, dtype, seed)
    raise ZooError(f"{spec!r} returned {type(got).__name__}; return an nn.Module, a (model, args) or "
                   f"(model, args, kwargs) tuple, or a libra_opt.zoo.ZooModel")


def _inputs_for_hf(model: nn.Module, spec: str, batch: int, seq: int | None, device: torch.device,
                   dtype: torch.dtype, seed: int) -> ZooModel:
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    gen = torch.Generator().manual_seed(seed + 1)
    if config is not None and main == "input_ids" and getattr(config, "vocab_size", None):
        seq = seq or 128
        ids = torch.randint(0, int(config.vocab_size), (batch, seq), generator=gen).to(device)
        return ZooModel(model.train(), (), {"input_ids": ids}, None, f"{spec} (user model)", name=spec,
                        batch=batch, seq=seq, dtype=dtype)
    if config is not None and main == "pixel_values":
        seq = seq or int(getattr(config, "image_size", 224))
        ch = int(getattr(config, "num_channels", 3))
        px = torch.randn(batch, ch, seq, seq, generator=gen).to(device=device, dtype=dtype)
        return ZooModel(model.train(), (), {"pixel_values": px}, None, f"{spec} (user model)", name=spec,
                        batch=batch, seq=seq, dtype=dtype)
    raise ZooError(f"{spec!r} returned a bare {type(model).__name__} and its inputs cannot be guessed; "
                   f"return (model, example_args) instead")
