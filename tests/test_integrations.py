"""The loops people already run, with the README's code: Hugging Face ``Trainer``
(:class:`~libra_opt.integrations.huggingface.LibraTrainer`) and Lightning
(:class:`~libra_opt.integrations.lightning.LibraCallback`), each trained for a few steps on a
tiny random-weight GPT-2 and compared with the same loop without libra-opt.

On a CPU the eager executor runs the planned graphs op by op, so losses and parameters are
compared bitwise.  Under bf16 autocast the models have no dropout: CPU eager dropout scales by
``1/(1-p)`` rounded to bf16 while the captured ``native_dropout_backward`` scales by the exact
factor (a capture-fidelity difference of CPU autocast, not of the integrations); in fp32 dropout
is on and the comparison is still bitwise.

Planning uses unit op times (:func:`unit_op_times`): profiling the unplanned step is what makes
``optimize`` slow on a shared CPU, and the integrations' code path is the same either way.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from libra_opt.errors import IntegrationError

transformers = pytest.importorskip("transformers")

README = Path(__file__).resolve().parent.parent / "README.md"
SEQ, VOCAB = 16, 64


def readme_block(heading: str) -> str:
    """The first ```python block of the README section ``### <heading>``."""
    text = README.read_text()
    section = text[text.index(f"### {heading}\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def unit_op_times(monkeypatch):
    """``optimize`` plans with unit op times instead of profiling (see the module docstring)."""
    import sys

    import libra_opt.optimize

    opt = sys.modules["libra_opt.optimize"]      # the module (``libra_opt.optimize`` may be the function)
    real = opt.problem_of
    monkeypatch.setattr(opt, "problem_of", lambda step, **kw: real(step, **{**kw, "profile": False}))


def tiny_gpt2(dropout: float):
    """A 1-layer GPT-2 with random weights (seeded), built from its config: ``loss_type`` unset,
    as the issue found it (one layer: tracing time grows with the layers)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, resid_pdrop=dropout,
                     embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


class TokenDataset(torch.utils.data.Dataset):
    """``n`` rows of ``input_ids`` and ``labels`` (a varying number of them ``-100``: padding, so
    the Trainer's ``num_items_in_batch`` changes from batch to batch) and a column the model does
    not take (``remove_unused_columns`` must drop it, and only it)."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.pad = torch.randint(0, SEQ // 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[SEQ - int(self.pad[i]):] = -100
        return {"input_ids": self.ids[i], "labels": labels, "source": "unused by the model"}


# ---------------------------------------------------------------- Hugging Face Trainer
def _training_args(tmp_path, name, **kw):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=2,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[],
                             disable_tqdm=True, **{"use_cpu": True, **kw})


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _hf_pair(tmp_path, dropout, n, **args_kw):
    """(eager ``Trainer``, the README's ``LibraTrainer``) after training the same model and data."""
    pytest.importorskip("accelerate")
    ref = transformers.Trainer(model=tiny_gpt2(dropout), args=_training_args(tmp_path, "eager", **args_kw),
                               train_dataset=TokenDataset(n))
    ref.train()
    ns = {"model": tiny_gpt2(dropout), "args": _training_args(tmp_path, "libra", **args_kw),
          "train_dataset": TokenDataset(n)}
    exec(readme_block("Use it with Hugging Face Trainer"), ns)
    return ref, ns["trainer"]


def _assert_same_parameters(a, b):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_hf_trainer_readme_code_trains_like_trainer_under_bf16_and_saves(tmp_path, unit_op_times):
    """bf16=True picks the autocast, num_items_in_batch (varying: padded labels) is a 0-d planned
    input, remove_unused_columns keeps the model's columns; losses and parameters equal the
    plain Trainer's bitwise; save_model reloads with from_pretrained, tied weights and all."""
    from transformers import GPT2LMHeadModel

    ref, trainer = _hf_pair(tmp_path, 0.0, 8, bf16=True)
    om = trainer.optimized_model
    assert om.autocast_dtype == torch.bfloat16 and () in om.example_shapes   # num_items_in_batch: shape ()
    assert trainer.model is om.model and isinstance(trainer.model, GPT2LMHeadModel)
    assert len(_losses(ref)) == 2 and _losses(trainer) == _losses(ref)
    _assert_same_parameters(trainer.model, ref.model)
    assert trainer.evaluate(TokenDataset(4))["eval_loss"] == ref.evaluate(TokenDataset(4))["eval_loss"]
    back = GPT2LMHeadModel.from_pretrained(trainer.args.output_dir)
    assert back.lm_head.weight is back.transformer.wte.weight
    _assert_same_parameters(back, trainer.model)


def test_hf_trainer_fp32_with_dropout_and_accumulation_equals_trainer_bitwise(tmp_path, unit_op_times):
    """fp32 with dropout and gradient accumulation (num_items_in_batch counts two batches), the
    fourth batch short (14 rows in batches of 4: a plan of its own): the same random numbers are
    drawn as without libra-opt, so parameters are equal bitwise."""
    ref, trainer = _hf_pair(tmp_path, 0.1, 14, gradient_accumulation_steps=2)
    assert len(trainer.optimized_model.shape_plans) == 1
    assert trainer.optimized_model.autocast_dtype is None
    assert _losses(trainer) == _losses(ref)
    _assert_same_parameters(trainer.model, ref.model)
    # a num_items_in_batch given as a Python int (older transformers) is the same planned input
    ids = TokenDataset(4).ids
    losses = []
    for t in (ref, trainer):
        t.model.train()
        torch.manual_seed(3)
        losses.append([t.compute_loss(t.model, {"input_ids": ids, "labels": ids.clone()}, num_items_in_batch=n)
                       for n in (37, 41)])
    assert [torch.equal(a, b) for a, b in zip(*losses)] == [True, True]


def test_hf_trainer_refuses_what_conflicts_with_the_plan(tmp_path):
    pytest.importorskip("accelerate")
    from libra_opt.integrations.huggingface import LibraTrainer

    with pytest.raises(IntegrationError, match="gradient_checkpointing=False"):
        LibraTrainer(model=tiny_gpt2(0.0), args=_training_args(tmp_path, "gc", gradient_checkpointing=True),
                     train_dataset=TokenDataset(4), budget="60%")
    with pytest.raises(IntegrationError, match="may not set example_kwargs"):
        LibraTrainer(model=tiny_gpt2(0.0), args=_training_args(tmp_path, "x"), train_dataset=TokenDataset(4),
                     budget="60%", optimize_options={"example_kwargs": {}})


def test_optimized_module_forwards_the_models_attributes(tmp_path):
    """config, can_generate, generate, save_pretrained reach the wrapped model; gradient
    checkpointing is refused; a missing attribute names both classes; LibraTrainer wants the
    model itself."""
    from libra_opt.integrations.huggingface import prepare_model
    from libra_opt.optimize import optimize
    from transformers import GPT2LMHeadModel

    model = prepare_model(tiny_gpt2(0.0))
    x = TokenDataset(4).ids
    om = optimize(model, (), "80%", example_kwargs={"input_ids": x, "labels": x}, profile=False)
    assert om.config is model.config and om.can_generate()
    assert torch.equal(om.generate(x[:1, :4], max_new_tokens=3, do_sample=False),
                       model.generate(x[:1, :4], max_new_tokens=3, do_sample=False))
    om.save_pretrained(tmp_path)
    _assert_same_parameters(GPT2LMHeadModel.from_pretrained(tmp_path), model)
    with pytest.raises(IntegrationError, match="already recomputes"):
        om.gradient_checkpointing_enable()
    with pytest.raises(AttributeError, match="OptimizedModule' object and its model \\(GPT2LMHeadModel\\)"):
        om.no_such_attribute
    pytest.importorskip("accelerate")
    from libra_opt.integrations.huggingface import LibraTrainer

    with pytest.raises(IntegrationError, match="takes the model itself"):
        LibraTrainer(model=om, args=_training_args(tmp_path, "om"), train_dataset=TokenDataset(4), budget="60%")


@pytest.mark.cuda
def test_hf_trainer_on_cuda_bf16_with_the_inductor_executor(tmp_path):
    """On a GPU: the default executor (Inductor) under bf16, profiled; losses as close to the plain
    Trainer's as bf16 kernels fused differently allow (2e-2 on a loss near ln(64) = 4.2)."""
    ref, trainer = _hf_pair(tmp_path, 0.0, 8, bf16=True, use_cpu=False)
    assert trainer.optimized_model.executor == "inductor" and trainer.model.device.type == "cuda"
    assert trainer.optimized_model.problem.provenance.extra.get("profile") is not None
    assert _losses(trainer) == pytest.approx(_losses(ref), abs=2e-2)


# ---------------------------------------------------------------- Lightning
def _lit_module_class():
    """(lightning, a LightningModule whose ``training_step`` calls ``self.model``: an MLP whose
    activations outweigh its weights, so that the README's 60% budget has a plan)."""
    L = pytest.importorskip("lightning")

    class LitMLP(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            layers = [torch.nn.Linear(16, 32), torch.nn.Tanh()]
            for _ in range(8):
                layers += [torch.nn.Linear(32, 32), torch.nn.Tanh()]
            self.model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x).float(), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return L, LitMLP


def _loader():
    g = torch.Generator().manual_seed(2)
    ds = torch.utils.data.TensorDataset(torch.randn(700, 16, generator=g), torch.randn(700, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, generator=g)   # last batch: 188


def test_lightning_readme_code_trains_like_lightning_under_bf16_mixed(tmp_path, monkeypatch, unit_op_times):
    """precision="bf16-mixed" picks the autocast; the short last batch gets a plan of its own; the
    parameters after an epoch equal the plain
    Trainer's bitwise; the epoch's checkpoint has the model's own keys and loads into a plain
    LightningModule."""
    L, LitMLP = _lit_module_class()
    monkeypatch.chdir(tmp_path)          # the default logger and checkpoints write under the working directory
    opts = dict(max_epochs=1, precision="bf16-mixed", enable_progress_bar=False, enable_model_summary=False,
                logger=False, enable_checkpointing=False)
    ref = LitMLP()
    L.Trainer(**opts).fit(ref, _loader())
    ns = {"lit_module": LitMLP(), "train_loader": _loader()}
    exec(readme_block("Use it with Lightning"), ns)
    lit, trainer = ns["lit_module"], ns["trainer"]
    (cb,) = [c for c in trainer.callbacks if type(c).__name__ == "LibraCallback"]
    assert lit.model is cb.optimized_model and cb.optimized_model.autocast_dtype == torch.bfloat16
    assert len(cb.optimized_model.shape_plans) == 1
    _assert_same_parameters(lit.model.model, ref.model)
    (ckpt,) = Path(trainer.checkpoint_callback.best_model_path).parent.glob("*.ckpt")
    plain = LitMLP.load_from_checkpoint(ckpt)
    _assert_same_parameters(plain.model, ref.model)


def test_lightning_callback_names_a_missing_submodule():
    _, LitMLP = _lit_module_class()
    from libra_opt.integrations.lightning import LibraCallback

    with pytest.raises(IntegrationError, match=r"no submodule 'net' \(its children: model\)"):
        LibraCallback(budget="60%", attribute="net").on_fit_start(None, LitMLP())


# ---------------------------------------------------------------- shared
def test_plan_at_call_leaves_the_rng_state_and_ambient_autocast_alone():
    """Profiling runs the step (dropout draws random numbers): the state after planning is the
    state before, so the loop draws what it would without libra-opt."""
    from libra_opt.integrations import plan_at_call

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 8))
    x = torch.randn(4, 8)
    before = torch.get_rng_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        om = plan_at_call(model, (x,), {}, 1.0, autocast_dtype=torch.bfloat16, options={"solver": "none"})
        assert torch.is_autocast_enabled("cpu")
    assert om.problem.provenance.extra.get("profile") is not None      # it did profile
    assert torch.equal(torch.get_rng_state(), before)
