"""The launcher's command lines, the row split, and a 2-node job on one host (c10d rendezvous)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.distributed.conftest import SMALL, train_cmd


def test_torchrun_args_one_host_and_several():
    from vagent.distributed.launch import torchrun_args

    assert torchrun_args(2, ["steps=1"]) == ["--nproc_per_node=2", "--nnodes=1", "--max_restarts=0", "--standalone",
                                             "-m", "vagent", "train", "steps=1"]
    multi = torchrun_args(8, [], nnodes=2, node_rank=1, rdzv_endpoint="node0:29400")
    assert "--rdzv_backend=c10d" in multi and "--rdzv_endpoint=node0:29400" in multi and "--node_rank=1" in multi
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        torchrun_args(8, [], nnodes=2)


def test_split_rows_balances_tokens_not_counts():
    from vagent.distributed import split_rows

    # one long row against three short ones: 1 row on one rank, 3 on the other, 100 tokens each
    assert split_rows([100, 40, 30, 30], 2) == [[0], [1, 2, 3]]
    parts = split_rows([5, 9, 1, 7, 3, 8], 3)
    assert sorted(r for p in parts for r in p) == list(range(6))
    assert len(split_rows([4], 2)[1]) == 0  # more ranks than rows: a rank gets none (it pads)


def test_spec_blocks_keep_groups_whole_and_cover_all():
    from vagent.recipes.rollouts import spec_blocks

    assert spec_blocks(5, 2) == [(0, 3), (3, 5)]
    assert spec_blocks(1, 2) == [(0, 1), (1, 1)]


def test_single_process_micro_batches_unchanged():
    """One process: the update's micro-batches are exactly micro_batch_rows' (no padding, no collective)."""
    import torch

    from vagent.distributed import Padding, rank_micro_batches, world
    from vagent.recipes.batching import micro_batch_rows

    class Rows:  # the two fields micro_batch_rows reads
        def __init__(self, lengths):
            self.lengths = torch.tensor(lengths)

    batch = Rows([30, 10, 20, 25, 5])
    assert not world().distributed
    got = rank_micro_batches(batch, 40)
    assert got == micro_batch_rows(batch, 40) and not any(isinstance(g, Padding) for g in got)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_localhost_run_one_step(tmp_path, tiny_vlm_dir):
    """Two torchrun agents (``--nnodes 2``, one process each) meet at a c10d rendezvous on 127.0.0.1."""
    out = tmp_path / "runs"
    endpoint = f"127.0.0.1:{_free_port()}"
    args = [*SMALL, f"out_dir={out}", f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    nodes = [subprocess.Popen(train_cmd(1, "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", endpoint, *args),
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for r in (0, 1)]
    try:
        logs = [n.communicate(timeout=150)[0] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, 9)
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    (run,) = list(out.iterdir())
    assert (run / "checkpoints" / "step_000001" / "dcp").is_dir()
    assert (run / "checkpoints" / "step_000001" / "policy" / "config.json").is_file()
