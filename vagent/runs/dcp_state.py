"""The state dicts of a sharded checkpoint (several ranks, torch.distributed.checkpoint): each
module's and each optimizer's, keyed ``model.<name>`` / ``optim.<name>`` as DCP saves and loads them."""

from __future__ import annotations

from typing import Any, Mapping

import torch

__all__ = ["module_of", "sharded_state"]


def module_of(opt: torch.optim.Optimizer, modules: Mapping[str, torch.nn.Module]) -> torch.nn.Module:
    """The first module (in order) that holds ``opt``'s parameters (DCP keys optimizer state by
    the module's parameter names)."""
    first = opt.param_groups[0]["params"][0]
    for m in modules.values():
        if any(q is first for q in m.parameters()):
            return m
    raise KeyError("an optimizer's parameters belong to none of the checkpoint's modules")


def sharded_state(modules: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from vagent.distributed import reshard_all

    for m in modules.values():  # the sharded parameters, which the optimizers hold
        reshard_all(m)
    out: dict[str, Any] = {f"model.{k}": get_model_state_dict(m) for k, m in modules.items()}
    out.update({f"optim.{k}": get_optimizer_state_dict(module_of(o, modules), o) for k, o in optimizers.items()})
    return out
