"""The weight-push canary: after every push of the trainer's weights to a generator apart from it
(engine replicas, vLLM in process or as replicas), a fixed probe is scored by the engine and by the
trainer, and a gap over the tolerance stops the run before the next rollout.

A push can go wrong without an error: a key renamed after a LoRA merge, a tied head, an engine
left on stale weights, vLLM's sleep mode waking on garbage. The driver's version stamps prove
that the push *call* reached the engine; the canary proves the engine computes what the trainer
computes. The probe (:func:`build_probe`): the first observation of the first ``PROBE_PROMPTS``
training envs of step 0, encoded as the rollout encodes a turn-0 prompt (images included), saved
in the run directory (``canary_probe.pt``) so a resumed run probes with the same prompts. The
check (:class:`WeightCanary`): each engine (each live replica) decodes ``PROBE_TOKENS`` greedy
tokens per prompt with their log-probs; the trainer scores the same tokens with one forward;
``sync/canary_max_abs_diff`` is the largest ``|log pi_engine - log pi_trainer|`` over the tokens and
targets, ``sync/canary_s`` the seconds the check took.

Tolerance (``rollout.canary_tolerance``; null = by dtype, :func:`default_tolerance`): 0.01 when
engine and trainer both compute in float32 (HF replicas and vLLM's CPU build stay below 1e-4
in the tests), 1.0 when either is bfloat16 / float16 (greedy tokens are the confident ones, where bf16
rounding moves log-probs least: 2e-5 to 1e-4 on the default run, while its sampled tokens move by
up to 2 nats; docs/results.md "Engine/trainer mismatch"). A wrong push moves log-probs by whole
nats; a push skipped once at a small learning rate may stay inside the tolerance (the version
stamps and ``mismatch/*`` see that).

In a job of several ranks every rank takes part: rank 0 asks the engines (the replicas are
shared), the replies are broadcast, and every rank runs the trainer's (sharded) forward.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from vagent.runs.errors import TrainingError

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from vagent.models.engine import GenerationOutput, GenerationRequest
    from vagent.models.processor import ChatEncoder
    from vagent.rollout.trajectory import EnvSpec

logger = logging.getLogger(__name__)

PROBE_FILE = "canary_probe.pt"
PROBE_PROMPTS = 2  # prompts in the probe
PROBE_TOKENS = 8  # greedy tokens the engine decodes per prompt


class WeightSyncError(TrainingError):
    """A generator's weights do not compute what the trainer's do after a push."""


@dataclass
class ProbePrompt:
    """One probe prompt: its ids and pixels as the policy's encoder builds a turn-0 prompt, and the
    raw images (for engines that preprocess images themselves, vLLM)."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    images: tuple[Image.Image, ...]


def default_tolerance(engine_dtype: str, trainer_dtype: str) -> float:
    """The canary's tolerance for an engine and a trainer computing in these dtypes (module docstring)."""
    return 0.01 if engine_dtype == trainer_dtype == "float32" else 1.0


def build_probe(specs: Sequence[EnvSpec], encoder: ChatEncoder, n: int = PROBE_PROMPTS) -> tuple[list[ProbePrompt], str]:
    """(the probe prompts, a note for the console): the first observation of the first ``n`` env
    specs with a system prompt, encoded as a turn-0 prompt. Envs whose observations hold no image
    give text-only prompts, and the note says so."""
    from vagent.envs import make
    from vagent.rollout.encoding import encode_pending, flat_ids, flat_pixels
    from vagent.rollout.policy import Conversation, Message

    prompts = []
    for spec in list(specs)[:n]:
        env = spec.factory() if spec.factory is not None else make(spec.name, **dict(spec.config))
        try:
            obs, _ = env.reset(spec.seed)
            conv = Conversation([Message("system", env.system_prompt()), Message("user", obs.text, obs.images)])
        finally:
            env.close()
        segments = encode_pending(conv, encoder)
        pixel_values, grid = flat_pixels(segments)
        prompts.append(ProbePrompt(flat_ids(segments), pixel_values, grid, tuple(obs.images)))
    if not prompts:
        raise ValueError("the weight canary needs at least one training env to draw its probe from")
    images = sum(len(p.images) for p in prompts)
    note = (f"{len(prompts)} prompt(s) with {images} image(s)" if images else
            f"{len(prompts)} text-only prompt(s) (the training envs' first observations hold no image, so the "
            "probe checks the language weights only)")
    return prompts, note


def save_probe(path: str | Path, prompts: Sequence[ProbePrompt]) -> None:
    """Write the probe (ids, pixels, images as uint8 arrays) to ``path``, atomically."""
    import numpy as np
    import torch

    rows = [{"input_ids": p.input_ids, "pixel_values": p.pixel_values, "image_grid_thw": p.image_grid_thw,
             "images": [torch.from_numpy(np.asarray(im.convert("RGB")).copy()) for im in p.images]} for p in prompts]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(rows, tmp)
    tmp.replace(path)


def load_probe(path: str | Path) -> list[ProbePrompt]:
    """The probe :func:`save_probe` wrote, read as data (tensors and lists only:
    ``vagent.runs.safe_load``). ValueError naming the file: damaged, needing code to load, not a
    list of prompts, or a list of none (a probe of no prompt would switch the canary off)."""
    import torch
    from PIL import Image

    from vagent.runs.safe_load import load_data

    try:
        rows = load_data(path)
        prompts = [ProbePrompt([int(i) for i in r["input_ids"]], r["pixel_values"], r["image_grid_thw"],
                               tuple(Image.fromarray(a.numpy()) for a in r["images"])) for r in rows]
        if any(not p.input_ids or not all(isinstance(t, torch.Tensor) or t is None
                                          for t in (p.pixel_values, p.image_grid_thw)) for p in prompts):
            raise ValueError("a prompt without token ids, or with pixels that are not tensors")
    except Exception as exc:  # noqa: BLE001 -- any damage: say which file
        raise ValueError(f"{path}: not a readable weight-canary probe ({type(exc).__name__}: {exc}); delete it "
                         "and the run draws the probe again from its training envs") from exc
    if not prompts:
        raise ValueError(f"{path} holds no prompt, so the weight canary would check nothing: it was emptied after the "
                         "run drew it; restore it from a copy of the run directory, or delete it and the run draws "
                         "the probe again from its training envs")
    return prompts


def probe_for_run(run_dir: str | Path, specs: Sequence[EnvSpec], encoder: ChatEncoder) -> tuple[list[ProbePrompt], str]:
    """The run's probe: ``<run_dir>/canary_probe.pt`` when it exists (a resume), else drawn from
    ``specs`` and saved there (rank 0 of a job writes it). When a checkpoint of the run recorded
    the probe's SHA-256 (its identity's ``run_files``), the file must be there with that hash:
    a changed or removed probe is a one-line CheckpointError naming the file and the fix."""
    from vagent.distributed import world
    from vagent.runs.checkpoint import CheckpointError, recorded_run_file, run_file_problem

    path = Path(run_dir) / PROBE_FILE
    recorded = recorded_run_file(Path(run_dir) / "checkpoints", PROBE_FILE)
    problem = run_file_problem(path, recorded[1], recorded[0]) if recorded is not None else None
    if problem is not None:
        raise CheckpointError(problem)
    if path.is_file():
        prompts = load_probe(path)
        return prompts, f"{len(prompts)} prompt(s) from {path}"
    prompts, note = build_probe(specs, encoder)
    if world().is_main:
        save_probe(path, prompts)
    return prompts, note


def engine_targets(engine: Any) -> list[tuple[str, Callable[..., list[GenerationOutput]]]]:
    """(name, generate) of each generator a push reached: every live replica of a ``RemoteEngine``,
    else the engine itself."""
    if hasattr(engine, "generate_on") and hasattr(engine, "alive"):
        return [(f"engine replica {i} (pid {engine.pids[i]})", (lambda reqs, params, i=i: engine.generate_on(i, reqs, params)))
                for i, ok in enumerate(engine.alive) if ok]
    return [(type(engine).__name__, engine.generate)]


def _lost_while_others_live(engine: Any, alive_before: int) -> bool:
    """Whether a replica of ``engine`` was marked dead during a canary call (stuck past
    ``rollout.generate_timeout_s`` and killed, or died) while another replica still lives: the
    rollout routes around it as around any dead replica, so the check goes on without it."""
    alive = list(getattr(engine, "alive", []))
    return 0 < sum(alive) < alive_before


def trainer_logprobs(model: torch.nn.Module, prompt: ProbePrompt, reply: Sequence[int]) -> list[float]:
    """log pi_trainer (temperature 1) of ``reply`` after ``prompt``: one forward without grad, in
    eval mode, through the model's FSDP2 root when sharded (every rank calls it)."""
    import torch

    from vagent.distributed import on_root
    from vagent.models.forward import forward_logits

    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt.input_ids) + list(reply)], device=device)
    pv = prompt.pixel_values.to(device) if prompt.pixel_values is not None else None
    grid = prompt.image_grid_thw.to(device) if prompt.image_grid_thw is not None else None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = on_root(model, forward_logits, model, ids, torch.ones_like(ids), pv, grid)
    finally:
        model.train(was_training)
    n = len(prompt.input_ids)
    lp = torch.log_softmax(logits[0, n - 1:-1].float(), -1)
    return lp.gather(-1, ids[0, n:, None])[:, 0].tolist()


class WeightCanary:
    """Checks a generator against the trainer after a push (the module docstring).

    Args:
        prompts: the probe.
        model: the trainer's policy (sharded or not).
        tolerance: the largest accepted ``|log pi_engine - log pi_trainer|`` on a probe token.
        last_checkpoint: the run's last checkpoint (named in the error), as a callable.
    """

    def __init__(self, prompts: Sequence[ProbePrompt], model: torch.nn.Module, tolerance: float,
                 last_checkpoint: Callable[[], str | None] = lambda: None):
        self.prompts, self.model, self.tolerance = list(prompts), model, float(tolerance)
        self.last_checkpoint = last_checkpoint

    def _requests(self) -> list[GenerationRequest]:
        from vagent.models.engine import GenerationRequest

        return [GenerationRequest(list(p.input_ids), p.pixel_values, p.image_grid_thw, images=p.images, key=("canary", i))
                for i, p in enumerate(self.prompts)]

    def _replies(self, engine: Any) -> dict[str, list[tuple[list[int], list[float]]]]:
        """Each target's greedy replies (ids, engine log-probs); in a job, rank 0's, on every rank."""
        from vagent.distributed import broadcast_object, world
        from vagent.models.engine import SamplingParams

        replies = None
        if world().is_main:
            params = SamplingParams(do_sample=False, max_new_tokens=PROBE_TOKENS)
            replies = {}
            for name, generate in engine_targets(engine):
                alive_before = sum(getattr(engine, "alive", []))
                try:
                    outs = generate(self._requests(), params)
                except (TimeoutError, RuntimeError) as exc:  # a replica lost mid-check: the others are checked
                    if not _lost_while_others_live(engine, alive_before):
                        raise
                    logger.warning("weight canary: %s was lost during the check (%s); checking the others", name,
                                   exc)
                    continue
                replies[name] = [(list(o.token_ids), list(o.logprobs)) for o in outs]
        return broadcast_object(replies, "weight canary replies")

    def check(self, engine: Any, version: int) -> dict[str, float]:
        """Score the probe on ``engine`` and the trainer; ``sync/canary_max_abs_diff`` and
        ``sync/canary_s``, or :class:`WeightSyncError` naming the target, the version and the gap."""
        start = time.perf_counter()
        worst, where = 0.0, ""
        for name, outs in self._replies(engine).items():
            for prompt, (ids, engine_lp) in zip(self.prompts, outs):
                if not ids:
                    continue
                trainer_lp = trainer_logprobs(self.model, prompt, ids)
                gap = max(abs(a - b) for a, b in zip(engine_lp, trainer_lp))
                if not gap <= worst:  # also catches nan
                    worst, where = gap, name
        seconds = time.perf_counter() - start
        if not worst <= self.tolerance:
            last = self.last_checkpoint()
            kept = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
            raise WeightSyncError(
                f"weight push check failed: after pushing weights version {version}, {where} gives the probe's "
                f"tokens log-probs up to {worst:.4g} away from the trainer's (tolerance {self.tolerance:g}, "
                f"rollout.canary_tolerance). The run stopped before sampling with these weights; {kept}. "
                "Likely causes: the push did not load every tensor (renamed or missing keys, a LoRA merge into "
                "the wrong names, a tied head), the engine woke from sleep mode with stale memory, or a dtype "
                "gap larger than the tolerance (rollout.engine_dtype; raise rollout.canary_tolerance only if "
                "mismatch/* stays small).")
        logger.info("weight canary: version %d, max |log-prob gap| %.3g, %.2fs", version, worst, seconds)
        return {"sync/canary_max_abs_diff": worst, "sync/canary_s": seconds}


__all__ = ["PROBE_FILE", "ProbePrompt", "WeightCanary", "WeightSyncError", "build_probe", "default_tolerance",
           "engine_targets", "load_probe", "probe_for_run", "save_probe", "trainer_logprobs"]
