"""SFT: supervised fine-tuning on chat data with images; the warm start before RL.

Data format (JSONL, one chat per line; docs/training.md "SFT data")::

    {"messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "text with <image> placeholders"},
                  {"role": "assistant", "content": "<think>...</think><answer>...</answer>"}, ...],
     "images": ["relative/to/the/jsonl/file.png", ...],   # one per <image>, in order
     "meta": {...}}                                         # optional, ignored

The loop, top to bottom (one optimizer step per iteration)::

    chats  = read_chats(path) -> Conversation segments via the RL encoder  (once)
    for step in range(start, sft.steps):      # the update makes SFT step step + 1 (1..sft.steps)
        rows  = the next batch_size chats of a per-epoch permutation seeded by (run seed, epoch)
        loss  = token-mean of -log pi(token) over assistant tokens (loss mask; the <answer> part
                weighted by sft.answer_weight), accumulated over micro-batches of
                <= update.micro_batch_tokens
        clip gradients, AdamW step, lr schedule step, log sft/* at step + 1, checkpoint every K steps

Prompts are identical to RL's (docs/algorithms.md reference bug 9): a chat is turned into tokens by exactly the
code the rollout's HFPolicy uses (``vagent.rollout.encoding.encode_pending`` for system/user
messages, ``append_reply`` for the assistant reply, whose ids are the tokenizer's encoding of the
reply text and get loss mask 1; the template's end-of-turn ids after it get mask 0, as in RL
where generation stops at ``</answer>``). tests/recipes/test_sft.py checks token identity
against a rollout.

Departures: no packing of several chats into one row; assistant turns are all trained on
(earlier ones included), as multi-turn SFT usually does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from vagent.distributed import Padding, all_reduce_sum, barrier, rank_micro_batches, world
from vagent.envs.base import IMAGE_PLACEHOLDER
from vagent.jsonl import read_records
from vagent.models.processor import ChatEncoder
from vagent.recipes.batching import accumulation_weight
from vagent.runconfig import EnvEntry, RunConfig
from vagent.recipes.demos import DemoSettings, play_demo
from vagent.recipes.optim import autocast, clip_grads, derive_seed, make_optimizer, make_scheduler
from vagent.recipes.scoring import hidden_after_prefix, policy_forward, shared_prefix
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_export, shard_for_training
from vagent.rollout.batch import TokenBatch
from vagent.rollout.encoding import append_reply, encode_pending, flat_ids, flat_pixels
from vagent.rollout.policy import Conversation, Message
from vagent.runs import StepProgress, check_finite, load_checkpoint, save_checkpoint
from vagent.runs.errors import check_module_finite
from vagent.seeds import split_seeds


class DataError(ValueError):
    """A line of an SFT data file does not follow the documented format."""


@dataclass
class Chat:
    """One SFT sample: messages (system first) with their images, from ``source`` (file:line)."""

    messages: list[Message]
    source: str


def read_chats(path: str | Path, limit: int | None = None) -> list[Chat]:
    """Read and validate a JSONL chat file (see the module docstring); images are loaded as RGB."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"SFT data file {str(path)!r} does not exist. Make demonstrations with "
                        f"`vagent demos frozenlake --n 64 {path}` or point sft.data at a JSONL chat file.")
    chats: list[Chat] = []
    for rec, where in read_records(path, DataError):
        chats.append(chat_of_record(rec, where, path.parent))
        if limit is not None and len(chats) >= limit:
            break
    if not chats:
        raise DataError(f"{path}: no chats in the file.")
    return chats


def chat_of_record(rec: object, where: str, root: Path) -> Chat:
    """One line of a chat file, checked: known keys, the images (relative to ``root``) one per
    placeholder of the user messages, a system message first and an assistant message to learn from."""
    if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
        raise DataError(f'{where}: expected an object with "messages": [...] (and "images": [...]).')
    unknown = set(rec) - {"messages", "images", "meta"}
    if unknown:
        raise DataError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: messages, images, meta.")
    images = _load_images(rec.get("images", []), where, root)
    messages, k = [], 0
    for i, m in enumerate(rec["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
            raise DataError(f'{where}: messages[{i}] must be {{"role": system|user|assistant, "content": str}}, got {m!r:.80}.')
        n = m["content"].count(IMAGE_PLACEHOLDER)
        if n and m["role"] != "user":
            raise DataError(f"{where}: messages[{i}] ({m['role']}) has {IMAGE_PLACEHOLDER}; only user messages carry images.")
        messages.append(Message(m["role"], m["content"], tuple(images[k:k + n])))
        k += n
    if k != len(images):
        raise DataError(f"{where}: {k} {IMAGE_PLACEHOLDER} placeholder(s) but {len(images)} image(s).")
    if not messages or messages[0].role != "system":
        raise DataError(f"{where}: the first message must be the system prompt (RL prompts start with it).")
    if not any(m.role == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message to learn from.")
    return Chat(messages, where)


def _load_images(image_paths: object, where: str, root: Path) -> list[Image.Image]:
    """The images of a chat record (paths relative to the chat file's folder ``root``), as RGB."""
    if not isinstance(image_paths, list):
        raise DataError(f'{where}: "images" must be a list of paths relative to the file.')
    images = []
    for rel in image_paths:
        full = root / rel
        if not full.is_file():
            raise DataError(f"{where}: image {rel!r} not found (looked at {full}); paths are relative to the JSONL file.")
        with Image.open(full) as im:
            images.append(im.convert("RGB"))
    return images


def encode_chat(chat: Chat, encoder: ChatEncoder) -> Conversation:
    """A :class:`Conversation` whose segments are exactly what the RL policy would have built if it
    had sampled the assistant texts' token ids (mask 1 on them, 0 on everything else)."""
    conv = Conversation(messages=[])
    for m in chat.messages:
        if m.role == "assistant":
            if not conv.messages or conv.messages[-1].role != "user":
                raise DataError(f"{chat.source}: an assistant message must follow a user message.")
            pending = encode_pending(conv, encoder)
            ids = reply_token_ids(encoder, m.text)
            append_reply(conv, pending, ids, [0.0] * len(ids), encoder)
        conv.messages.append(m)
    return conv


def reply_token_ids(encoder: ChatEncoder, text: str) -> list[int]:
    """The ids of an assistant reply text (no special tokens added)."""
    ids = list(encoder.tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise DataError("an assistant message is empty")
    return ids


def sft_batch(convs: Sequence[Conversation], pad_token_id: int) -> TokenBatch:
    """A :class:`TokenBatch` of conversations (RL-only fields zero): rows right-padded."""
    B = len(convs)
    L = max(len(flat_ids(c.segments)) for c in convs)
    ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    loss = torch.zeros((B, L), dtype=torch.bool)
    pixels, grids, n_images = [], [], []
    for b, c in enumerate(convs):
        pos = 0
        for s in c.segments:
            n = len(s.input_ids)
            ids[b, pos:pos + n] = torch.tensor(s.input_ids, dtype=torch.long)
            attn[b, pos:pos + n] = 1
            loss[b, pos:pos + n] = bool(s.sampled)
            pos += n
        pv, grid = flat_pixels(c.segments)
        if pv is not None and grid is not None:  # both or neither
            pixels.append(pv)
            grids.append(grid)
        n_images.append(sum(s.n_images for s in c.segments))
    zeros_f = torch.zeros((B, L), dtype=torch.float32)
    return TokenBatch(
        input_ids=ids, attention_mask=attn, loss_mask=loss, old_logprobs=zeros_f,
        turn_end_mask=torch.zeros((B, L), dtype=torch.bool), token_rewards=zeros_f.clone(),
        turn_index=torch.full((B, L), -1, dtype=torch.long), bootstrap_index=torch.full((B,), -1),
        truncated=torch.zeros(B, dtype=torch.bool), episode_returns=torch.zeros(B), group_ids=torch.arange(B),
        traj_ids=torch.arange(B), row_turn=torch.full((B,), -1), pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids).long() if grids else None, state_keys=[[] for _ in range(B)],
        n_images=torch.tensor(n_images, dtype=torch.long), episode_index=torch.arange(B),
    )


def batch_rows(n_chats: int, batch_size: int, step: int, seed: int) -> tuple[list[int], int]:
    """Chat indices of SFT step ``step`` and its epoch: the stream is the concatenation of per-epoch
    permutations seeded by (seed, epoch), so the data position is just the step number."""
    rows, epoch = [], 0
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(k, n_chats)
        perm = np.random.default_rng(derive_seed(seed, "sft-epoch", epoch)).permutation(n_chats)
        rows.append(int(perm[i]))
    return rows, epoch


def answer_weights(batch: TokenBatch, answer_token_id: int, weight: float) -> torch.Tensor:
    """Per-token loss weights [B, L]: 1 on loss tokens, ``weight`` on a reply's ``<answer>`` tag
    and every loss token after it in that reply (the actions and ``</answer>``); 0 elsewhere."""
    rows = []
    for ids, mask in zip(batch.input_ids.tolist(), batch.loss_mask.tolist()):
        row, in_answer = [], False
        for token, loss in zip(ids, mask):
            in_answer = bool(loss) and (in_answer or token == answer_token_id)
            row.append(weight if in_answer else float(loss))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32, device=batch.loss_mask.device)


@dataclass(frozen=True)
class SFTForward:
    """How :func:`sft_loss` runs its forward passes: micro-batches, chunks, precision, device."""

    #: the most tokens of one micro-batch (``update.micro_batch_tokens``)
    micro_tokens: int
    #: positions per log-prob chunk (``update.logprob_chunk``)
    chunk: int = 1024
    #: autocast to bfloat16 (``Session.bf16``)
    bf16: bool = False
    #: the device of the model and the batch
    device: torch.device = torch.device("cpu")
    #: the tokens every row starts with (the system prompt) run once, without a graph
    #: (``sft.shared_prefix``; :func:`vagent.recipes.scoring.shared_prefix`)
    shared: bool = False


def sft_loss(model: torch.nn.Module, batch: TokenBatch, forward: SFTForward, *, weights: torch.Tensor | None = None,
             backward: bool = True) -> dict[str, float]:
    """Token-mean NLL over the loss mask (weighted by ``weights`` [B, L] when given: sum(w * nll) /
    sum(w)), accumulated over micro-batches (``forward``: how the passes run); returns the loss and
    the (unweighted) accuracy. ``backward``: accumulate the gradients of the loss."""
    device, bf16 = forward.device, forward.bf16
    total_mask = batch.loss_mask
    weights = total_mask.float() if weights is None else weights
    total_loss = 0.0
    correct = 0.0
    with autocast(device, bf16):
        prefix = shared_prefix(model, batch) if forward.shared else None
    for rows in rank_micro_batches(batch, forward.micro_tokens):  # several processes: this rank's share
        mb = batch.select(rows)
        with autocast(device, bf16):
            hidden = hidden_after_prefix(model, mb, prefix) if prefix is not None else None
            logprobs, _ = policy_forward(model, mb, forward.chunk, hidden=hidden)
        mb_weights = weights[list(rows)][:, :mb.loss_mask.shape[1]]  # select() trims the rows to their longest
        nll = -(logprobs * mb_weights).sum() / mb_weights.sum().clamp(min=1e-8)
        share = accumulation_weight(mb_weights, weights, "token-mean")  # this micro-batch's share of the weight
        if isinstance(rows, Padding):  # a rank without rows left joins the collectives with weight 0
            share = 0.0
        if backward:
            (nll * share).backward()
        total_loss += float(nll.detach()) * share
        if not isinstance(rows, Padding):
            correct += float(((logprobs.detach() > np.log(0.5)) & mb.loss_mask).sum())  # the target had p > 0.5
    total_loss, correct = all_reduce_sum([total_loss, correct], "sft loss")  # one process: unchanged
    return {"loss": total_loss, "token_accuracy": correct / max(1.0, float(total_mask.sum()))}


def demo_settings(cfg: RunConfig, entry: EnvEntry, n: int | None = None) -> DemoSettings:
    """The :class:`~vagent.recipes.demos.DemoSettings` of a run's env entry: its env and config,
    the run's ``sft.*`` demonstration fields, ``n`` episodes (default ``sft.demos_per_env``)."""
    sft_cfg = cfg.sft
    return DemoSettings(env=entry.name, env_config=dict(entry.config), n=sft_cfg.demos_per_env if n is None else n,
                        random_action_frac=sft_cfg.random_action_frac, max_turns=sft_cfg.max_turns,
                        actions_per_turn=sft_cfg.actions_per_turn or None, objects=tuple(sft_cfg.describe_objects),
                        reasoning_objects=tuple(sft_cfg.reasoning_objects), reasoning_plan=sft_cfg.reasoning_plan)


def demo_chats_path(session: Session) -> Path:
    """Write solver demonstrations for every env entry into the run dir (once) and return the file
    (several processes: rank 0 writes them, the others wait and read the same file)."""
    cfg = session.cfg
    out = session.run.root / "demos.jsonl"
    if not world().is_main:
        barrier("demonstrations written")
        return out
    if out.is_file():
        barrier("demonstrations written")
        return out
    image_dir = session.run.root / "demos_images"
    image_dir.mkdir(exist_ok=True)
    lines = []
    bar = StepProgress(sum(demo_settings(cfg, e).n for e in cfg.envs), "demos", session.console, cfg.log.progress)
    try:
        for i, e in enumerate(cfg.envs):
            settings = demo_settings(cfg, e)
            for seed in split_seeds("train", settings.n, offset=900_000 + i * 10_000):
                rec = play_demo(settings, seed, image_dir, f"{image_dir.name}/")
                lines.append(json.dumps(rec))
                bar.update(len(lines))
    finally:
        bar.close()
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    barrier("demonstrations written")
    return out


def train_sft(session: Session, start_step: int = 0, resume_from: str | None = None) -> str | None:
    """Run SFT steps ``start_step + 1 .. sft.steps`` on the session's policy (``start_step`` updates
    were done before: a resume from checkpoint ``resume_from``; see the module docstring). Returns
    the newest checkpoint (the last one SFT wrote, else ``resume_from``), which errors name as the
    last good one until RL writes its own."""
    cfg, sft_cfg = session.cfg, session.cfg.sft
    model = session.loaded.model
    # 1. data: the JSONL file, or solver demonstrations written into the run dir
    convs, answer_id = sft_data(session)
    # 2. sharding (several processes), optimizer and schedule (resumed from an SFT checkpoint if any)
    shard_for_training(session)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, sft_cfg.lr, cfg.update.weight_decay)
    sched = make_scheduler(opt, cfg.update.warmup_steps, sft_cfg.steps, cfg.update.lr_schedule)
    if resume_from is not None:
        load_checkpoint(resume_from, {"policy": model}, {"sft": opt}, {"sft": sched})
    model.train()
    forward = SFTForward(micro_tokens=cfg.update.micro_batch_tokens, chunk=cfg.update.logprob_chunk, bf16=session.bf16,
                         device=session.device, shared=sft_cfg.shared_prefix)
    bar = StepProgress(sft_cfg.steps, "SFT", session.console, cfg.log.progress, start=start_step)
    last = resume_from  # the newest checkpoint: named by an error as the last good one
    try:
        for step in range(start_step, sft_cfg.steps):
            # 3. one update: batch -> loss, gradients -> clip -> AdamW and lr steps -> log -> checkpoint
            t0 = time.perf_counter()
            rows, epoch = batch_rows(len(convs), sft_cfg.batch_size, step, cfg.seed)
            batch = sft_batch([convs[r] for r in rows], session.loaded.encoder.pad_token_id).to(session.device)
            weights = (None if sft_cfg.answer_weight == 1.0 or answer_id is None  # sft_data: not None when weighted
                       else answer_weights(batch, answer_id, sft_cfg.answer_weight))
            opt.zero_grad(set_to_none=True)
            stats = sft_loss(model, batch, forward, weights=weights)
            grad_norm = clip_grads(params, cfg.update.grad_clip)
            completed = step + 1  # SFT step `completed`: after that many updates
            check_finite({"sft/loss": stats["loss"], "sft/grad_norm": grad_norm}, "sft", completed,
                         last)
            lr = opt.param_groups[0]["lr"]
            opt.step()
            check_module_finite(model, "policy weights after the update", "sft", completed, last)
            sched.step()
            dt = time.perf_counter() - t0
            session.logger.log(completed, {
                "sft/loss": stats["loss"], "sft/token_accuracy": stats["token_accuracy"], "sft/grad_norm": grad_norm,
                "sft/lr": lr, "sft/epoch": float(epoch), "perf/sft_step_time_s": dt,
                "perf/sft_tokens_per_s": batch.num_tokens / dt}, phase="sft")
            bar.update(completed, {"loss": stats["loss"], "acc": stats["token_accuracy"]})
            if completed == sft_cfg.steps or (cfg.log.checkpoint_every and completed % cfg.log.checkpoint_every == 0):
                last = save_sft_checkpoint(session, model, opt, sched, completed)
    finally:
        bar.close()
    return last


def sft_data(session: Session) -> tuple[list[Conversation], int | None]:
    """The encoded chats of ``sft.data`` (or of the run's solver demonstrations) and the id of
    ``<answer>`` (checked to be one token when ``sft.answer_weight`` needs it)."""
    sft_cfg, encoder = session.cfg.sft, session.loaded.encoder
    path = Path(sft_cfg.data).expanduser() if sft_cfg.data else demo_chats_path(session)
    chats = read_chats(path)
    convs = [encode_chat(c, encoder) for c in chats]
    n_tokens = sum(sum(len(x.input_ids) for x in c.segments) for c in convs)
    session.console.print(f"SFT data: {len(convs)} chats, {n_tokens} tokens from {path}")
    answer_id = encoder.tokenizer.convert_tokens_to_ids("<answer>")
    if sft_cfg.answer_weight != 1.0 and (answer_id is None or answer_id == encoder.tokenizer.unk_token_id):
        raise ValueError(f"sft.answer_weight={sft_cfg.answer_weight} needs '<answer>' to be one token of the "
                         "model's tokenizer; it is not: set sft.answer_weight: 1.0")
    return convs, answer_id


def save_sft_checkpoint(session: Session, model: torch.nn.Module, opt: torch.optim.Optimizer,
                        sched: torch.optim.lr_scheduler.LRScheduler, completed: int) -> str:
    """The checkpoint after SFT step ``completed`` (policy, optimizer, schedule, the data position,
    the policy exported as a model directory); returns its path."""
    log = session.cfg.log
    ck = save_checkpoint(session.run.checkpoints, "sft", completed, {"policy": model}, {"sft": opt},
                         {"sft": sched}, data_position={"sft_step": completed}, keep_last=log.keep_last,
                         export=policy_export(session, model))
    return str(ck)
