"""The run record the recipes share: config, run directory, console, logger, device, the policy.

A record, not a trainer: ``train`` (``run.py``) fills it once and passes it to the recipes. In a
job of several ranks every rank has one; only rank 0's writes anything (its console prints and
appends to ``train.log``, its logger writes ``metrics.jsonl``); the other ranks get a silent
console and a :class:`SilentLogger`, and read the run directory rank 0 wrote (a filesystem all
ranks see).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch

from vagent.recipes.common import load_model
from vagent.runconfig import RunConfig
from vagent.rewards import ReasoningReward

if TYPE_CHECKING:
    from vagent.models.loading import LoadedModel
    from vagent.runs import Console, MetricsLogger, RunDir


class SilentLogger:
    """The metrics logger of ranks other than 0: same methods as ``MetricsLogger``, writes nothing."""

    def log(self, step: int, metrics: Mapping[str, Any], phase: str = "rl") -> dict:
        return {"phase": phase, "step": int(step), **metrics}

    def truncate_after(self, phase_order: Iterable[str], phase: str, step: int) -> int:
        return 0

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Session:
    """What the recipes share within one run (a frozen record, not a trainer: what changes during
    the run, such as the newest checkpoint, is kept by the loop that changes it)."""

    cfg: RunConfig
    run: RunDir
    console: Console
    logger: MetricsLogger | SilentLogger
    device: torch.device
    bf16: bool
    loaded: LoadedModel  # the policy: model, encoder, name, is_vision
    model_dir: Path

    def reasoning_reward(self):
        """The configured reasoning reward (``vagent.rewards.ReasoningReward``) for ``rollout``, or None."""
        if not self.cfg.reasoning_reward:
            return None
        return ReasoningReward(self.cfg.reasoning_reward)

    def load_fresh_model(self) -> torch.nn.Module:
        """A new, unsharded copy of the policy as loaded from ``model_dir`` (LoRA and freezing as
        configured): the skeleton that a sharded policy's full weights are loaded into when an
        unsharded copy is needed (critic, reference, export)."""
        return load_model(self.cfg, self.model_dir, self.device).model
