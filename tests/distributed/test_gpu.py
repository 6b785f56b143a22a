"""GPU checks (marker ``gpu``; skipped without CUDA, never in CI): the tiny-model parity with nccl
(2 cards) and the 3B-shaped update benchmark (bench/distributed.py --gpu) running to its figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.conftest import CASES_GPU, checkpoint_weights, max_rel_diff, train

pytestmark = pytest.mark.gpu
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl parity needs 2 CUDA devices")


@needs_two
@pytest.mark.parametrize("case", list(CASES_GPU))
def test_nccl_two_processes_equal_one(case, tmp_path, tiny_vlm_dir):
    extra = [*CASES_GPU[case], "device=cuda", "bf16=false"]  # fp32: parity, not speed
    two = train(tmp_path, tiny_vlm_dir, 2, "two", *extra, timeout=300)
    one = train(tmp_path, tiny_vlm_dir, None, "one", *extra, timeout=300)
    for ck in sorted(p.name for p in (one / "checkpoints").iterdir() if not p.name.startswith(".")):
        diff = max_rel_diff(checkpoint_weights(one / "checkpoints" / ck), checkpoint_weights(two / "checkpoints" / ck))
        print(f"nccl {case} {ck}: {diff:.2e}")
        assert diff < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_bench_prints_figures(tmp_path):
    bench = Path(__file__).resolve().parents[2] / "bench" / "distributed.py"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                          str(bench), "--gpu", "--rows", "4", "--length", "512", "--steps", "2",
                          "--model", str(tmp_path / "3b")], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    print(out.stdout)
    assert "tokens/s" in out.stdout and "MFU" in out.stdout and "peak memory" in out.stdout
