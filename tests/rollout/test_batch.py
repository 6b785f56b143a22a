"""Token batches from token-level rollouts: masks by token-id ranges, row layouts, images, bootstrap.

The policy is ``TokenScriptedPolicy`` with the tiny VLM's real ``ChatEncoder`` (no model needed);
expected rows are rebuilt independently from the Episode records with the encoder's public API.
"""

from __future__ import annotations

import pytest
import torch

from vagent.distributed import micro_batch_rows
from vagent.rollout import EnvSpec, Reply, SamplingConfig, ScriptedPolicy, TokenScriptedPolicy, rollout
from vagent.rollout.batch import build_token_batch

from tests.rollout._envs import line_factory

SAMPLING = SamplingConfig(max_new_tokens=64)
FL_REPLIES = ["<think>The goal is below me.</think><answer>Down</answer>",
              "<think>Now go right.</think><answer>Right</answer>",
              "<think>Up again.</think><answer>Up</answer>"]


def fl_reply(conv):
    n_user = sum(m.role == "user" for m in conv.messages)
    return FL_REPLIES[(n_user - 1) % len(FL_REPLIES)]


def fl_rollout(encoder, mode="concat", window=None, seeds=(0, 1, 2), max_turns=3, **policy_kw):
    specs = [EnvSpec("frozenlake", {"format": "free_think"}, s) for s in seeds]
    policy = TokenScriptedPolicy(encoder, fl_reply, **policy_kw)
    return rollout(specs, policy, SAMPLING, max_turns=max_turns, mode=mode, window=window)


def user_ids(encoder, obs):
    return encoder.encode_user(obs.text, list(obs.images)).input_ids


def turn_ids(encoder, turn):
    """[(ids, sampled)] of one turn as the concat layout has it: observation, reply, closing ids."""
    return [(user_ids(encoder, turn.observation), False), (turn.sampled_token_ids, True),
            (encoder.close_assistant(turn.sampled_token_ids), False)]


def check_row(batch, b, pieces, episode, turns):
    """Row b equals the concatenation of ``pieces``; masks, logprobs, rewards line up by range."""
    ids = [i for p, _ in pieces for i in p]
    n = len(ids)
    assert batch.input_ids[b, :n].tolist() == ids
    assert batch.attention_mask[b].sum() == n
    expected_mask = [s for p, s in pieces for _ in p]
    assert batch.loss_mask[b, :n].tolist() == expected_mask
    assert not batch.loss_mask[b, n:].any()
    pos, k = 0, 0
    for p, sampled in pieces:
        if sampled:
            turn = turns[k]
            assert batch.old_logprobs[b, pos:pos + len(p)].tolist() == pytest.approx(turn.sampled_logprobs)
            assert batch.turn_index[b, pos:pos + len(p)].tolist() == [turn.index] * len(p)
            assert batch.turn_end_mask[b, pos:pos + len(p)].tolist() == [False] * (len(p) - 1) + [True]
            assert batch.token_rewards[b, pos + len(p) - 1] == pytest.approx(turn.reward)
            k += 1
        pos += len(p)
    assert k == len(turns)
    assert batch.turn_end_mask[b].sum() == len(turns)
    assert batch.token_rewards[b].sum() == pytest.approx(sum(t.reward for t in turns), abs=1e-6)


def test_concat_rows_match_an_independent_reconstruction(encoder):
    eps = fl_rollout(encoder)
    batch = build_token_batch(eps, mode="concat", pad_token_id=encoder.pad_token_id)
    assert batch.batch_size == len(eps)
    for b, ep in enumerate(eps):
        pieces = [(encoder.encode_system(ep.system_prompt).input_ids, False)]
        for t in ep.turns:
            pieces += turn_ids(encoder, t)
        if ep.truncated:
            pieces.append((user_ids(encoder, ep.final_observation), False))
        check_row(batch, b, pieces, ep, ep.turns)
        assert batch.row_turn[b] == -1 and batch.traj_ids[b] == ep.traj_id and batch.group_ids[b] == ep.group_id
        assert batch.episode_returns[b] == pytest.approx(ep.total_reward)
        assert len(batch.state_keys[b]) == len(ep.turns)
        # observation, image and template tokens never get mask 1
        row = batch.input_ids[b]
        for special in ("<|im_start|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"):
            tid = encoder.tokenizer.convert_tokens_to_ids(special)
            assert not batch.loss_mask[b][row == tid].any()
        # Turn.prompt_token_ids: what was appended before the reply (system + observation on turn 0)
        for t in ep.turns:
            expected = encoder.encode_system(ep.system_prompt).input_ids if t.index == 0 else []
            assert t.prompt_token_ids == expected + user_ids(encoder, t.observation)
        # the Turn record holds the same sampled ids as the row's mask-1 positions
        assert row[batch.loss_mask[b]].tolist() == [i for t in ep.turns for i in t.sampled_token_ids]


def test_segments_equal_templating_the_whole_conversation(encoder):
    (ep,) = fl_rollout(encoder, seeds=(1,), max_turns=3)
    (conv,) = ep.samples
    messages = [{"role": m.role, "content": m.text, "images": list(m.images)} for m in conv.messages]
    encoder.check_incremental(messages)  # incremental public encoding == template of the whole chat
    reference = []
    for m in messages:
        if m["role"] == "system":
            reference += encoder.encode_system(m["content"]).input_ids
        elif m["role"] == "user":
            reference += encoder.encode_user(m["content"], m["images"]).input_ids
        else:
            reference += encoder.encode_assistant(m["content"])
    assert [i for s in conv.segments for i in s.input_ids] == reference


def test_image_tokens_match_grid_and_stay_with_their_pixels(encoder):
    eps = fl_rollout(encoder)
    batch = build_token_batch(eps, mode="concat", pad_token_id=encoder.pad_token_id)
    pad = encoder.image_token_id
    per_image = (batch.image_grid_thw.prod(-1) // encoder.merge_size**2).tolist()
    first = 0
    for b, ep in enumerate(eps):
        n_img = int(batch.n_images[b])
        assert n_img == len(ep.turns) + int(ep.truncated)  # one image per observation shown
        assert int((batch.input_ids[b] == pad).sum()) == sum(per_image[first:first + n_img])
        first += n_img
    for seg in (s for ep in eps for s in ep.samples[0].segments if s.n_images):
        assert seg.input_ids.count(pad) == int(seg.image_grid_thw.prod(-1).sum()) // 4
        assert seg.pixel_values.shape[0] == int(seg.image_grid_thw.prod(-1).sum())
    assert batch.pixel_values.shape[0] == int(batch.image_grid_thw.prod(-1).sum())


def test_no_concat_one_row_per_turn(encoder):
    eps = fl_rollout(encoder, mode="no_concat")
    batch = build_token_batch(eps, mode="no_concat", pad_token_id=encoder.pad_token_id)
    assert batch.batch_size == sum(len(e.turns) for e in eps)
    b = 0
    for ep in eps:
        system = encoder.encode_system(ep.system_prompt).input_ids
        for t in ep.turns:
            pieces = [(system, False)] + turn_ids(encoder, t)
            last = t.index == len(ep.turns) - 1
            if last and ep.truncated:
                pieces.append((user_ids(encoder, ep.final_observation), False))
            check_row(batch, b, pieces, ep, [t])
            assert batch.row_turn[b] == t.index and batch.traj_ids[b] == ep.traj_id
            assert batch.truncated[b] == (last and ep.truncated)
            assert batch.state_keys[b] == [batch.state_keys[b][0]] and len(batch.state_keys[b]) == 1
            assert batch.n_images[b] == 1 + int(last and ep.truncated)
            b += 1


def test_window_rows_hold_the_last_k_turns_as_context(encoder):
    k = 1
    eps = fl_rollout(encoder, mode="concat", window=k, max_turns=3)
    batch = build_token_batch(eps, mode="window", pad_token_id=encoder.pad_token_id)
    b = 0
    for ep in eps:
        assert len(ep.samples) == len(ep.turns)
        for t in ep.turns:
            pieces = [(encoder.encode_system(ep.system_prompt).input_ids, False)]
            for old in ep.turns[max(0, t.index - k):t.index]:  # earlier replies: context, mask 0
                pieces += [(ids, False) for ids, _ in turn_ids(encoder, old)]
            pieces += turn_ids(encoder, t)
            if t.index == len(ep.turns) - 1 and ep.truncated:
                pieces.append((user_ids(encoder, ep.final_observation), False))
            check_row(batch, b, pieces, ep, [t])
            assert batch.n_images[b] == min(t.index, k) + 1 + int(t.index == len(ep.turns) - 1 and ep.truncated)
            b += 1
    assert b == batch.batch_size


def test_truncated_episode_bootstraps_from_its_final_observation(encoder):
    # seed 0 starts at cell 0: length 9 is never reached in 2 turns (truncated); length 1 with seed 1
    # starts on... cell 1 = the goal after one step right (terminated)
    specs = [EnvSpec("line", {}, 0, factory=line_factory(length=9, with_image=True)),
             EnvSpec("line", {}, 0, factory=line_factory(length=1, with_image=True))]
    policy = TokenScriptedPolicy(encoder, lambda conv: "<answer>right</answer>")
    for mode in ("concat", "no_concat"):
        eps = rollout(specs, policy, SAMPLING, max_turns=2, mode=mode)
        trunc, term = eps
        assert trunc.truncated and term.terminated and not term.truncated
        assert trunc.final_segment is not None and term.final_segment is None
        batch = build_token_batch(eps, mode=mode, pad_token_id=encoder.pad_token_id)
        final_ids = user_ids(encoder, trunc.final_observation)
        rows = batch.traj_ids.tolist()
        last_trunc_row = max(i for i, t in enumerate(rows) if t == trunc.traj_id)
        n = int(batch.attention_mask[last_trunc_row].sum())
        assert batch.bootstrap_index[last_trunc_row] == n - 1
        assert batch.input_ids[last_trunc_row, n - len(final_ids):n].tolist() == final_ids
        assert not batch.loss_mask[last_trunc_row, n - len(final_ids):].any()
        assert batch.truncated.tolist() == [i == last_trunc_row for i in range(batch.batch_size)]
        assert (batch.bootstrap_index >= 0).sum() == 1
        # the position's token is the end of the assistant generation prompt
        gen_prompt = encoder.encode_user("x").input_ids[-3:]
        assert batch.input_ids[last_trunc_row, n - 3:n].tolist() == gen_prompt
        no_boot = build_token_batch(eps, mode=mode, pad_token_id=encoder.pad_token_id, append_final_observation=False)
        assert (no_boot.bootstrap_index == -1).all()
        assert int(no_boot.attention_mask[last_trunc_row].sum()) == n - len(final_ids)


def test_context_limit_truncates_before_generating_and_keeps_images_whole(encoder):
    spec = [EnvSpec("line", {}, 0, factory=line_factory(length=9, with_image=True))]
    reply = lambda conv: "<answer>right</answer>"  # noqa: E731
    (free,) = rollout(spec, TokenScriptedPolicy(encoder, reply), SAMPLING, max_turns=4)
    sizes = [sum(len(s.input_ids) for s in free.samples[0].segments[:i]) for i in range(1, 20)]
    # context after 2 full turns plus the third observation, + max_new_tokens: just over the limit
    third_ctx = len(encoder.encode_system(free.system_prompt).input_ids) + sum(
        len(user_ids(encoder, t.observation)) + len(t.sampled_token_ids) + len(encoder.close_assistant(t.sampled_token_ids))
        for t in free.turns[:2]) + len(user_ids(encoder, free.turns[2].observation))
    assert third_ctx in sizes
    limit = third_ctx + SAMPLING.max_new_tokens - 1
    policy = TokenScriptedPolicy(encoder, reply, max_context_tokens=limit)
    eps = rollout(spec, policy, SAMPLING, max_turns=4)
    (ep,) = eps
    assert len(ep.turns) == 2 and ep.truncated and ep.error is None
    assert ep.final_observation.text == free.turns[2].observation.text  # the unanswered observation
    assert ep.samples[0].messages[-1].role == "assistant"
    batch = build_token_batch(eps, mode="concat", pad_token_id=encoder.pad_token_id)
    assert batch.n_images[0] == 3  # two observations answered + the final one, each image whole
    assert int((batch.input_ids[0] == encoder.image_token_id).sum()) == 3 * int(batch.image_grid_thw[0].prod()) // 4
    assert batch.pixel_values.shape[0] == int(batch.image_grid_thw.prod(-1).sum())


def test_errored_and_empty_episodes_are_excluded_and_counted(encoder):
    specs = [EnvSpec("line", {}, 0, factory=line_factory(length=2)),
             EnvSpec("line", {}, 0, factory=line_factory(length=2, fail_at_step=1))]
    policy = TokenScriptedPolicy(encoder, lambda conv: "<answer>right</answer>")
    eps = rollout(specs, policy, SAMPLING, max_turns=3)
    assert eps[1].error is not None
    batch = build_token_batch(eps, mode="concat", pad_token_id=encoder.pad_token_id)
    assert batch.batch_size == 1 and batch.n_error_episodes == 1 and batch.episode_index.tolist() == [0]
    tight = TokenScriptedPolicy(encoder, lambda conv: "<answer>right</answer>", max_context_tokens=10)
    empty = rollout(specs[:1], tight, SAMPLING, max_turns=3)
    assert empty[0].truncated and not empty[0].turns
    batch = build_token_batch(list(eps) + list(empty), mode="concat", pad_token_id=encoder.pad_token_id)
    assert batch.n_empty_episodes == 1 and batch.n_error_episodes == 1


def test_build_errors_name_the_fix(encoder):
    text_eps = rollout([EnvSpec("line", {}, 0, factory=line_factory())],
                       ScriptedPolicy(lambda c: "<answer>right</answer>"), SAMPLING, max_turns=2)
    with pytest.raises(ValueError, match="token-level policy"):
        build_token_batch(text_eps, mode="concat", pad_token_id=0)
    eps = fl_rollout(encoder, mode="no_concat", seeds=(0,), max_turns=3)
    if len(eps[0].turns) > 1:
        with pytest.raises(ValueError, match="concat mode needs one sample per episode"):
            build_token_batch(eps, mode="concat", pad_token_id=0)
    with pytest.raises(TypeError, match="pad_token_id"):
        build_token_batch(eps, mode="no_concat")
    with pytest.raises(ValueError, match="mode must be one of"):
        build_token_batch(eps, mode="per_turn", pad_token_id=0)
    err = [Reply("", error="x")]
    bad = rollout([EnvSpec("line", {}, 0, factory=line_factory())], ScriptedPolicy(lambda c: err[0]), SAMPLING,
                  max_turns=1)
    with pytest.raises(ValueError, match="no trainable episodes: 1 with error"):
        build_token_batch(bad, mode="concat", pad_token_id=0)


def _image_batch(encoder):
    """Rows with 1..4 images (episodes of different lengths), some truncated."""
    specs = [EnvSpec("line", {}, s, factory=line_factory(length=n, with_image=True))
             for s, n in [(0, 3), (1, 2), (0, 9), (1, 1), (0, 2)]]
    policy = TokenScriptedPolicy(encoder, lambda conv: "<answer>right</answer>")
    eps = rollout(specs, policy, SAMPLING, max_turns=3)
    return eps, build_token_batch(eps, mode="concat", pad_token_id=encoder.pad_token_id)


def _row_pixels(ep):
    segs = [s for s in ep.samples[0].segments if s.n_images]
    if ep.truncated:
        segs.append(ep.final_segment)
    return torch.cat([s.pixel_values for s in segs]), torch.cat([s.image_grid_thw for s in segs])


def test_select_reslices_images_with_their_rows(encoder):
    eps, batch = _image_batch(encoder)
    assert sorted(set(batch.n_images.tolist())) == [1, 2, 3, 4]
    rows = [2, 0, 3]
    sub = batch.select(rows)
    assert sub.input_ids.shape[1] == int(batch.lengths[rows].max())
    assert sub.n_images.tolist() == [int(batch.n_images[r]) for r in rows]
    pix = torch.cat([_row_pixels(eps[r])[0] for r in rows])
    grid = torch.cat([_row_pixels(eps[r])[1] for r in rows])
    assert torch.equal(sub.pixel_values, pix) and torch.equal(sub.image_grid_thw, grid)
    for i, r in enumerate(rows):
        n = int(batch.lengths[r])
        assert torch.equal(sub.input_ids[i, :n], batch.input_ids[r, :n])
        assert torch.equal(sub.loss_mask[i], batch.loss_mask[r, :sub.input_ids.shape[1]])
        assert sub.state_keys[i] == batch.state_keys[r]
    with pytest.raises(IndexError):
        batch.select([5])


def test_micro_batches_respect_the_budget_and_keep_images_aligned(encoder):
    eps, batch = _image_batch(encoder)
    budget = int(batch.lengths.max()) * 2
    groups = micro_batch_rows(batch, budget)
    assert len(groups) >= 2
    assert sorted(r for g in groups for r in g) == list(range(batch.batch_size))
    lengths = batch.lengths.tolist()
    assert [r for g in groups for r in g] == sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for g in groups:
        mb = batch.select(g)
        assert mb.batch_size * mb.input_ids.shape[1] <= budget
        pads = (mb.input_ids == encoder.image_token_id).sum(1)
        per_image = mb.image_grid_thw.prod(-1) // 4
        counts = torch.split(per_image, mb.n_images.tolist())
        assert pads.tolist() == [int(c.sum()) for c in counts]
        assert torch.equal(mb.pixel_values, torch.cat([batch.select([r]).pixel_values for r in g]))
        assert mb.traj_ids.tolist() == [int(batch.traj_ids[r]) for r in g]
    # a row longer than the budget is alone, never split
    assert [len(g) for g in micro_batch_rows(batch, 1)] == [1] * batch.batch_size
    moved = batch.to("cpu")
    assert torch.equal(moved.input_ids, batch.input_ids) and moved.state_keys == batch.state_keys
