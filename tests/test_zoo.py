"""The model zoo: every tiny model builds offline, runs a forward and gives a
finite scalar loss whose backward reaches every trainable parameter."""
import math
import os
import sys
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from libra_opt.errors import LibraOptError
from libra_opt.apps.zoo import MODELS, ZooError, ZooModel, build_model, known_models

TINY = [n for n in MODELS if n.endswith("-tiny")]


def test_zoo_has_the_promised_architectures():
    for name in ("gpt2", "gpt2-medium", "bert-base", "llama", "vit-base", "resnet50",
                 "gpt2-tiny", "bert-tiny", "llama-tiny", "vit-tiny", "resnet-tiny"):
        assert name in known_models()


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_forward_and_backward(name):
    zm = build_model(name, batch=2)
    assert isinstance(zm, ZooModel)
    assert zm.model.training
    assert zm.batch == 2 and zm.seq == MODELS[name].default_seq
    loss = zm.step_loss()
    value = float(loss.detach())
    assert loss.dim() == 0 and math.isfinite(value)
    # random weights, uniform-ish predictions: the loss is near log(#classes)
    classes = zm.model.config.vocab_size if MODELS[name].kind != "vision" else zm.model.config.num_labels
    assert abs(value - math.log(classes)) < 1.0
    loss.backward()
    grads = [p.grad for p in zm.model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_language_model_inputs_have_batch_and_seq():
    zm = build_model("gpt2-tiny", batch=3, seq=16)
    assert zm.kwargs["input_ids"].shape == (3, 16)
    assert torch.equal(zm.kwargs["labels"], zm.kwargs["input_ids"])
    assert zm.model.loss_type == "ForCausalLM"


def test_vision_seq_is_the_image_side():
    zm = build_model("vit-tiny", batch=2, seq=48)
    assert zm.kwargs["pixel_values"].shape == (2, 3, 48, 48)
    assert zm.step_loss().dim() == 0
    with pytest.raises(ZooError, match="multiple of its patch size"):
        build_model("vit-tiny", batch=1, seq=30)


def test_llama_tiny_uses_grouped_query_attention():
    cfg = build_model("llama-tiny", batch=1).model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads


def test_dtype_and_determinism():
    a = build_model("resnet-tiny", batch=2, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in a.model.parameters())
    x = build_model("gpt2-tiny", batch=2)
    y = build_model("gpt2-tiny", batch=2)
    assert torch.equal(x.kwargs["input_ids"], y.kwargs["input_ids"])
    assert torch.equal(next(x.model.parameters()), next(y.model.parameters()))


def test_unknown_name_lists_known_models():
    with pytest.raises(ZooError) as ei:
        build_model("gpt5", batch=1)
    assert isinstance(ei.value, LibraOptError) and isinstance(ei.value, ValueError)
    for name in ("gpt2", "resnet50", "vit-tiny"):
        assert name in str(ei.value)
    with pytest.raises(ZooError, match="batch"):
        build_model("gpt2-tiny", batch=0)


def test_user_callable(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        from libra_opt.apps.zoo import build_model

        def mlp(batch, device="cpu"):
            m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            return m.to(device), (torch.randn(batch, 8, device=device),)

        def tiny_gpt(batch, seq):
            return build_model("gpt2-tiny", batch, seq).model

        def not_a_model():
            return 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_models", None)
    zm = build_model("my_models:mlp", batch=5)
    assert zm.args[0].shape == (5, 8) and zm.loss_fn is None
    assert zm.step_loss().shape == (5, 4)
    hf = build_model("my_models:tiny_gpt", batch=2, seq=8)
    assert hf.kwargs["input_ids"].shape == (2, 8)
    with pytest.raises(ZooError, match="returned int"):
        build_model("my_models:not_a_model", batch=1)
    with pytest.raises(ZooError, match="no attribute"):
        build_model("my_models:missing", batch=1)
    with pytest.raises(ZooError, match="cannot import"):
        build_model("no_such_module_xyz:f", batch=1)
