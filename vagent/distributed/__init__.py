"""Training on several processes, GPUs and hosts: torch.distributed under ``torchrun``.

The recipes read the same with 1 process or 64; what differs is in a handful of named helpers:

- :mod:`~vagent.distributed.world`        rank / world size, joining and destroying the process group
- :mod:`~vagent.distributed.collectives`  ``gather_objects``, ``gather_metrics``, ``global_max``,
  ``global_token_count``, ``barrier``: every collective has its home here, with a timeout and an
  error naming the rank and the collective (``side_group`` / ``on_group``: a second group for a
  thread that runs collectives beside the trainer's)
- :mod:`~vagent.distributed.split`        how rows are shared between ranks (balanced by tokens;
  the same number of micro-batches on every rank; ``RowResults``: a scoring pass's results gathered)
- :mod:`~vagent.distributed.fsdp`         ``shard_model`` (FSDP2), ``on_root``, ``generation_mode``,
  full weights of a sharded model
- :mod:`~vagent.distributed.launch`       ``vagent train --nproc N``: torchrun's own launcher

A single process (the default ``vagent train``) never joins a process group and every helper
returns at once: no collective, no change to any number.
"""

from vagent.distributed.collectives import (
    DistributedError, all_reduce_sum, barrier, broadcast_object, collective, gather_metrics, gather_objects, global_max,
    global_token_count, on_group, side_group,
)
from vagent.distributed.fsdp import (
    ShardedRoot, full_state_dict, generation_mode, on_root, reduce_replicated_grads, reshard_all, root_of, shard_model,
    unsharded_copy,
)
from vagent.distributed.split import Padding, RowResults, RowTensors, micro_batch_rows, rank_micro_batches, split_rows
from vagent.distributed.world import (
    World, init_world, launched_by_torchrun, rank_device, shutdown_world, single_process, world,
)

__all__ = [
    "DistributedError", "Padding", "RowResults", "RowTensors", "ShardedRoot", "World", "all_reduce_sum", "barrier", "broadcast_object", "collective",
    "full_state_dict", "gather_metrics", "gather_objects", "generation_mode", "global_max", "global_token_count",
    "init_world", "launched_by_torchrun", "micro_batch_rows", "on_group", "on_root", "rank_device", "rank_micro_batches",
    "reduce_replicated_grads", "reshard_all", "root_of", "shard_model", "shutdown_world", "side_group", "single_process", "split_rows", "unsharded_copy", "world",
]
