"""Small functions the recipes share: seeds, devices, model set-up, optimizers.

Nothing here is a trainer: each function does one thing and the recipes (ppo.py, grpo.py,
sft.py) call them in the order the algorithm runs. The rest of what the recipes share lives by
its seam: :mod:`vagent.recipes.scoring` (forward passes and the scoring passes),
:mod:`vagent.recipes.batching` (mini-/micro-batches and accumulation weights),
:mod:`vagent.recipes.rollouts` (the training rollout, validation, their metrics) and
:mod:`vagent.recipes.session` (the run record); their names are re-exported at the end of this
module for older imports.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vagent.recipes.config import PRETRAIN_ENV_DEFAULTS, EnvEntry, ModelConfig, RunConfig, pretrain_env_entries  # noqa: F401
from vagent.recipes.optim import autocast, clip_grads, derive_seed, lr_factor, make_optimizer, make_scheduler  # noqa: F401 (re-exported)
from vagent.runs.errors import ModelError

# ----------------------------------------------------------------------------------------------
# seeds
# ----------------------------------------------------------------------------------------------


def train_env_specs(cfg: RunConfig, step: int) -> list:
    """The envs of RL step ``step``: for each entry, ``n_train`` consecutive seeds of the ``train``
    split at an offset derived from (run seed, entry index, step), so a resumed run replays the same
    envs and steps never share a seed by construction within 1e6 / n_train steps."""
    from vagent.rollout.driver import env_factory_for
    from vagent.rollout.loop import EnvSpec
    from vagent.seeds import SPLITS, split_seeds

    specs = []
    size = len(SPLITS["train"])
    for i, e in enumerate(cfg.envs):
        start = (derive_seed(cfg.seed, i) % size + step * e.n_train) % (size - e.n_train)
        factory = env_factory_for(e)  # None for in-process envs; RemoteEnv on e.urls otherwise
        specs += [EnvSpec(e.name, dict(e.config), s, factory) for s in split_seeds("train", e.n_train, start)]
    return specs


def val_env_specs(entry: EnvEntry) -> list:
    """The first ``n_val`` seeds of the ``val`` split (the same for every validation)."""
    from vagent.rollout.driver import env_factory_for
    from vagent.rollout.loop import EnvSpec
    from vagent.seeds import split_seeds

    return [EnvSpec(entry.name, dict(entry.config), s, env_factory_for(entry)) for s in split_seeds("val", entry.n_val)]


def stop_strings(cfg: RunConfig) -> tuple[str, ...]:
    """``rollout.stop`` plus the strings the run's envs declare as ending a reply
    (an env class's optional ``reply_stop``, e.g. vigorl_zoom's ``"</tool_call>"``), in order."""
    from vagent.envs.registry import env_class

    out = list(cfg.rollout.stop)
    for e in cfg.envs:
        out += [s for s in getattr(env_class(e.name), "reply_stop", ()) if s not in out]
    return tuple(out)


def sampling_for(cfg: RunConfig, step: int, greedy: bool = False):
    """The rollout's SamplingConfig at ``step`` (seed derived from the run seed and the step)."""
    from vagent.rollout.policy import SamplingConfig

    r = cfg.rollout
    return SamplingConfig(
        temperature=0.0 if greedy else r.temperature, top_p=r.top_p, top_k=r.top_k,
        max_new_tokens=r.max_new_tokens, stop=stop_strings(cfg), seed=derive_seed(cfg.seed, "sample", step),
    )


# ----------------------------------------------------------------------------------------------
# devices and precision
# ----------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto.")
    return dev


def use_bf16(setting: str, device: torch.device) -> bool:
    """bf16 autocast: ``auto`` turns it on for CUDA devices that support bf16 (off on CPU, where
    bf16 matmuls are usually slower than float32)."""
    if setting == "true":
        return True
    if setting == "false":
        return False
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


def tiny_model_dir(m: ModelConfig, envs: Sequence[EnvEntry] = ()) -> Path:
    """Where ``model.path: tiny`` lives: keyed by what changes the model: its sizes, the tokenizer
    corpus and (when caption pretrained) the pretraining settings and the envs whose boards it
    saw (:func:`pretrain_env_entries`: their names and the model's pretraining env settings, never
    the run's env config)."""
    from vagent.models.tiny import tokenizer_corpus

    corpus = hashlib.sha256("\n".join(tokenizer_corpus()).encode()).hexdigest()[:8]
    name = f"tiny-{m.tiny_family}-h{m.tiny_hidden}-l{m.tiny_layers}-i{m.tiny_image_size}-s{m.tiny_seed}-{corpus}"
    if m.tiny_rope_theta:
        name += f"-rope{m.tiny_rope_theta:g}"
    if m.tiny_pretrain_steps > 0:
        # the captions depend on what the envs show, not on how they reward (reward_* keys)
        key = (repr([(e.name, sorted((k, v) for k, v in e.config.items() if not k.startswith("reward")))
                     for e in pretrain_env_entries(m, envs)])
               + f"{m.tiny_pretrain_lr}/{m.tiny_pretrain_batch}/{sorted(m.tiny_pretrain_relations)}"
               + (f"/{m.tiny_pretrain_relation_steps}" if m.tiny_pretrain_relation_steps else ""))
        name += f"-cap{m.tiny_pretrain_steps}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return Path(m.cache_dir).expanduser() / name


# the relation stage's caption boards start here, after the grid stage's (2048 by default)
_RELATION_BOARDS_FROM = 10_000


def prepare_model(m: ModelConfig, envs: Sequence[EnvEntry] = (),
                  say: Callable[[str], None] = print) -> Path:
    """The model directory to load: ``path``, or the tiny model (built, and caption-pretrained when
    ``tiny_pretrain_steps > 0``, once; then reused from ``cache_dir``).

    Safe for runs sharing one cache: the build runs under an exclusive file lock
    (``<name>.lock`` beside the model) in a private temporary directory that is renamed into place
    when complete, so a model directory with ``config.json`` is always whole and never changes
    afterwards. A run that finds the lock taken waits for the other build and reuses it; a build
    that raises, or is interrupted by Ctrl-C or SIGTERM, removes its temporary directory; one
    killed with SIGKILL leaves it for the next builder (who holds the lock, so no one else is
    writing it) to delete."""
    if m.path != "tiny":  # a local directory, or a hub id's snapshot in the Hugging Face cache
        from vagent.models.loading import resolve_model_path

        return resolve_model_path(m.path)
    from filelock import FileLock, Timeout

    out = tiny_model_dir(m, envs)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(f"waiting for another process that is building {out.name} (lock {lock.lock_file}) ...")
        lock.acquire()
    try:
        if (out / "config.json").is_file():
            say(f"reusing {out.name}, built by another process")
            return out
        for stale in out.parent.glob(glob.escape(out.name) + ".tmp-*"):  # left by a killed build
            say(f"removing {stale.name}, left by an interrupted build")
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
        try:
            with _sigterm_interrupts():
                _build_tiny(m, envs, tmp, out.name, say)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    finally:
        lock.release()
    return out


@contextlib.contextmanager
def _sigterm_interrupts():
    """Within the block, SIGTERM (``kill``, ``timeout``, a scheduler) raises KeyboardInterrupt in
    the main thread like Ctrl-C does, so a build's ``finally`` removes its temporary folder;
    outside it, and in other threads, SIGTERM keeps its handler."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} while building the tiny model")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _build_tiny(m: ModelConfig, envs: Sequence[EnvEntry], tmp: Path, name: str,
                say: Callable[[str], None]) -> None:
    """Build the tiny model into ``tmp`` and caption-pretrain it (one or two stages)."""
    from vagent.models.tiny import build_tiny_vlm

    say(f"building tiny model {name} (first run only) ...")
    build_tiny_vlm(tmp, family=m.tiny_family, hidden=m.tiny_hidden, layers=m.tiny_layers,
                   image_size=m.tiny_image_size, seed=m.tiny_seed, rope_theta=m.tiny_rope_theta or None)
    if m.tiny_pretrain_steps > 0:
        from vagent.recipes.pretrain import pretrain_captions

        envs = pretrain_env_entries(m, envs)
        two_stage = m.tiny_pretrain_relation_steps > 0 and bool(m.tiny_pretrain_relations)
        say(f"caption-pretraining it for {m.tiny_pretrain_steps} steps (image -> board description) ...")
        pretrain_captions(tmp, envs, m.tiny_pretrain_steps, batch_size=m.tiny_pretrain_batch,
                          lr=m.tiny_pretrain_lr, seed=m.tiny_seed,
                          relations=() if two_stage else tuple(m.tiny_pretrain_relations), say=say)
        if two_stage:
            say(f"then {m.tiny_pretrain_relation_steps} steps on captions that add where the "
                f"{', '.join(m.tiny_pretrain_relations)} is (on fresh boards) ...")
            pretrain_captions(tmp, envs, m.tiny_pretrain_relation_steps, batch_size=m.tiny_pretrain_batch,
                              lr=m.tiny_pretrain_lr, seed=m.tiny_seed + 1, relations=tuple(m.tiny_pretrain_relations),
                              n_per_env=m.tiny_pretrain_relation_steps * m.tiny_pretrain_batch, stage="relations",
                              first_board=_RELATION_BOARDS_FROM, say=say)


def load_model(cfg: RunConfig, path: Path, device: torch.device):
    """``load_policy`` with the run's dtype / LoRA / checkpointing; errors name the fix."""
    from vagent.models.loading import LoraSettings, load_policy

    lora = None
    if cfg.model.lora_rank > 0:
        lora = LoraSettings(r=cfg.model.lora_rank, alpha=int(cfg.model.lora_alpha), dropout=cfg.model.lora_dropout)
    try:
        m = cfg.model
        loaded = load_policy(path, dtype=m.dtype, device=device, lora=lora, gradient_checkpointing=m.gradient_checkpointing,
                             trust_remote_code=m.trust_remote_code, min_pixels=m.min_pixels, max_pixels=m.max_pixels,
                             attn_implementation=m.attn_implementation)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ModelError(f"model.path: {exc}") from exc
    if cfg.model.freeze_vision:
        frozen = [p for n, p in loaded.model.named_parameters() if set(n.split(".")) & set(VISION_TOWER_NAMES)]
        if loaded.is_vision and not frozen:
            raise ModelError(f"model.freeze_vision: found no vision tower parameters in {path} "
                             f"(looked for modules named {VISION_TOWER_NAMES}).")
        for p in frozen:
            p.requires_grad_(False)
    return loaded


#: module names of vision towers in HF VLMs (Qwen2/2.5/3-VL: "visual")
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder")


def check_compatible(loaded: Any, cfg: RunConfig) -> None:
    """A text-only model cannot play an env that shows images: say so before training."""
    if loaded.is_vision:
        return
    from vagent.envs import make

    for i, e in enumerate(cfg.envs):
        env = make(e.name, **e.config)
        try:
            obs, _ = env.reset(0)
        finally:
            env.close()
        if obs.images:
            raise ModelError(
                f"model {loaded.name} is text-only (no image processor / vision config) but env "
                f"'{e.name}' (envs.{i}) shows images. Use a vision-language model, or a text render: "
                f"envs.{i}.config.render=text."
            )


def export_policy(model: torch.nn.Module, source_dir: Path, out: Path) -> None:
    """Save the policy as a model directory that ``load_policy`` (and ``vagent eval``) can read:
    ``save_pretrained`` weights/config plus the tokenizer, chat template and image processor files
    of the source directory. A LoRA policy is saved merged into a copy of the base weights."""
    from vagent.models.forward import unwrap

    out.mkdir(parents=True, exist_ok=True)
    if getattr(model, "merge_and_unload", None) is not None:
        import copy

        copy.deepcopy(model).merge_and_unload().save_pretrained(out)
    else:
        unwrap(model).save_pretrained(out)
    for f in Path(source_dir).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name not in ("config.json",
                                                                                             "generation_config.json"):
            if not (out / f.name).exists():
                shutil.copy2(f, out / f.name)


# names that moved to their own modules (resolved on first use, so that older imports keep working
# without an import cycle: those modules import this one)
_MOVED = {
    "vagent.recipes.batching": ("accumulation_weight", "micro_batch_rows", "mini_batches", "per_row"),
    "vagent.recipes.rollouts": ("episode_summary", "reward_metrics", "train_rollout", "validate"),
    "vagent.recipes.scoring": ("SharedPrefix", "common_prefix_length", "critic_forward", "head_only_logits",
                               "hidden_after_prefix", "policy_forward", "rl_temperature", "score_logprobs",
                               "score_reference", "score_shared", "shared_prefix", "shift_right"),
    "vagent.recipes.session": ("Session",),
}


def __getattr__(name: str) -> Any:
    import importlib

    for module, names in _MOVED.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
