"""Multi-turn rollout: the loop, policies, Turn/Episode records and token batches with masks.

``rollout(env_specs, policy, sampling, group_size=, max_turns=, mode=)`` -> episodes;
``build_token_batch(episodes, mode=, pad_token_id=)`` -> ``TokenBatch`` for the recipes;
``HFPolicy`` (a local model), ``ScriptedPolicy`` / ``RandomPolicy`` / ``SolverPolicy`` /
``TokenScriptedPolicy`` (no model). ``TokenBatch``/``build_token_batch``/``HFPolicy`` import torch
on first use, so ``import vagent.rollout`` stays light for API-only evaluation.
"""

from __future__ import annotations

from vagent.rollout.encoding import TokenPolicy
from vagent.rollout.loop import MODES, EnvSpec, RolloutResult, rollout, rollout_metrics
from vagent.rollout.policy import Conversation, Message, Policy, Reply, SamplingConfig, Segment
from vagent.rollout.records import Episode, Turn
from vagent.rollout.scripted import RandomPolicy, ScriptedPolicy, SolverPolicy, TokenScriptedPolicy, solver_reply
from vagent.startup import lazy_exports

_LAZY = {
    "TokenBatch": "vagent.rollout.batch",
    "build_token_batch": "vagent.rollout.batch",
    "BATCH_MODES": "vagent.rollout.batch",
    "HFPolicy": "vagent.rollout.hf_policy",
    "sampling_params": "vagent.rollout.hf_policy",
}


__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "MODES", "EnvSpec", "RolloutResult", "rollout", "rollout_metrics", "Conversation", "Message", "Policy",
    "Reply", "SamplingConfig", "Segment", "Episode", "Turn", "TokenPolicy", "RandomPolicy", "ScriptedPolicy",
    "SolverPolicy", "TokenScriptedPolicy", "solver_reply", *_LAZY,
]
