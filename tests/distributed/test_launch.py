"""The launcher's command lines, the row split, a 2-node job on one host through the SLURM script of
docs/distributed.md (static rendezvous), what a job says about its ranks, and a finished run's resume."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.conftest import SMALL, run_job, train_cmd


def test_torchrun_args_one_host_and_several():
    from vagent.distributed.launch import torchrun_args

    assert torchrun_args(2, ["steps=1"]) == ["--nproc_per_node=2", "--nnodes=1", "--max_restarts=0", "--standalone",
                                             "-m", "vagent", "train", "steps=1"]
    # a node rank: torchrun's static rendezvous, where the node rank decides the global ranks (c10d ignores it)
    multi = torchrun_args(8, [], nnodes=2, node_rank=1, rdzv_endpoint="node0:29400")
    assert "--rdzv_backend=static" in multi and "--rdzv_endpoint=node0:29400" in multi and "--node_rank=1" in multi
    c10d = torchrun_args(8, [], nnodes=2, rdzv_endpoint="node0:29400")  # none: c10d numbers the hosts itself
    assert "--rdzv_backend=c10d" in c10d and not any(a.startswith("--node_rank") for a in c10d)
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        torchrun_args(8, [], nnodes=2)
    with pytest.raises(ValueError, match="--node-rank must be in 0..1"):
        torchrun_args(8, [], nnodes=2, node_rank=2, rdzv_endpoint="node0:29400")


def test_split_rows_balances_tokens_not_counts():
    from vagent.distributed import split_rows

    # one long row against three short ones: 1 row on one rank, 3 on the other, 100 tokens each
    assert split_rows([100, 40, 30, 30], 2) == [[0], [1, 2, 3]]
    parts = split_rows([5, 9, 1, 7, 3, 8], 3)
    assert sorted(r for p in parts for r in p) == list(range(6))
    assert len(split_rows([4], 2)[1]) == 0  # more ranks than rows: a rank gets none (it pads)


def test_spec_blocks_keep_groups_whole_and_cover_all():
    from vagent.rollout.loop import spec_blocks

    assert spec_blocks(5, 2) == [(0, 3), (3, 5)]
    assert spec_blocks(1, 2) == [(0, 1), (1, 1)]


def test_single_process_micro_batches_unchanged():
    """One process: the update's micro-batches are exactly micro_batch_rows' (no padding, no collective)."""
    import torch

    from vagent.distributed import Padding, micro_batch_rows, rank_micro_batches, world

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


def _sbatch_script() -> str:
    """The SLURM script of docs/distributed.md, as written."""
    doc = (Path(__file__).parents[2] / "docs" / "distributed.md").read_text()
    (script,) = [b for b in re.findall(r"```bash\n(.*?)```", doc, re.S) if "#SBATCH" in b]
    return script


#: stand-ins for SLURM on one host: srun starts its command once per node of a 2-node allocation
#: (SLURM_NODEID 0 and 1), each task's output in task<id>.log; scontrol names the host
SRUN = """#!/bin/bash
pids=()
for id in 0 1; do SLURM_NODEID=$id SLURM_PROCID=$id "$@" > "$SRUN_LOGS/task$id.log" 2>&1 & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
"""
SCONTROL = """#!/bin/sh
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
"""


def slurm_folder(tmp: Path, srun: str = SRUN, scontrol: str = SCONTROL) -> tuple[Path, Path, Path]:
    """docs/distributed.md's SLURM script written to ``tmp/train.sbatch`` and the stand-ins for
    ``srun`` and ``scontrol`` in ``tmp/bin``; returns (the script, the bin folder, the venv the
    script activates: this interpreter's)."""
    script = tmp / "train.sbatch"
    script.write_text(_sbatch_script())
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", srun), ("scontrol", scontrol)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    venv = Path(sys.executable).parent.parent
    assert (venv / "bin" / "activate").is_file(), "the test runs the script with the venv it activates"
    return script, bin_dir, venv


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_slurm_script_runs_two_nodes_with_rank_0_on_node_rank_0(tmp_path, tiny_vlm_dir):
    """docs/distributed.md's SLURM script, as written, on 127.0.0.1 with two node ranks (two torchrun
    agents, static rendezvous): the job succeeds, global rank 0 (the one that prints the run) is on
    node rank 0 even though torchrun numbers c10d hosts by name, no agent ignores its node rank, the
    end has no store error, and the run says it had 2 ranks on 2 nodes.

    Where network namespaces can be made (root), tests/multihost/test_host_jobs.py runs the same
    script with its two tasks on two hosts and checks all of this (one torchrun job fewer here)."""
    from tests.multihost.cluster import unavailable

    if unavailable() is None:
        pytest.skip("the namespace cluster runs this script on two hosts with the same checks: tests/multihost/"
                    "test_host_jobs.py::test_the_slurm_script_runs_one_task_per_host_with_rank_0_on_node_rank_0")
    script, bin_dir, venv = slurm_folder(tmp_path)
    shared = tmp_path / "shared"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_LOGS=str(tmp_path), SLURM_NNODES="2",
               SLURM_JOB_NODELIST="127.0.0.1", VAGENT_VENV=str(venv), SHARED=str(shared), NPROC="1",
               RDZV_PORT=str(_free_port()), CONFIG=str(Path(__file__).parents[2] / "configs" / "frozenlake_ppo.yaml"),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = [*SMALL, "rollout.temperature=1.0", f"model.path={tiny_vlm_dir}"]
    job = subprocess.run(["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=360, start_new_session=True)
    logs = [(tmp_path / f"task{i}.log").read_text() for i in (0, 1)]
    assert job.returncode == 0, job.stdout + job.stderr + "\n".join(log[-3000:] for log in logs)
    assert "run directory:" in logs[0] and "run directory:" not in logs[1], logs  # global rank 0 on node rank 0
    assert "ranks: 2 (2 nodes x 1, torchrun)" in logs[0] and "wall time:" in logs[0] and "on 2 ranks" in logs[0]
    for log in logs:
        for text in ("recvVector", "node_rank is only used", "Traceback", "TCPStore"):
            assert text not in log, (text, log[-3000:])
    (run,) = list((shared / "runs").iterdir())
    assert json.loads((run / "summary.json").read_text())["ranks"] == 2
    environment = json.loads((run / "environment.json").read_text())
    assert (environment["ranks"], environment["nodes"]) == (2, 2)
    assert (run / "checkpoints" / "step_000001" / "dcp").is_dir()


def test_a_job_says_how_many_ranks_it_had(sft_ppo_two):
    log = (sft_ppo_two / "train.log").read_text()
    assert "ranks: 2 (1 node, torchrun); rank 0 writes the run directory" in log
    assert json.loads((sft_ppo_two / "summary.json").read_text())["ranks"] == 2
    environment = json.loads((sft_ppo_two / "environment.json").read_text())
    assert (environment["ranks"], environment["nodes"]) == (2, 1)


def test_resume_of_a_finished_run_says_so_once(tmp_path):
    """Every rank of a plain torchrun job finds the run finished; rank 0 alone says so. The launcher
    (vagent train --nproc) says it without starting the job, and without loading torch (``-X
    importtime``): the check is light, in the ranks too."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 1\n")
    (run / "summary.json").write_text("{}\n")
    plain = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                     "vagent", "train", "--resume", str(run)], tmp_path, timeout=120)
    assert plain.stdout.count("is finished (it has summary.json)") == 1, plain.stdout
    cmd = train_cmd(2, "--resume", str(run))
    launched = run_job([cmd[0], "-X", "importtime", *cmd[1:]], tmp_path, timeout=120)
    assert launched.stdout.count("is finished (it has summary.json)") == 1, launched.stdout + launched.stderr
    assert "torch.distributed" not in launched.stderr  # no torchrun job was started
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in launched.stderr.splitlines() if ln.startswith("import time:")}
    assert "vagent.recipes.finished" in loaded and "torch" not in loaded, sorted(loaded)[:40]
