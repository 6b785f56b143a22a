"""Checks of a run config that its types alone cannot make: every number's range, the run name,
the config file's encoding and the output folder.

:data:`RANGES` declares, per numeric field of :class:`vagent.runconfig.RunConfig` (dotted key,
``envs.N.*`` for every env entry), the closed or open interval its value must lie in; a float
must also be finite (no ``.nan`` / ``.inf``). :func:`check_ranges` walks the table, so a value that
would fail later (a NaN temperature at the first rollout, ``steps=1e26``, a negative model size)
fails at load in one line naming the key, the range and the default. ``tests/recipes/test_config_ranges.py``
checks that every numeric field has a row and that each row refuses values outside it;
docs/configuration.md ("Value ranges") is generated from the table (:func:`ranges_markdown`).
Bounds are wide on purpose: they exclude what cannot work (or would run for centuries), not
unusual choices.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from vagent.config import ConfigError


@dataclass(frozen=True)
class Range:
    """``lo <= value <= hi`` (``<`` on an open side), optionally a multiple of ``step``."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    multiple_of: int = 0
    why: str = ""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below and (not self.multiple_of or value % self.multiple_of == 0)

    def text(self) -> str:
        interval = f"{'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        return interval + (f", a multiple of {self.multiple_of}" if self.multiple_of else "")


def _num(x: float) -> str:
    """Bounds as written in the table: 1e7, 2^20, 2^63-1, 0.5."""
    if not float(x).is_integer():
        return f"{x:g}"
    n = int(x)
    for k in range(6, 13):
        if n == 10**k:
            return f"1e{k}"
    for k in range(20, 64):
        if n == 2**k:
            return f"2^{k}"
        if n == 2**k - 1:
            return f"2^{k}-1"
    return str(n)


STEPS = 10_000_000  # steps, warm-ups, periods: more would run for years
TOKENS = 1 << 20  # per-turn and per-sample token counts (about a million)

#: dotted key -> its range (``envs.N.`` applies to every env entry); a None value (an optional
#: field's "off") is always accepted
RANGES: dict[str, Range] = {
    # top level
    "steps": Range(0, STEPS),
    "seed": Range(0, 2**63 - 1),
    "threads": Range(0, 4096),
    # model
    "model.tiny_hidden": Range(32, 8192, multiple_of=8, why="tiny_heads heads of an even head size >= 8"),
    "model.tiny_heads": Range(1, 128),
    "model.tiny_layers": Range(1, 128),
    "model.tiny_image_size": Range(28, 4096),
    "model.tiny_seed": Range(0, 2**32 - 1),
    "model.tiny_rope_theta": Range(0, 1e12, why="0 = the family's base"),
    "model.tiny_pretrain_steps": Range(0, STEPS),
    "model.tiny_pretrain_lr": Range(0, 1, lo_open=True),
    "model.tiny_pretrain_batch": Range(1, 65536),
    "model.tiny_pretrain_relation_steps": Range(0, STEPS),
    "model.lora_rank": Range(0, 65536),
    "model.lora_alpha": Range(0, 1e6, lo_open=True),
    "model.lora_dropout": Range(0, 1, hi_open=True),
    "model.min_pixels": Range(1, 1e9),
    "model.max_pixels": Range(1, 1e9),
    "model.max_context_tokens": Range(2, 1 << 24),
    # envs
    "envs.N.n_train": Range(0, 1_000_000),
    "envs.N.n_val": Range(0, 1_000_000),
    "envs.N.timeout_s": Range(0, 1e6, lo_open=True, why="seconds per env-server request"),
    "envs.N.retry_timeout_s": Range(0, 1e6, lo_open=True, why="seconds an env call retries across urls"),
    # rollout
    "rollout.group_size": Range(1, 4096),
    "rollout.max_turns": Range(1, 10_000),
    "rollout.window": Range(1, 10_000),
    "rollout.max_new_tokens": Range(1, TOKENS),
    "rollout.temperature": Range(0, 100, why="0 = greedy rollouts (log-probs scored at 1)"),
    "rollout.top_p": Range(0, 1, lo_open=True),
    "rollout.top_k": Range(0, TOKENS),
    "rollout.replicas": Range(0, 1024),
    "rollout.replica_threads": Range(1, 4096),
    "rollout.push_timeout_s": Range(0, 1e6, lo_open=True, why="seconds; a replica slower than this is killed"),
    "rollout.generate_timeout_s": Range(0, 1e6, lo_open=True, why="seconds; a replica slower than this is killed"),
    "rollout.overlap": Range(0, 1),
    "rollout.max_staleness": Range(0, 64, why="updates a batch's oldest token may be behind; 0 = off"),
    "rollout.vllm_gpu_memory": Range(0, 1, lo_open=True),
    "rollout.canary_tolerance": Range(0, 1000, lo_open=True, why="the largest log-prob gap accepted on a probe token"),
    "rollout_correction.is_threshold": Range(0, 1e9, lo_open=True, why="C: IS weights truncated at C"),
    "rollout_correction.rs_low": Range(0, 1e9, lo_open=True),
    "rollout_correction.rs_high": Range(0, 1e9, lo_open=True),
    "rollout_correction.veto_threshold": Range(0, 1, lo_open=True),
    # update
    "update.actor_lr": Range(0, 1, lo_open=True),
    "update.weight_decay": Range(0, 10),
    "update.warmup_steps": Range(0, STEPS),
    "update.epochs": Range(1, 1000),
    "update.mini_batches": Range(1, 1_000_000),
    "update.micro_batch_tokens": Range(16, 1 << 30),
    "update.grad_clip": Range(0, 1e9, why="0 = off"),
    "update.clip_low": Range(0, 1, hi_open=True),
    "update.clip_high": Range(0, 100),
    "update.dual_clip": Range(1, 1e9, lo_open=True),
    "update.entropy_coef": Range(-10, 10),
    "update.kl_coef": Range(0, 1000),
    "update.logprob_chunk": Range(1, 1 << 24),
    # ppo
    "ppo.gamma_token": Range(0, 1),
    "ppo.gamma_turn": Range(0, 1),
    "ppo.lam": Range(0, 1),
    "ppo.critic_lr": Range(0, 1, lo_open=True),
    "ppo.value_clip": Range(0, 1e9, why="0 = off"),
    "ppo.critic_warmup_steps": Range(0, STEPS),
    "ppo.filter_value": Range(0, 1, lo_open=True),
    # grpo
    "grpo.filter_value": Range(0, 1, lo_open=True),
    "grpo.gigpo_gamma": Range(0, 1),
    "grpo.gigpo_omega": Range(0, 1000),
    # sft
    "sft.steps": Range(0, STEPS),
    "sft.demos_per_env": Range(0, 10_000_000),
    "sft.random_action_frac": Range(0, 1),
    "sft.batch_size": Range(1, 65536),
    "sft.lr": Range(0, 1, lo_open=True),
    "sft.max_turns": Range(1, 10_000),
    "sft.actions_per_turn": Range(0, 1000),
    "sft.answer_weight": Range(0, 1000, lo_open=True),
    # val, log, dist, hub
    "val.every": Range(0, STEPS),
    "val.max_turns": Range(1, 10_000),
    "log.rollouts_every": Range(0, STEPS),
    "log.rollouts_n": Range(0, 1_000_000),
    "log.rollouts_max_mb": Range(0, 1e9),
    "log.checkpoint_every": Range(0, STEPS),
    "log.keep_last": Range(1, 10_000),
    "log.plot_every": Range(0, STEPS),
    "dist.timeout_s": Range(0, 30 * 86400, lo_open=True),
    "dist.nproc": Range(0, 65536, why="0 = any"),
    "hub.every": Range(1, STEPS),
}


def _values(tree: Any, parts: list[str], where: str) -> Iterator[tuple[str, Any]]:
    """(dotted key with indices, value) of every place ``parts`` (``N`` = each list item) reaches."""
    if not parts:
        yield where, tree
        return
    head, rest = parts[0], parts[1:]
    if head == "N":
        for i, item in enumerate(tree):
            yield from _values(item, rest, f"{where}.{i}" if where else str(i))
    else:
        yield from _values(getattr(tree, head), rest, f"{where}.{head}" if where else head)


def class_default(key: str, cfg: Any) -> Any:
    """The dataclass default of dotted ``key`` in ``cfg``'s config class (``envs.N.*``: the default of
    the class of ``cfg``'s first list item there; ``cfg`` has one, since a value was found). Takes the
    classes from ``cfg``, so that it serves any config tree the :data:`RANGES` keys reach."""
    node: Any = type(cfg)()
    live: Any = cfg
    for part in key.split("."):
        if part == "N":
            live = live[0]
            node = type(live)()
        else:
            node, live = getattr(node, part), getattr(live, part)
    return node


def check_ranges(cfg: Any) -> None:
    """Raise ConfigError for the first numeric field outside its :data:`RANGES` row."""
    for key, bounds in RANGES.items():
        for where, value in _values(cfg, key.split("."), ""):
            if value is None or bounds.contains(value):
                continue
            what = "a finite number" if isinstance(value, float) else "an integer"
            why = f" ({bounds.why})" if bounds.why else ""
            default = class_default(key, cfg)
            raise ConfigError(f"{where} must be {what} in {bounds.text()}{why}, got {value!r}. Set {where}= a value in "
                              f"that range (the default is {'null' if default is None else default!r}).")


def ranges_markdown() -> str:
    """The table of docs/configuration.md's "Value ranges" (tests keep it current)."""
    rows = ["| key | range | note |", "|---|---|---|"]
    rows += [f"| `{key}` | {bounds.text()} | {bounds.why} |" for key, bounds in RANGES.items()]
    return "\n".join(rows) + "\n"


def check_name(name: str) -> None:
    """A run name is one folder name inside out_dir: no separators, not ``.``/``..``, not absolute."""
    bad = (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
           or os.path.isabs(name) or name != name.strip())
    if bad:
        raise ConfigError(f"name must be a plain folder name (the run directory is <out_dir>/<name>-<time>), got "
                          f"{name!r}: it would leave out_dir. Set name= without '/', '\\', '..' or surrounding "
                          "spaces (e.g. name=frozenlake-ppo), and put the parent folder in out_dir.")


def check_out_dir(out_dir: str) -> None:
    """out_dir must be a folder, or a path whose nearest existing parent is a writable folder."""
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out_dir {str(path)!r} is a file, not a folder; set out_dir= a folder (it is created if "
                          "missing), e.g. out_dir=runs.")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"out_dir {str(path)!r} cannot be created: {str(existing)!r} is a file. "
                          "Set out_dir= a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"out_dir {str(path)!r} cannot be written: no write permission on {str(existing)!r}. "
                          "Set out_dir= a folder you can write to.")


def read_config_text(path: Path) -> str:
    """The text of config file ``path``; ConfigError if it is not UTF-8 or cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read ({exc.strerror or exc}).") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); save it as UTF-8 (a YAML file of key: value lines).") from exc
