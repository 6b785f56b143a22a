"""FSDP2 (``fully_shard``) for the policy, the critic and the reference model, and the passes
that touch a sharded model: forwards through its root, generation, full weights for copies and
export, gradients of replicated parameters.

How a model is sharded (:func:`shard_model`): every block of a ``ModuleList`` (decoder layers,
vision blocks) is its own FSDP unit, and a :class:`ShardedRoot` around the whole model is the
root unit holding what is left (embeddings, norms, the LM head, a critic's value head). The
root's ``forward(fn, *args)`` just calls ``fn(*args)``: vagent's passes call the backbone and the
head directly (``head_only_logits``), which would skip the root's hooks and leave the embedding a
sharded DTensor ("aten.embedding.default got mixed torch.Tensor and DTensor"); running the whole
pass as the root's forward (:func:`on_root`) gathers it first. Gradients are SUMMED over ranks
(``set_gradient_divide_factor(1.0)`` and ``set_force_sum_reduction_for_comms(True)`` on EVERY
unit: gloo rejects the PREMUL_SUM that a divide factor needs, and set on the root alone the
layers stayed averaged), because every micro-batch's loss is already weighted by its share of
the GLOBAL loss tokens.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, ParamSpec, Sequence, TypeVar

import torch
from torch import nn

from vagent.distributed.collectives import collective
from vagent.distributed.world import world

P = ParamSpec("P")
T = TypeVar("T")

#: the attribute a sharded module holds its ShardedRoot in: a plain attribute, not a submodule (no
#: registry keeps the module alive; the module <-> root cycle goes with the module)
_ROOT_ATTR = "_vagent_sharded_root"


class ShardedRoot(nn.Module):
    """The FSDP2 root around a model: ``root(fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)``
    inside the root's forward hooks (root parameters gathered, gradients reduced after backward)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.active = False

    def forward(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        self.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            self.active = False


def root_of(module: nn.Module) -> ShardedRoot | None:
    """The ShardedRoot that ``module`` runs under, or None (not sharded)."""
    return vars(module).get(_ROOT_ATTR)


def attach_root(modules: Sequence[nn.Module], root: ShardedRoot) -> None:
    """Make ``root`` the root that each of ``modules`` runs under (:func:`root_of`). Each module holds
    it as a plain attribute (``object.__setattr__``: not registered as a submodule, so it is in no
    ``state_dict`` or ``modules()``), so nothing outlives the modules: once the run drops a sharded
    model, its root goes with it."""
    for m in modules:
        object.__setattr__(m, _ROOT_ATTR, root)


def on_root(module: nn.Module, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` -- through ``module``'s FSDP2 root when it is sharded and that root is
    not already running (a single process: always the plain call)."""
    root = root_of(module)
    if root is None or root.active:
        return fn(*args, **kwargs)
    return root(fn, *args, **kwargs)


def _units(module: nn.Module) -> list[nn.Module]:
    """The blocks of the outermost ``ModuleList``s of ``module`` that hold parameters."""
    units: list[nn.Module] = []
    inside: set[str] = set()
    for name, m in module.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if isinstance(m, nn.ModuleList):
            inside.add(name)
            units += [b for b in m if any(True for _ in b.parameters())]
    return units


def shard_model(model: nn.Module, *, bf16: bool = False, cpu_offload: bool = False,
                reshard_after_forward: bool = True, also: Sequence[nn.Module] = ()) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over all ranks; returns ``model`` (its parameters are
    now DTensor shards: build optimizers AFTER this). ``also``: modules whose passes run under
    this model's root (a critic that shares the policy's backbone). A single process: nothing.

    ``bf16``: parameters are gathered and computed in bfloat16, gradients reduced in float32
    (mixed precision; for CUDA). ``cpu_offload``: shards, gradients and the optimizer state live
    in CPU memory (parameters are copied to the GPU for each unit's forward/backward).
    """
    w = world()
    if not w.distributed:
        return model
    root = root_of(model)
    if root is not None:
        attach_root(also, root)
        reshard_all(model)  # the sharded parameters are the ones an optimizer built now must hold
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    device = next(model.parameters()).device
    if cpu_offload and device.type == "cpu":
        raise ValueError("dist.cpu_offload: true moves parameter shards, gradients and optimizer state from the GPU "
                         "to CPU memory; this job runs on the CPU already. Set dist.cpu_offload: false.")
    mesh = collective("init_device_mesh", lambda: init_device_mesh(device.type, (w.size,)))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    root = _fully_shard(model, kwargs)
    attach_root((model, *also), root)
    with torch.no_grad():  # the root's first forward initialises FSDP (its lazy init) as THE root
        collective("fsdp root init", lambda: root(lambda: None))
    reshard_all(model)  # (reshard_after_forward false would leave that forward's gathered weights)
    return model


def _fully_shard(model: nn.Module, kwargs: dict[str, Any]) -> ShardedRoot:
    """``fully_shard(**kwargs)`` on each block of ``model``'s ModuleLists, then on a
    :class:`ShardedRoot` around the whole model; every unit sums its gradients over ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for unit in _units(model):
        fully_shard(unit, **kwargs)
    root = ShardedRoot(model)
    root.reshard_setting = kwargs["reshard_after_forward"]
    fully_shard(root, **kwargs)
    for m in root.modules():
        if isinstance(m, FSDPModule):  # sums, not means (module docstring); on EVERY unit
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return root


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """Every FSDP unit under ``model``'s root (root first); [] when not sharded."""
    from torch.distributed.fsdp import FSDPModule

    root = root_of(model)
    return [m for m in root.modules() if isinstance(m, FSDPModule)] if root is not None else []


@contextlib.contextmanager
def generation_mode(model: nn.Module) -> Iterator[None]:
    """Keep ``model`` gathered for a whole rollout: every unit unsharded once and not resharded
    after its forwards, so decoding runs with no collective (ranks decode different numbers of
    tokens); resharded at the end, before the update. A single process: nothing."""
    units = fsdp_units(model)
    if not units:
        yield
        return
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
    collective("unshard for generation", lambda: [u.unshard() for u in units])
    try:
        yield
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(root_of(model).reshard_setting, recurse=False)


def reshard_all(model: nn.Module) -> None:
    """Put every FSDP unit of ``model`` back in its sharded state (the parameters the optimizer
    holds), e.g. before a checkpoint when ``dist.reshard_after_forward`` is false. One process: nothing."""
    for u in fsdp_units(model):
        u.reshard()


def full_state_dict(model: nn.Module, to_all_ranks: bool = True) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of ``model`` (FQNs as in the unsharded model); every rank must
    call it. ``to_all_ranks=False``: only rank 0 gets them (on CPU), the others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if root_of(model) is None:
        return model.state_dict()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=not to_all_ranks)
    return collective("gather full weights", lambda: get_model_state_dict(model, options=opts))


def unsharded_copy(model: nn.Module, make_skeleton: Callable[[], nn.Module]) -> nn.Module:
    """An unsharded module with ``model``'s current weights on every rank: ``model`` itself when it
    is not sharded, else ``make_skeleton()`` (a fresh load) with the gathered full weights."""
    if root_of(model) is None:
        return model
    full = full_state_dict(model)
    copy = make_skeleton()
    copy.load_state_dict({k: v.to(next(copy.parameters()).device) for k, v in full.items()})
    return copy


def reduce_replicated_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum the gradients of parameters that are NOT sharded (a shared critic's value head) over
    ranks, as FSDP does for sharded ones. A single process: nothing."""
    if not world().distributed:
        return
    from torch.distributed.tensor import DTensor

    plain = [p for p in params if p.grad is not None and not isinstance(p, DTensor)]
    if not plain:
        return
    import torch.distributed as dist

    flat = torch.cat([p.grad.detach().reshape(-1) for p in plain])
    collective("all_reduce replicated gradients", lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM))
    i = 0
    for p in plain:
        n = p.grad.numel()
        p.grad.copy_(flat[i:i + n].view_as(p.grad))
        i += n
