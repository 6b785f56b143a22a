"""scripts/gpu-check and scripts/gpu-wheels on a machine without CUDA: the dry run CI runs, the
process-group time limit of a stage, the wheel-folder check and the CPU-vs-CUDA comparison."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


def test_dry_run_resolves_the_wheels_and_skips_the_cuda_stages_in_one_line_each(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    by_name = {s["name"]: s for s in report["stages"]}
    assert by_name["versions"]["status"] == "ok" and "torch" in by_name["versions"]["figures"]
    assert by_name["wheels"]["status"] == "ok", by_name["wheels"]["reason"]
    assert "transformers" in " ".join(by_name["wheels"]["figures"]["wheels"])
    cuda_stages = ["pytest_gpu", "ppo_cpu", "ppo_cuda", "mismatch", "engine_gap", "build_3b", "update_bench", "update_packed",
                   "engine_gap_3b", "generation"]
    for name in cuda_stages:
        assert by_name[name]["status"] == "skipped" and by_name[name]["reason"], name
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("gpu-check: ")]
    for name in cuda_stages:  # one line each, saying why
        assert sum(f" {name} " in ln and "skipped" in ln for ln in lines) == 1, proc.stdout
    assert (tmp_path / "gpu-check.log").read_text().count("=====") == len(report["stages"])


def test_a_stage_past_its_limit_is_killed_with_its_children_and_the_output_kept(tmp_path):
    check = load_script("gpu-check")
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    rc, out, seconds = check.run_process([sys.executable, "-c", code], 3.0, io.StringIO(), None)
    assert rc is None and "started" in out and time.monotonic() - t0 < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
        if "zombie" in status:
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{child}/status").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text()
    assert not alive, "the stage's grandchild outlived the stage's time limit"


def test_wheel_folder_check_names_a_missing_wheel_an_extra_version_and_the_budget(tmp_path):
    gw = load_script("gpu-wheels")
    wanted = gw.resolved()
    assert [n for n, _ in wanted] == list(gw.WHEELS)
    for name, version in wanted:
        (tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"x")
    assert gw.check(tmp_path) == []
    name, version = wanted[0]
    (tmp_path / f"{name}-{version}-py3-none-any.whl").unlink()
    (tmp_path / f"{name}-0.0.1-py3-none-any.whl").write_bytes(b"x" * (int(gw.BUDGET_MIB) + 1) * 2**20)
    problems = " ".join(gw.check(tmp_path))
    assert f"{name}=={version}: no wheel" in problems and "budget" in problems
    assert "does not exist" in gw.check(tmp_path / "nope")[0]


def test_cuda_vs_cpu_comparison_reports_the_metrics_over_tolerance():
    check = load_script("gpu-check")
    cpu = [{"step": 1, "phase": "rl", "loss/policy": 0.5, "reward/mean": 1.0, "perf/update_tokens_per_s": 10.0},
           {"step": 2, "phase": "rl", "loss/policy": 0.25, "reward/mean": 1.0, "perf/update_tokens_per_s": 11.0}]
    cuda = [{**cpu[0], "perf/update_tokens_per_s": 900.0}, {**cpu[1], "loss/policy": 0.2505}]
    res = check.compare_runs(cpu, cuda)
    assert res["steps_compared"] == 2 and res["metrics_compared"] == 3  # step, loss/policy, reward/mean
    assert list(res["over_tolerance"]) == ["loss/policy"]
    assert res["over_tolerance"]["loss/policy"] == pytest.approx(0.002)


def test_packed_stage_figures_are_parsed_with_their_ratio():
    check = load_script("gpu-check")
    out = ("NVIDIA H100 80GB HBM3 x 1, 3.75B params, batch 16 x 1024 ragged (9000 real tokens), packing off, "
           "activation checkpointing off: update 10,000 tokens/s, MFU 30.0%, peak memory 40.5 GiB per card\n"
           "NVIDIA H100 80GB HBM3 x 1, 3.75B params, batch 16 x 1024 ragged (9000 real tokens), packing on, "
           "activation checkpointing off: update 15,000 tokens/s, MFU 45.0%, peak memory 30.0 GiB per card\n")
    figs = check.figures_of("update_packed", out, Path("."))
    assert figs["padded"] == {"update_tokens_per_s": 10000.0, "mfu_percent": 30.0, "peak_memory_gib": 40.5}
    assert figs["packed"]["peak_memory_gib"] == 30.0 and figs["packed_over_padded"] == 1.5


def test_device_comparison_judges_sft_and_lists_rl(tmp_path):
    check = load_script("gpu-check")
    for side, sft_loss, rl_loss in (("cpu", 2.0, 0.5), ("cuda", 2.000001, 0.7)):
        run = tmp_path / side / "run-1"
        run.mkdir(parents=True)
        recs = [{"phase": "sft", "step": 1, "sft/loss": sft_loss}, {"phase": "rl", "step": 1, "loss/policy": rl_loss}]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    res = check.compare_devices(tmp_path / "cpu", tmp_path / "cuda")
    assert res["sft_agree"] and res["sft"]["steps_compared"] == 1
    assert list(res["rl"]["over_tolerance"]) == ["loss/policy"]
    (tmp_path / "cuda" / "run-1" / "metrics.jsonl").write_text(json.dumps({"phase": "sft", "step": 1, "sft/loss": 2.1}))
    assert not check.compare_devices(tmp_path / "cpu", tmp_path / "cuda")["sft_agree"]


def test_engine_gap_bench_on_the_cpu_shows_the_bf16_engine_gap(tmp_path):
    """bench/engine_gap.py (the engine_gap stages) on a tiny model on the CPU: the fp32 engine matches the
    trainer to float rounding, the bf16 engine's gap is orders of magnitude larger, the canary ran on both."""
    out = tmp_path / "gap.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_gap.py"), "--replies", "4", "--new-tokens", "12",
                           "--redraw", "1", "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fp32, bf16 = json.loads(out.read_text())
    assert (fp32["engine_dtype"], bf16["engine_dtype"]) == ("float32", "bfloat16")
    assert fp32["sampled_tokens"] > 0 and fp32["mismatch/abs_logprob_diff_max"] < 1e-4
    assert bf16["mismatch/abs_logprob_diff_mean"] > 100 * fp32["mismatch/abs_logprob_diff_mean"]
    assert 0 <= fp32["sync/canary_max_abs_diff"] < 1e-4 < bf16["sync/canary_max_abs_diff"]
