"""The recipes' side of sharding: which models are sharded how, copies of a sharded policy, export.

Three calls, in the order a recipe makes them (all do nothing in a single process):

    source = policy_to_copy(session)         # the policy, unsharded, for build_critic / reference_model
    shard_for_training(session, critic, ref) # FSDP2 on the policy, a separate critic, a separate reference
    export = policy_export(session, model)   # writes the HF model directory (rank 0) from a sharded policy

What is sharded: the policy (always), a critic with its own backbone (its own root), a frozen
reference copy (its own root, no gradients). A critic that shares the policy's backbone runs
under the policy's root and its value head stays replicated (its gradient is summed over ranks in
``clip_grads``); a LoRA policy's reference is the policy with adapters disabled (same root).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from torch import nn

from vagent.distributed import full_state_dict, root_of, shard_model, unsharded_copy, world
from vagent.recipes.common import export_policy
from vagent.recipes.session import Session

if TYPE_CHECKING:
    from vagent.models.loading import LoadedModel
    from vagent.models.value import ReferenceModel, ValueModel


def policy_to_copy(session: Session) -> LoadedModel:
    """A LoadedModel whose model is unsharded (for deep copies): the session's own when the policy
    is not sharded (one process, or before the first recipe shards it), else a fresh load holding
    the sharded policy's current weights (every rank calls this)."""
    model = unsharded_copy(session.loaded.model, session.load_fresh_model)
    return session.loaded if model is session.loaded.model else dataclasses.replace(session.loaded, model=model)


def shard_for_training(session: Session, critic: ValueModel | None = None, ref: ReferenceModel | None = None) -> None:
    """FSDP2 on the policy (once per run), a separate critic and a reference model that is not the
    policy itself (see the module docstring). Build optimizers after this."""
    if not world().distributed:
        return
    dist_cfg, device = session.cfg.dist, session.device

    def shard(model: nn.Module, also: Sequence[nn.Module] = ()) -> None:
        shard_model(model, bf16=session.bf16 and device.type == "cuda", cpu_offload=dist_cfg.cpu_offload,
                    reshard_after_forward=dist_cfg.reshard_after_forward, also=also)

    shares = critic is not None and critic.shares_backbone
    shard(session.loaded.model, also=[critic] if critic is not None and shares else [])
    if critic is not None and not shares:
        shard(critic)
    if ref is not None and ref.model is not session.loaded.model:
        shard(ref.model)


def policy_export(session: Session, model: nn.Module) -> Callable[[Path], None]:
    """``export(out)`` for ``save_checkpoint``: the policy as a ``from_pretrained`` directory. A
    sharded policy's full weights are gathered (every rank calls ``export``) and rank 0 writes."""
    if root_of(model) is None:
        return lambda out: export_policy(model, session.model_dir, out)

    def export(out: Path) -> None:
        full = full_state_dict(model, to_all_ranks=False)  # rank 0 gets them, on the CPU
        if world().is_main:
            copy = session.load_fresh_model().cpu()
            copy.load_state_dict(full)
            export_policy(copy, session.model_dir, out)

    return export
