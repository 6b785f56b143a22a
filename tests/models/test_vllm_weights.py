"""What VLLMEngine checks and sends, without vLLM (runs in the main environment): the head-size
refusal, the tiny model's head-count knob, the tied head and the LoRA merge of a weight push."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from vagent.models.vllm_weights import CPU_HEAD_SIZES, check_vllm_head_size, head_size, weights_to_push, with_tied_head


def test_head_size_refusal_names_the_supported_sizes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 64, "num_attention_heads": 4}}))
    with pytest.raises(ValueError) as err:
        check_vllm_head_size(tmp_path, "cpu")
    assert "head size is 16" in str(err.value) and ", ".join(map(str, CPU_HEAD_SIZES)) in str(err.value)
    assert "model.tiny_heads" in str(err.value)
    assert check_vllm_head_size(tmp_path, "cuda") == 16  # CUDA's backends serve it
    assert head_size({"hidden_size": 128, "num_attention_heads": 4}) == 32
    assert head_size({"text_config": {"hidden_size": 128, "num_attention_heads": 4, "head_dim": 64}}) == 64


def test_tiny_heads_knob_builds_servable_models_and_keeps_the_default_name(tmp_path):
    from vagent.runconfig import ConfigError, ModelConfig, load_config
    from vagent.recipes.tiny_cache import prepare_model, tiny_model_dir

    assert "-heads" not in tiny_model_dir(ModelConfig()).name  # the default model's cache name is unchanged
    m = ModelConfig(cache_dir=str(tmp_path), tiny_hidden=64, tiny_heads=2, tiny_layers=1, tiny_image_size=56)
    out = prepare_model(m, say=lambda s: None)
    assert out.name.endswith("-heads2")
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (2, 1)
    assert check_vllm_head_size(out, "cpu") == 32
    with pytest.raises(ConfigError, match="head size"):
        load_config(None, ["model.tiny_heads=3"])


def test_tied_head_is_sent_explicitly_once():
    embed = torch.randn(8, 4)
    pairs = with_tied_head([("model.language_model.embed_tokens.weight", embed)], {"tie_word_embeddings": True})
    assert [n for n, _ in pairs] == ["model.language_model.embed_tokens.weight", "lm_head.weight"]
    assert pairs[1][1] is embed
    assert len(with_tied_head(pairs, {"tie_word_embeddings": True})) == 2  # already there: not twice
    assert len(with_tied_head(pairs[:1], {"text_config": {"tie_word_embeddings": False}})) == 1


def test_lora_push_is_the_merged_model_and_leaves_the_adapters_in_place(tiny_vlm):
    from vagent.models.loading import LoraSettings, apply_lora

    peft_model = apply_lora(copy.deepcopy(tiny_vlm.model), LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # B starts at zero: make the adapters change the model
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    pushed = dict(weights_to_push(peft_model))
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(pushed) == set(merged) and not any("lora_" in n for n in pushed)
    changed = [n for n in merged if not torch.equal(merged[n], tiny_vlm.model.state_dict()[n])]
    assert changed and all(torch.allclose(pushed[n], merged[n], atol=1e-6) for n in merged)
    assert all(torch.equal(p, before[n]) for n, p in peft_model.named_parameters())  # unmerged again


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.2])
def test_unsuppressed_logprob_undoes_the_placeholder_bias(temperature):
    from vagent.models.vllm_logprobs import SUPPRESS_BIAS, unsuppressed_logprob

    logits = torch.tensor([2.0, 1.0, 0.5, 3.0, 2.5], dtype=torch.float64)  # tokens 3 and 4 suppressed
    bias = torch.tensor([0, 0, 0, SUPPRESS_BIAS, SUPPRESS_BIAS], dtype=torch.float64)
    biased = torch.log_softmax((logits + bias) / temperature, -1)  # what vLLM returns
    own = torch.log_softmax(logits / temperature, -1)  # what HFEngine records
    for i in range(3):
        got = unsuppressed_logprob(float(biased[i]), [float(biased[3]), float(biased[4])], temperature)
        assert got == pytest.approx(float(own[i]), abs=1e-9)
    assert float(biased[0]) - float(own[0]) > 0.5  # the correction matters here
