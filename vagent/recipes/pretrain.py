"""Caption pretraining of a tiny random-weight VLM, so that it can see before SFT and RL.

Why: VAGEN starts from a pretrained VLM (Qwen2.5-VL-3B) that already reads images. A random-weight
tiny VLM does not, and on 2 CPU cores it does not learn to in an SFT/RL budget of minutes: in our
probes (docs/training.md, "Why the tiny model is caption-pretrained") neither SFT on full
demonstration prompts (200 steps x 16 chats) nor short image -> relation captions (600 steps)
left the chance plateau, while short image -> grid captions did after ~400-500 steps. So
``model.tiny_pretrain_steps > 0`` teaches the tiny model one generic visual skill, reading the
board, before the run, and caches the result with the model (it is part of building it).

The captions: for states of the run's env kinds, rendered with the model's own pretraining settings
(``model.tiny_pretrain_env_config``, :func:`vagent.runconfig.pretrain_env_entries`; for the
default run they equal the rollout's), reset with seeds of the ``train`` split, then a few random
moves, the user message is the env's observation (the same text and image the RL rollout shows, without the system prompt, which is the costly part of every prompt) and the
target is the reply prefix ``<think><observation>{describe_state(state, "symbolic")}</observation>``
(the grid, one row per line), optionally followed by ``<reasoning>`` and the natural-language
relation of some object types to the agent ("The goal is below and to the right of you."). Only
that perception skill is taught: no actions, no rewards, no solver.

Several processes (torchrun): the ranks share one model folder (Hugging Face's ``save_pretrained``
writes from rank 0 only), every rank renders the same captions, the model is sharded (FSDP2) and
each step's chats are split over the ranks like any SFT step (``sft_loss``); the full weights are
gathered and rank 0 saves them.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
from PIL import Image

from vagent.distributed import barrier, full_state_dict, root_of, shard_model, world
from vagent.envs import make
from vagent.envs.base import Env, Observation
from vagent.envs.formats import render_response
from vagent.models.loading import load_policy
from vagent.models.processor import ChatEncoder
from vagent.recipes.common import save_pretrained
from vagent.runconfig import EnvEntry
from vagent.recipes.optim import derive_seed, make_optimizer, make_scheduler
from vagent.recipes.sft import SFTForward, reply_token_ids, sft_batch, sft_loss
from vagent.rollout.encoding import append_reply, encode_pending
from vagent.rollout.policy import Conversation, Message
from vagent.runs.progress import StepProgress
from vagent.seeds import split_seeds


def caption_records(env_entries: Sequence[EnvEntry], n_per_env: int, seed: int, image_dir: Path,
                    relations: Sequence[str] = (), first_board: int = 0) -> list[dict]:
    """SFT chat records (no system message) pairing an observation with its symbolic description
    (and, with ``relations``, the natural-language relation of those object types to the agent).
    Boards are train-split seeds ``first_board ..`` of a range reserved for captions."""
    records = []
    for i, e in enumerate(env_entries):
        env = make(e.name, **e.config)
        describe = getattr(importlib.import_module(type(env).__module__), "describe_state", None)
        names = list(getattr(env, "action_names", ()))
        if describe is None or not names:
            raise TypeError(f"env {e.name!r}: caption pretraining needs a module-level describe_state(state, "
                            "style) and action_names")
        rng = np.random.default_rng(derive_seed(seed, "captions", i))
        if first_board + n_per_env > 50_000:
            raise ValueError(f"caption boards {first_board}..{first_board + n_per_env} exceed the 50000 reserved per env")
        for board in split_seeds("train", n_per_env, offset=500_000 + 50_000 * i + first_board):
            obs = _after_random_moves(env, board, rng, names, env.config.format)
            paths = []
            for j, im in enumerate(obs.images):
                name = f"{e.name}_{board}_{j}.png"
                im.save(image_dir / name)
                paths.append(f"{image_dir.name}/{name}")
            state = env.state()
            target = f"<think><observation>{describe(state, 'symbolic')}</observation>"
            if relations:
                rel = dict(state, relations=[r for r in state.get("relations", []) if r.get("object") in relations])
                target += f"<reasoning>{describe(rel, 'natural')}"
            records.append({"messages": [{"role": "user", "content": obs.text},
                                         {"role": "assistant", "content": target}], "images": paths})
        env.close()
    return records


def _after_random_moves(env: Env, board: int, rng: np.random.Generator, names: Sequence[str],
                        fmt: str) -> Observation:
    """The observation of board ``board`` after 0-2 random moves (more player positions), the moves
    written in the env's reply format ``fmt``; the board as reset when a move ends the episode."""
    obs, _ = env.reset(board)
    for _ in range(int(rng.integers(0, 3))):
        move = render_response(fmt, {"think": "x", "observation": "x", "reasoning": "x",
                                                   "prediction": "x", "answer": names[int(rng.integers(len(names)))]})
        result = env.step(move)
        if result.terminated or result.truncated:
            obs, _ = env.reset(board)
            break
        obs = result.obs
    return obs


def encode_caption(record: dict, root: Path, encoder: ChatEncoder) -> Conversation:
    """A Conversation for a caption record: user turn (mask 0) then the target ids (mask 1)."""
    images = []
    for p in record["images"]:
        with Image.open(root / p) as im:
            images.append(im.convert("RGB"))
    user, assistant = record["messages"]
    conv = Conversation(messages=[Message("user", user["content"], tuple(images))])
    ids = reply_token_ids(encoder, assistant["content"])
    append_reply(conv, encode_pending(conv, encoder), ids, [0.0] * len(ids), encoder)
    return conv


class Pace(NamedTuple):
    """How fast a caption-pretraining stage runs, measured over its first steps (for an estimate of
    the whole build: ``vagent.recipes.tiny_cache.build_tiny``)."""

    #: seconds per step, the mean over steps 2..steps_done (the first step carries one-time warm-up;
    #: a stage of one step: that step)
    step_s: float
    #: steps of this stage done when it was measured
    steps_done: int
    #: seconds the stage took before its first step (captions rendered, model loaded)
    setup_s: float


#: steps after the first that a stage's :class:`Pace` is measured over
PACE_STEPS = 5


@dataclass(frozen=True)
class CaptionStage:
    """One caption-pretraining pass (:func:`pretrain_captions`): its captions and its optimization."""

    #: optimizer steps of the pass
    steps: int
    #: the pass's name: its captions go to ``pretrain/<stage>/``, its summary under that key in
    #: ``vagent_pretrain.json``; ``"grid"`` keeps the seeds of the one-stage build
    stage: str = "grid"
    #: object types whose relation to the agent the captions add (empty: the grid only)
    relations: tuple[str, ...] = ()
    #: caption boards rendered per env kind
    n_per_env: int = 2048
    #: the first caption board used (see :func:`caption_records`): a later stage starts after an
    #: earlier one's boards
    first_board: int = 0
    #: chats per step
    batch_size: int = 16
    #: learning rate (constant after 10 warm-up steps)
    lr: float = 1e-3
    #: the most tokens of one micro-batch
    micro_batch_tokens: int = 4096
    #: seed of the captions, of the pass's torch RNG and of the order the chats are drawn in
    seed: int = 0


def pretrain_captions(model_dir: Path, env_entries: Sequence[EnvEntry], plan: CaptionStage, *,
                      say: Callable[[str], None] = print, on_pace: Callable[[Pace], None] | None = None) -> dict:
    """Train the model in ``model_dir`` on captions for ``plan.steps`` steps and save it back in place.

    ``plan`` (:class:`CaptionStage`) names the pass, its captions and its optimization. ``say``
    gets the progress lines (with ETA); a :class:`vagent.runs.Console` shows a bar on a terminal.
    ``on_pace`` is called once, after step ``1 + PACE_STEPS`` (or the last), with the stage's :class:`Pace`."""
    t_stage = time.perf_counter()
    steps, stage, seed, batch_size = plan.steps, plan.stage, plan.seed, plan.batch_size
    work = Path(model_dir) / "pretrain" / stage
    (work / "images").mkdir(parents=True, exist_ok=True)
    records = caption_records(env_entries, plan.n_per_env, seed, work / "images", plan.relations, plan.first_board)
    (work / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    barrier("model and captions written")  # several processes: nobody reads a file another still writes
    tag = () if stage == "grid" else (stage,)  # the grid stage keeps the one-stage seeds
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "pretrain", *tag))
        loaded = load_policy(model_dir)
        convs: dict[int, Conversation] = {}  # encoded when first drawn: a stage draws ~63% of its boards
        model = shard_model(loaded.model)  # several processes: FSDP2; one: the model itself
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(params, plan.lr, 0.0)
        sched = make_scheduler(opt, 10, steps, "constant")
        rng = np.random.default_rng(derive_seed(seed, "pretrain-order", *tag))
        forward = SFTForward(micro_tokens=plan.micro_batch_tokens, chunk=1024, bf16=False, device=torch.device("cpu"))
        t0, stats = time.perf_counter(), {}
        ended: list[float] = []  # the end time of each step, up to the pace's measurement
        bar = StepProgress(steps, f"caption pretraining ({stage})", say)
        try:
            for step in range(steps):
                rows = rng.choice(len(records), size=min(batch_size, len(records)), replace=False)
                batch = sft_batch(_encoded(rows, records, convs, work, loaded.encoder), loaded.encoder.pad_token_id)
                opt.zero_grad(set_to_none=True)
                stats = sft_loss(model, batch, forward)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                bar.update(step + 1, {"loss": stats["loss"], "token_accuracy": stats["token_accuracy"]})
                if on_pace is not None and len(ended) <= PACE_STEPS:
                    ended.append(time.perf_counter())
                    if len(ended) == min(PACE_STEPS + 1, steps):
                        on_pace(_pace(t_stage, t0, ended))
        finally:
            bar.close()
        save_in_place(model, model_dir)
    summary = {"steps": steps, "final_loss": stats.get("loss"), "final_token_accuracy": stats.get("token_accuracy"),
               "captions": len(records), "seconds": round(time.perf_counter() - t0, 1)}
    if world().is_main:
        record_stage(Path(model_dir) / "vagent_pretrain.json", stage, summary)
    return summary


def _pace(t_stage: float, t_first: float, ended: Sequence[float]) -> Pace:
    """The :class:`Pace` of a stage that started at ``t_stage``, began its first step at ``t_first``
    and ended its steps at ``ended``."""
    step_s = (ended[-1] - ended[0]) / (len(ended) - 1) if len(ended) > 1 else ended[0] - t_first
    return Pace(step_s=step_s, steps_done=len(ended), setup_s=t_first - t_stage)


def _encoded(rows: Sequence[int], records: list[dict], convs: dict[int, Conversation], root: Path,
             encoder: ChatEncoder) -> list[Conversation]:
    """The Conversations of caption ``rows``, each encoded the first time it is drawn (kept in ``convs``)."""
    for r in rows:
        if r not in convs:
            convs[r] = encode_caption(records[r], root, encoder)
    return [convs[r] for r in rows]


def record_stage(path: Path, stage: str, summary: dict) -> None:
    """Add (or replace) ``stage``'s summary in the JSON file ``path`` (``vagent_pretrain.json``)."""
    stages = json.loads(path.read_text()) if path.is_file() else {}
    stages[stage] = summary
    path.write_text(json.dumps(stages, indent=2) + "\n")


def save_in_place(model: torch.nn.Module, model_dir: Path) -> None:
    """``save_pretrained`` into ``model_dir``; a sharded model's full weights are gathered on rank
    0, which loads them into a fresh copy and saves that."""
    if root_of(model) is None:
        save_pretrained(model, model_dir)
        return
    full = full_state_dict(model, to_all_ranks=False)
    if world().is_main:
        copy = load_policy(model_dir).model
        copy.load_state_dict(full)
        save_pretrained(copy, model_dir)
    barrier("pretrained model saved")
