"""SFT: chat data reading, token identity with RL prompts (docs/algorithms.md reference bug 9), loss goes down."""

from __future__ import annotations

import json

import pytest
import torch

from vagent.models.processor import ChatEncoder
from vagent.recipes.demos import DemoSettings, write_demos
from vagent.recipes.sft import DataError, encode_chat, read_chats
from vagent.rollout import EnvSpec, SamplingConfig, TokenScriptedPolicy, rollout
from vagent.rollout.encoding import flat_ids, flat_pixels


def test_sft_tokens_equal_the_rl_rollout_tokens(tmp_path, tiny_vlm):
    env_config = {"format": "grounding_worldmodeling", "image_size": 64}
    settings = DemoSettings("frozenlake", env_config, n=2, random_action_frac=0.3, actions_per_turn=1, max_turns=4)
    write_demos(settings, tmp_path / "d.jsonl")
    chats = read_chats(tmp_path / "d.jsonl")
    metas = [json.loads(line)["meta"] for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    enc = ChatEncoder.from_pretrained(tiny_vlm)
    for chat, meta in zip(chats, metas):
        sft_conv = encode_chat(chat, enc)
        replies = [m.text for m in chat.messages if m.role == "assistant"]
        # the RL rollout of the same env and seed whose policy "samples" exactly the demo's reply ids
        policy = TokenScriptedPolicy(enc, lambda conv: replies[sum(m.role == "assistant" for m in conv.messages)],
                                     end_with_eos=False)
        eps = rollout([EnvSpec("frozenlake", env_config, meta["seed"])], policy, SamplingConfig(max_new_tokens=512),
                      max_turns=len(replies))
        rl_conv = eps[0].samples[0]
        assert len(eps[0].turns) == len(replies)
        assert flat_ids(sft_conv.segments) == flat_ids(rl_conv.segments)
        assert [(len(s.input_ids), s.sampled) for s in sft_conv.segments] == \
               [(len(s.input_ids), s.sampled) for s in rl_conv.segments]
        pix_sft, grid_sft = flat_pixels(sft_conv.segments)
        pix_rl, grid_rl = flat_pixels(rl_conv.segments)
        assert torch.equal(pix_sft, pix_rl) and torch.equal(grid_sft, grid_rl)  # PNG round trip is lossless
        # loss only on the assistant tokens: each sampled segment decodes to exactly the reply text
        sampled = [enc.tokenizer.decode(s.input_ids) for s in sft_conv.segments if s.sampled]
        assert sampled == replies


def _write(tmp_path, rec, image=True):
    from PIL import Image

    if image:
        Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "im.png")
    p = tmp_path / "data.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    return p


@pytest.mark.parametrize("rec,match", [
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]}, "first message must be the system"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "<image> <image>"},
                   {"role": "assistant", "content": "a"}], "images": ["im.png"]}, "2 <image> placeholder"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "<image>"},
                   {"role": "assistant", "content": "a"}], "images": ["nope.png"]}, "not found"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "extra": 1}, "unknown key"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}, "no assistant message"),
    ({"messages": [{"role": "robot", "content": "s"}]}, "role"),
])
def test_bad_chat_data_is_a_clear_error(tmp_path, rec, match):
    with pytest.raises(DataError, match=match):
        read_chats(_write(tmp_path, rec))


def test_sft_reduces_the_loss_on_demos(small_cfg):
    from vagent.recipes.run import train
    from vagent.runs import read_metrics

    cfg = small_cfg("recipe=sft", "sft.steps=12", "sft.demos_per_env=6", "sft.batch_size=4", "sft.lr=3e-3",
                    "sft.actions_per_turn=1", "sft.describe_objects=[goal]", "log.checkpoint_every=0")
    run = train(cfg, quiet=True)
    losses = [r["sft/loss"] for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "sft"]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    assert (run / "checkpoints" / "sft_000012" / "policy" / "model.safetensors").is_file()


def test_demo_reasoning_relation_and_plan_options():
    from vagent.envs import make
    from vagent.envs.formats import parse_response
    from vagent.recipes.demos import demo_reply

    env = make("frozenlake", fixed_map=("P_O_", "_O__", "____", "O__G"), format="grounding_worldmodeling")
    env.reset(0)
    with_plan = parse_response(demo_reply(env, ["Down", "Down"], reasoning_objects=("goal",)),
                               "grounding_worldmodeling", ",", 5)
    assert with_plan.reasoning == "The goal is below and to the right of you. I move Down, Down."
    assert with_plan.actions == ("Down", "Down")
    no_plan = parse_response(demo_reply(env, ["Down", "Right"], reasoning_objects=("goal",), plan=False),
                             "grounding_worldmodeling", ",", 5)
    assert no_plan.reasoning == "The goal is below and to the right of you."
    assert no_plan.actions == ("Down", "Right")
    bare = parse_response(demo_reply(env, ["Up"], plan=False), "grounding_worldmodeling", ",", 5)
    assert bare.reasoning == "I move." and bare.format_ok
    assert env.state()["player"] == [0, 0]  # demo_reply steps a copy, never the env


def test_answer_weight_puts_weight_on_the_answer_tokens_only(tmp_path, tiny_vlm):
    """answer_weights: 1 on reply tokens before <answer>, w from <answer> to </answer>, 0 on prompts;
    sft_loss with those weights is sum(w * nll) / sum(w) however the rows are micro-batched."""
    from vagent.models import load_policy
    from vagent.recipes.sft import SFTForward, answer_weights, sft_batch, sft_loss

    settings = DemoSettings("frozenlake", {"format": "grounding_worldmodeling", "image_size": 64}, n=2,
                            random_action_frac=0.5, actions_per_turn=2, max_turns=3)
    write_demos(settings, tmp_path / "d.jsonl")
    loaded = load_policy(tiny_vlm)
    enc, tok = loaded.encoder, loaded.encoder.tokenizer
    convs = [encode_chat(c, enc) for c in read_chats(tmp_path / "d.jsonl")]
    batch = sft_batch(convs, enc.pad_token_id)
    w = answer_weights(batch, tok.convert_tokens_to_ids("<answer>"), 4.0)
    assert torch.all(w[~batch.loss_mask] == 0)
    for b, conv in enumerate(convs):
        pos = 0
        for seg in conv.segments:
            n = len(seg.input_ids)
            if seg.sampled:
                text = tok.decode(seg.input_ids)
                start = text.index("<answer>")
                n_before = len(tok(text[:start], add_special_tokens=False)["input_ids"])
                assert torch.all(w[b, pos:pos + n_before] == 1.0), text
                assert torch.all(w[b, pos + n_before:pos + n] == 4.0), text
                assert tok.decode(seg.input_ids[n_before:]).startswith("<answer>")
            pos += n
    model = loaded.model.eval()
    with torch.no_grad():
        one = sft_loss(model, batch, SFTForward(10**6), backward=False, weights=w)
        split = sft_loss(model, batch, SFTForward(1), backward=False, weights=w)
        plain = sft_loss(model, batch, SFTForward(10**6), backward=False)
        from vagent.recipes.scoring import policy_forward
        lp, _ = policy_forward(model, batch, 1024)
        uneven = w.clone()
        uneven[0] *= 10  # rows weigh very differently: the micro-batch shares must follow the weights
        uneven_split = sft_loss(model, batch, SFTForward(1), backward=False, weights=uneven)
    expected = float(-(lp * w).sum() / w.sum())
    assert one["loss"] == pytest.approx(expected, rel=1e-5)
    assert split["loss"] == pytest.approx(expected, rel=2e-5)  # one row per micro-batch
    assert uneven_split["loss"] == pytest.approx(float(-(lp * uneven).sum() / uneven.sum()), rel=2e-5)
    assert plain["loss"] == pytest.approx(float(-(lp * batch.loss_mask).sum() / batch.loss_mask.sum()), rel=1e-5)
    assert abs(plain["loss"] - expected) > 1e-5 * expected  # the weights moved the loss
    assert torch.equal(answer_weights(batch, tok.convert_tokens_to_ids("<answer>"), 1.0), batch.loss_mask.float())


def test_shared_prefix_gives_the_full_forward_loss_and_stops_the_gradient_into_the_prompt(tmp_path, tiny_vlm):
    """sft.shared_prefix: the system prompt every chat starts with runs once; the loss and the
    per-token log-probs equal the full forward's (one row or several per micro-batch); the gradient,
    accumulated one row per micro-batch, equals one backward through the whole batch's suffixes on
    the detached prefix states, and differs from the exact gradient (the stop-gradient is real)."""
    from vagent.models import load_policy
    from vagent.models.forward import mrope_image_token_id
    from vagent.recipes.scoring import common_prefix_length, hidden_after_prefix, policy_forward, shared_prefix
    from vagent.recipes.sft import SFTForward, sft_batch, sft_loss

    settings = DemoSettings("frozenlake", {"format": "grounding_worldmodeling", "image_size": 64}, n=3,
                            random_action_frac=0.5, actions_per_turn=2, max_turns=3)
    write_demos(settings, tmp_path / "d.jsonl")
    loaded = load_policy(tiny_vlm)
    convs = [encode_chat(c, loaded.encoder) for c in read_chats(tmp_path / "d.jsonl")]
    batch = sft_batch(convs, loaded.encoder.pad_token_id)
    model = loaded.model.eval()
    n = common_prefix_length(batch, mrope_image_token_id(model))
    system_len = len(convs[0].segments[0].input_ids)
    assert 32 <= n <= system_len + 10  # the system prompt (+ the user turn's opening tokens), no image
    assert not batch.loss_mask[:, :n + 1].any()
    prefix = shared_prefix(model, batch)
    assert prefix is not None and prefix.length == n
    with torch.no_grad():
        full_lp, _ = policy_forward(model, batch, 1024)
        shared_lp, _ = policy_forward(model, batch, 1024, hidden=hidden_after_prefix(model, batch, prefix))
        full = sft_loss(model, batch, SFTForward(10**6), backward=False)
        for micro in (10**6, 1):
            shared = sft_loss(model, batch, SFTForward(micro, shared=True), backward=False)
            assert shared["loss"] == pytest.approx(full["loss"], rel=1e-5)
            assert shared["token_accuracy"] == full["token_accuracy"]
    assert torch.allclose(shared_lp, full_lp, atol=1e-5)
    assert full_lp[batch.loss_mask].abs().min() > 0  # loss positions were really computed

    def grads(shared: bool) -> torch.Tensor:
        model.zero_grad()
        sft_loss(model, batch, SFTForward(1, shared=shared))
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    def grads_detached_prefix() -> torch.Tensor:
        # the reference: the whole batch in one pass on no-grad prefix states (the definition)
        model.zero_grad()
        with torch.no_grad():
            pre = shared_prefix(model, batch)
        lp, _ = policy_forward(model, batch, 1024, hidden=hidden_after_prefix(model, batch, pre))
        (-(lp * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    g_shared, g_exact, g_ref = grads(True), grads(False), grads_detached_prefix()
    assert torch.allclose(g_shared, g_ref, atol=1e-6)
    assert (g_shared - g_exact).abs().max() > 1e-6  # the stop-gradient is a real departure


def test_shared_prefix_is_off_when_rows_differ_from_the_start(tiny_vlm):
    from vagent.models import load_policy
    from vagent.recipes.scoring import shared_prefix
    from vagent.recipes.sft import sft_batch
    from vagent.rollout.policy import Conversation, Message
    from vagent.rollout.encoding import append_reply, encode_pending

    loaded = load_policy(tiny_vlm)
    enc = loaded.encoder
    convs = []
    for system in ("You play FrozenLake.", "Something else entirely, different from the first word on."):
        conv = Conversation(messages=[Message("system", system), Message("user", "go")])
        ids = enc.tokenizer("<answer>Left</answer>", add_special_tokens=False)["input_ids"]
        append_reply(conv, encode_pending(conv, enc), ids, [0.0] * len(ids), enc)
        convs.append(conv)
    assert shared_prefix(loaded.model, sft_batch(convs, enc.pad_token_id)) is None
