"""Helpers of the distributed tests: real ``torchrun`` jobs (gloo, 2 ranks) of ``vagent train`` on the
tiny VLM, and the weights a checkpoint holds (one-process ``<name>.pt`` files or a sharded ``dcp/``).

Each job is a subprocess with a timeout, so a hang fails the test instead of CI; every job's
collectives also time out (``dist.timeout_s``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# a PPO step of the tiny VLM in ~15 s per process: greedy rollouts, so that 1 and 2 processes
# roll out the same episodes (sampling draws differ with the batch's composition)
SMALL = [
    "steps=1", "sft.steps=0", "val.every=0", "threads=1", "envs.0.n_train=4", "envs.0.n_val=0",
    "envs.0.config.image_size=64", "rollout.max_turns=2", "rollout.max_new_tokens=12", "rollout.temperature=0",
    "update.epochs=1", "update.mini_batches=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0",
    "update.micro_batch_tokens=1024", "log.tensorboard=false", "log.progress=false", "log.rollouts_every=0",
    "log.checkpoint_every=1", "log.plot_every=0", "log.plots=false", "log.keep_last=5", "dist.timeout_s=60",
]


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    from vagent.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", hidden=64, layers=2, image_size=64)


#: one SFT step, then two PPO steps with a separate critic: the job that the parity, SIGKILL-resume
#: and 2 -> 1 resume tests share (run once per session, by plain torchrun)
SFT_PPO = ["steps=2", "sft.steps=1", "sft.batch_size=4", "sft.demos_per_env=4", "ppo.critic_backbone=separate",
           "update.kl_coef=0"]


#: the parity cases the GPU test repeats with nccl (tests/distributed/test_parity.py has the CPU ones)
CASES_GPU = {
    "ppo-separate-critic": ["ppo.critic_backbone=separate", "update.kl_coef=0"],
    "grpo-lora": ["recipe=grpo", "rollout.group_size=2", "envs.0.n_train=2", "model.lora_rank=4",
                  "update.kl_coef=0.01", "update.kl_in=loss"],
}


@pytest.fixture(scope="session")
def sft_ppo_two(tmp_path_factory, tiny_vlm_dir) -> Path:
    """The SFT_PPO run with 2 processes, started with plain ``torchrun ... -m vagent train``."""
    tmp = tmp_path_factory.mktemp("sft_ppo_two")
    out = tmp / "runs"
    run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "vagent",
             "train", *SMALL, *SFT_PPO, f"out_dir={out}", f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED"], tmp)
    (run,) = list(out.iterdir())
    return run


def train_cmd(nproc: int | None, *args: str) -> list[str]:
    """``python -m vagent train [--nproc N] ARGS`` (nproc None: one plain process)."""
    return [sys.executable, "-m", "vagent", "train", *(["--nproc", str(nproc)] if nproc else []), *args]


def run_job(cmd: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    """Run a command to completion (a timeout kills it and fails the test); its output on failure."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    try:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s (a hang?):\n{exc.stdout}\n{exc.stderr}")
    assert out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return out


def train(tmp: Path, model: Path, nproc: int | None, name: str, *extra: str, timeout: float = 150) -> Path:
    """One ``vagent train`` run (``nproc`` processes, or one plain process) under ``tmp/name``;
    returns its run directory. ``{out}`` in an override is ``tmp/name``."""
    out = tmp / name
    extra = tuple(e.replace("{out}", str(out)) for e in extra)
    run_job(train_cmd(nproc, *SMALL, f"out_dir={out}", f"model.path={model}", "model.cache_dir=UNUSED", *extra),
            tmp, timeout)
    (run,) = [p for p in out.iterdir() if p.is_dir() and p.name != "cache"]
    return run


def rank_process(job: subprocess.Popen, rank: int):
    """The worker (``psutil.Process``) of ``rank`` among a launcher's children (torchrun sets RANK in
    its environment)."""
    import psutil

    for child in psutil.Process(job.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "vagent" in " ".join(child.cmdline()):
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no worker with RANK={rank} under the launcher {job.pid}")


def killed_after_checkpoint(tmp: Path, model: Path, nproc: int | None, name: str, *extra: str, step: int = 2,
                            timeout: float = 400, kill: str = "group") -> Path:
    """A ``vagent train`` run under ``tmp/name`` SIGKILLed as soon as checkpoint ``step`` is written,
    which must hold the rollout in flight (``inflight.pt``); returns its run directory, to be resumed.

    What is killed (``kill``):

    - ``"group"``: the whole process group, the launcher and every rank;
    - ``"trainer"`` (one process, with engine replicas): the trainer's process alone, as the OOM
      killer would; no process of its Ray cluster may outlive it by 30 s (Ray's agents, reparented
      to init, did before the reaper's watchdog). The test must use ``own_ray_temp``, so no other
      run on the host reaps what the watchdog must kill;
    - ``"rank1"`` (a job of 2 ranks, with engine replicas): rank 1 alone; torchrun stops rank 0, the
      Ray driver, without its cleanup running, the job exits 1 naming rank 1, and no process of
      rank 0's Ray cluster may outlive it by 30 s."""
    import signal

    from tests.ray_sessions import outlives, session_processes
    from tests.waiting import wait_for_file
    from vagent.models.ray_reaper import MARKER

    assert kill in ("group", "trainer", "rank1"), kill
    assert kill == "group" or (kill == "trainer") == (nproc is None), f"kill={kill!r} does not fit nproc={nproc}"
    out = tmp / name
    cmd = train_cmd(nproc, *SMALL, f"out_dir={out}", f"model.path={model}", "model.cache_dir=UNUSED", *extra)
    job = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"), start_new_session=True)
    ckpt = f"step_{step:06d}"
    try:
        wait_for_file(job, out, f"*/checkpoints/{ckpt}/state.pt", f"step {step}'s checkpoint", timeout, poll_s=0.02)
        assert list(out.glob(f"*/checkpoints/{ckpt}/inflight.pt")), f"step {step}'s checkpoint holds no rollout in flight"
        if kill == "group":
            job.send_signal(signal.SIGKILL)
            job.wait(timeout=30)
        elif kill == "trainer":
            names = " ".join(session_processes(job.pid))
            assert "ray::DashboardAgent" in names and "ray::RuntimeEnvAgent" in names, names
            ray_temp = Path(os.environ["RAY_TMPDIR"]) / "ray"
            assert list(ray_temp.glob(f"session_*_{job.pid}/{MARKER}")), f"not marked in {ray_temp}"
            job.send_signal(signal.SIGKILL)
            job.wait(timeout=30)
            left = outlives(job.pid, 30)
            assert not left, f"processes of the killed trainer's Ray cluster still run: {left}"
        else:
            driver = rank_process(job, 0).pid  # rank 0 started the Ray cluster
            assert any("EngineReplica" in line for line in session_processes(driver)), session_processes(driver)
            rank_process(job, 1).send_signal(signal.SIGKILL)
            try:  # the job must end: torchrun stops rank 0
                text, _ = job.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail("the job still ran 120 s after rank 1 was killed")
            assert job.returncode == 1 and "rank 1 was killed by SIGKILL" in text, text[-4000:]
            left = outlives(driver, 30)
            assert not left, f"processes of rank 0's Ray cluster outlived the failed job: {left}"
    finally:
        if job.poll() is None:
            job.kill()
        try:  # ranks end with their launcher; a straggler must not write on into the resumed run
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def checkpoint_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """``{"<module>.<parameter name>": tensor}`` of every module in a checkpoint folder, from
    ``<module>.pt`` (one process) or the sharded ``dcp/`` (several)."""
    if (ckpt / "dcp").is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        flat = ckpt.parent.parent / f"{ckpt.name}-flat.pt"
        dcp_to_torch_save(ckpt / "dcp", flat)
        state = torch.load(flat, weights_only=False)
        return {f"{k[len('model.'):]}.{n}": v for k, sd in state.items() if k.startswith("model.") for n, v in sd.items()}
    return {f"{f.stem}.{n}": v for f in ckpt.glob("*.pt") if f.name not in ("state.pt", "inflight.pt")
            for n, v in torch.load(f, weights_only=True).items()}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest, over the modules of a checkpoint (policy, critic, ...), relative difference of
    all its parameters: ||a - b|| / ||a|| over the module's concatenated tensors.

    Why not element by element: a key projection's bias has a zero gradient up to rounding
    (softmax ignores a shift of all scores), and Adam's first step turns that rounding noise into
    an update of +-lr, so single elements differ at the 1e-4 level between any two summation orders
    (also between two single-process runs with different thread counts). LoRA adapters are their
    own group."""
    assert a.keys() == b.keys(), f"different tensors: {sorted(a.keys() ^ b.keys())[:6]}"

    def group(k: str) -> str:  # LoRA adapters apart: their update is lost in the frozen base's norm
        return k.split(".", 1)[0] + (".lora" if "lora_" in k else "")

    worst = 0.0
    for g in sorted({group(k) for k in a}):
        keys = [k for k in a if group(k) == g]
        x = torch.cat([a[k].float().flatten() for k in keys])
        y = torch.cat([b[k].float().flatten() for k in keys])
        worst = max(worst, float((x - y).norm() / x.norm().clamp(min=1e-12)))
    return worst


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], prefix: str) -> bool:
    """Did any tensor under ``prefix`` change (the step did train)?"""
    return any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix))
