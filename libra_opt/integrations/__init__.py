"""Training loops people already run, with a plan: Hugging Face ``Trainer`` and Lightning.

- :mod:`libra_opt.integrations.huggingface`: :class:`~libra_opt.integrations.huggingface.LibraTrainer`,
  a ``transformers.Trainer`` whose training forward runs under a plan
  (extra ``huggingface``);
- :mod:`libra_opt.integrations.lightning`: :class:`~libra_opt.integrations.lightning.LibraCallback`,
  a Lightning callback that puts a plan on a submodule of the ``LightningModule``
  (extra ``lightning``).

Both plan at the loop's first training call, with that call's inputs as the
example (so the plan is made for the batches, keyword arguments and device the
loop really uses) and the autocast dtype taken from the loop's precision
setting (``bf16=True``, ``precision="bf16-mixed"``).  This module holds what
they share: :func:`plan_at_call`.

Source: :func:`libra_opt.optimize`; ``torch.random.fork_rng`` (the RNG state
the loop sees is the one it would see without libra-opt).
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ..errors import IntegrationError

__all__ = ["plan_at_call", "check_optimize_options", "prepare_model"]

#: ``optimize()`` arguments an integration sets itself (from the loop), so they cannot be passed through
RESERVED_OPTIONS = ("model", "example_inputs", "example_kwargs", "budget", "autocast_dtype")


def check_optimize_options(options: dict | None, where: str) -> dict:
    """``options`` (keyword arguments for :func:`libra_opt.optimize`) as a new
    dict, after checking that none of them is set by the integration itself
    (:data:`RESERVED_OPTIONS`).

    Raises
    ------
    IntegrationError
        ``options`` is not a dict, or names a reserved argument; the message
        says where that value comes from instead.
    """
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise IntegrationError(f"{where}: optimize_options must be a dict of libra_opt.optimize keyword "
                               f"arguments, got {type(options).__name__}")
    bad = sorted(set(options) & set(RESERVED_OPTIONS))
    if bad:
        raise IntegrationError(
            f"{where}: optimize_options may not set {', '.join(bad)}: the budget is its own argument, the "
            f"example inputs are the loop's first training batch and the autocast dtype is the loop's "
            f"precision setting")
    return dict(options)


def prepare_model(model: nn.Module) -> nn.Module:
    """Make the ``transformers`` models in ``model`` (itself or its
    submodules) capture as one graph; returns ``model``.

    A model whose ``loss_type`` is unset or unknown (GPT-2 built from its
    config: ``loss_type=None``) logs "``loss_type=None`` ... Using the default
    loss" from inside ``forward`` on every call, which TorchDynamo cannot
    trace (a graph break).  The loss function that property resolves to (the
    one the model uses without libra-opt) is set as ``model.loss_function``
    (transformers' own setter), so the forward computes the same loss without
    logging.  Models with a known ``loss_type`` are left as they are, and
    nothing is imported: without ``transformers`` loaded there is nothing to
    do.  :func:`plan_at_call` calls it; for a loop of your own:
    ``libra_opt.optimize(prepare_model(model), ...)``.

    Source: ``transformers.PreTrainedModel.loss_function`` (property and setter).
    """
    tf = sys.modules.get("transformers")
    if tf is None:
        return model
    from transformers.loss.loss_utils import LOSS_MAPPING

    for m in model.modules():
        if (isinstance(m, tf.PreTrainedModel) and "_loss_function" not in m.__dict__
                and getattr(m, "loss_type", None) not in LOSS_MAPPING):
            m.loss_function = m.loss_function  # resolve the default once, here, eagerly
    return model


def plan_at_call(model: nn.Module, args: tuple, kwargs: dict[str, Any], budget, *,
                 autocast_dtype: torch.dtype | None, options: dict | None = None):
    """Optimize ``model`` with the inputs of the call being made as the example.

    The plan is made outside any autocast region the loop opened (the
    captured step opens its own, from ``autocast_dtype``, around the forward
    and the loss only) and without changing the RNG state the loop sees
    afterwards (profiling runs the step, and dropout draws random numbers),
    so the training run draws the same random numbers as without libra-opt.

    Parameters
    ----------
    model : torch.nn.Module
        In training mode, on its device.
    args, kwargs :
        The call's positional and keyword inputs; their shapes are the ones
        the plan is made for (a 0-d tensor such as Hugging Face's
        ``num_items_in_batch`` is an input of shape ``()``: its value may
        change from call to call).
    budget : int, float or str
        The graph-memory budget (``DESIGN.md``, "The budget contract").
    autocast_dtype : torch.dtype or None
        From the loop's precision setting.
    options : dict, optional
        More :func:`libra_opt.optimize` keyword arguments (``solver``,
        ``executor``, ``profile``, ``calibrate``, ...).

    Returns
    -------
    OptimizedModule

    Raises
    ------
    Whatever :func:`libra_opt.optimize` raises (``BudgetError``,
    ``CaptureError``, ``InfeasibleBudgetError``, ...).
    """
    from ..optimize import optimize

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.autocast(device_type=device.type, enabled=False):
        return optimize(prepare_model(model), tuple(args), budget, example_kwargs=dict(kwargs),
                        autocast_dtype=autocast_dtype, **(options or {}))
