"""The run config's rollout settings end to end (tiny VLM, real processes): envs on two real
``vagent serve-env`` servers named in the config (with the asynchronous schedule), and
``rollout.overlap: 1`` on a Ray engine replica (the step's batch comes from the previous weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from tests.service.conftest import free_port, wait_healthy
from vagent.runconfig import ConfigError, default_preset_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "sft.steps=0", "val.every=0", "threads=1", "model.cache_dir=UNUSED",
    "rollout.max_turns=2", "rollout.max_new_tokens=12",
    "update.epochs=1", "update.mini_batches=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0",
    "log.tensorboard=false", "log.progress=false", "log.rollouts_every=0", "log.checkpoint_every=0",
    "log.plot_every=0", "log.plots=false",
]
ENV = {"name": "frozenlake", "n_train": 2, "n_val": 0,
       "config": {"format": "free_think", "render": "vision", "image_size": 64}}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from vagent.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", hidden=64, layers=2, image_size=64)


def _serve_env(port: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "vagent.cli", "serve-env", "--port", str(port), "--envs",
                                 "frozenlake"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    ports = [free_port() for _ in range(2)]
    logs = [tmp_path_factory.mktemp("env_server") / "server.log" for _ in ports]
    procs = [_serve_env(p, log) for p, log in zip(ports, logs)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for proc, url, log in zip(procs, urls, logs):
            wait_healthy(proc, url, 90, lambda log=log: log.read_text(errors="replace")[-2000:])
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=15)


def config(tmp_path, model_dir, envs, *extra):
    tree = default_preset_dict()
    tree["envs"] = envs
    return load_config(tree, SMALL + [f"out_dir={tmp_path / 'runs'}", f"model.path={model_dir}", *extra])


def rl_records(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "rl" and "loss/policy" in r]


def changed(model_dir, run_dir):
    from vagent.models.loading import load_policy

    before = load_policy(model_dir).model.state_dict()
    after = torch.load(next(Path(run_dir).glob("checkpoints/step_*/policy.pt")), weights_only=True)
    after = after.get("model", after) if isinstance(after, dict) else after
    common = [k for k in before if k in after]
    assert common, "no common parameter names between the model and the checkpoint"
    return any(not torch.equal(before[k], after[k]) for k in common)


def test_a_run_with_envs_on_two_env_servers_trains_one_step(tmp_path, tiny_dir, two_servers):
    from vagent.recipes.run import train

    envs = [dict(ENV, urls=[two_servers[0]]), dict(ENV, urls=[two_servers[1]], config=dict(ENV["config"], max_steps=9))]
    cfg = config(tmp_path, tiny_dir, envs, "steps=1", "rollout.schedule=async")
    run_dir = train(cfg, quiet=True)
    (rec,) = rl_records(run_dir)
    assert rec["rollout/episodes"] == 4 and rec["rollout/errors"] == 0
    assert all(torch.isfinite(torch.tensor(v)) for k, v in rec.items() if k.startswith("loss/"))
    for url in two_servers:  # both servers hosted this run's episodes
        snap = httpx.get(url + "/metrics", timeout=5).json()
        assert snap["service/sessions_created"] >= 2 and snap["service/steps"] >= 2, snap
    assert changed(tiny_dir, run_dir)


@pytest.mark.parametrize("correction", [[], ["rollout_correction.is_level=token"]], ids=["behaviour", "decoupled"])
def test_overlap_step_generates_with_the_previous_weights_and_trains(tmp_path, tiny_dir, correction):
    pytest.importorskip("ray", reason="engine replicas need the ray extra: pip install 'vagent[ray]'")
    from vagent.recipes.run import train

    cfg = config(tmp_path, tiny_dir, [ENV], "steps=2", "rollout.replicas=1", "rollout.overlap=1",
                 "rollout.temperature=1.0", *correction)
    run_dir = train(cfg, quiet=True)
    recs = rl_records(run_dir)
    assert [r["step"] for r in recs] == [1, 2]  # RL step k = after k updates (docs/metrics.md)
    # step 1 sampled with the initial weights; step 2's batch was generated during step 1's
    # update, so with version 0 while the trainer was at version 1
    assert [(r["rollout/weights_version"], r["rollout/weights_lag"]) for r in recs] == [(0.0, 0.0), (0.0, 1.0)]
    assert [r["mismatch/staleness"] for r in recs] == [0.0, 1.0]
    assert all(r["actor/updated"] == 1.0 for r in recs)
    # the canary checked each push (start-up and after step 1's update) and the replica passed
    assert all(r["sync/canary_max_abs_diff"] < 1e-3 and r["sync/canary_s"] > 0 for r in recs)
    assert (Path(run_dir) / "canary_probe.pt").is_file()
    # behaviour vs proximal: the same weights at step 1, one update apart at step 2
    kl = [r["mismatch/behaviour_proximal_kl"] for r in recs]
    assert kl[0] < 1e-6 < kl[1]
    if correction:  # decoupled PPO: the ratio starts at 1 against the proximal policy (pi_theta = pi_prox)
        assert all(abs(r["loss/ratio_mean"] - 1.0) < 1e-4 for r in recs)
        assert recs[1]["correction/is_mean"] != pytest.approx(1.0, abs=1e-6)
    else:  # against the behaviour policy, one update old at step 2
        assert abs(recs[1]["loss/ratio_mean"] - 1.0) > 1e-4
    assert changed(tiny_dir, run_dir)
    import ray

    assert not ray.is_initialized()  # the driver started the cluster and shut it down


def test_correction_and_engine_dtype_settings_are_checked_at_load(tmp_path, tiny_dir):
    for bad, match in [("rollout_correction.is_threshold=0", "rollout_correction.is_threshold"),
                       ("rollout_correction.is_threshold=.nan", "rollout_correction.is_threshold"),
                       ("rollout_correction.rs_high=-1", "rollout_correction.rs_high")]:
        with pytest.raises(ConfigError, match=match) as err:
            config(tmp_path, tiny_dir, [ENV], bad)
        assert "\n" not in str(err.value)  # one line
    with pytest.raises(ConfigError, match="rs_low .* must be below"):
        config(tmp_path, tiny_dir, [ENV], "rollout_correction.rs_low=3", "rollout_correction.rs_high=2")
    with pytest.raises(ConfigError, match="rollout.replicas >= 1"):
        config(tmp_path, tiny_dir, [ENV], "rollout.engine_dtype=bfloat16")
    ok = config(tmp_path, tiny_dir, [ENV], "rollout.engine_dtype=bfloat16", "rollout.replicas=1",
                "rollout_correction.is_level=sequence", "rollout_correction.veto_threshold=1e-4")
    assert ok.rollout_correction.is_level == "sequence" and ok.rollout.engine_dtype == "bfloat16"


def test_overlap_needs_a_separate_generator(tmp_path, tiny_dir):
    with pytest.raises(ConfigError, match="rollout.replicas >= 1"):
        config(tmp_path, tiny_dir, [ENV], "rollout.overlap=1")
    with pytest.raises(ConfigError, match="urls"):
        config(tmp_path, tiny_dir, [dict(ENV, urls=["localhost:8000"])])


def test_rollout_setups_that_cannot_run_are_refused_with_the_fix():
    """A job of several ranks shares Ray replicas that rank 0 pushes to, so vLLM in the training
    process is refused there (with what to set instead) before anything is built; vLLM replicas,
    and overlap with replicas in a job, are allowed."""
    from vagent.runconfig import RolloutConfig
    from vagent.rollout.driver import check_rollout_setup

    with pytest.raises(ConfigError, match="set rollout.replicas N >= 1"):
        check_rollout_setup(RolloutConfig(engine="vllm"), distributed=True)
    load_config(None, ["rollout.engine=vllm", "rollout.replicas=2"])  # a valid config (Ray actors of vLLM)
    if __import__("importlib").util.find_spec("ray") is not None:
        check_rollout_setup(RolloutConfig(replicas=2, overlap=1), distributed=True)


def test_missing_ray_or_vllm_fails_before_anything_is_built(tmp_path):
    """``vagent train`` with replicas but no Ray (hidden by a ``ray`` module that cannot be found:
    a ``None`` entry in sys.modules), or with engine vllm on this CPU machine: one line, exit 1,
    no model built and no run directory (the check runs before the SFT it would otherwise waste),
    and neither torch nor transformers loaded (``-X importtime``): the config checks say it at once."""
    hide_ray = ("import sys; sys.modules['ray'] = None; import importlib.util as u; real = u.find_spec; "
                "u.find_spec = lambda name, *a: None if name == 'ray' else real(name, *a); "
                "from vagent.cli import main; sys.exit(main(sys.argv[1:]))")
    cases = [([sys.executable, "-X", "importtime", "-c", hide_ray], "rollout.replicas=2", "Ray is not installed"),
             ([sys.executable, "-X", "importtime", "-m", "vagent"], "rollout.engine=vllm", "needs vLLM")]
    for prefix, override, message in cases:
        if "vllm" in override and __import__("importlib").util.find_spec("vllm") is not None:
            continue
        out = subprocess.run([*prefix, "train", override, f"out_dir={tmp_path / 'runs'}",
                              f"model.cache_dir={tmp_path / 'cache'}"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, (out.stdout[-2000:], out.stderr[-2000:])
        assert message in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
        loaded = {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
        assert "vagent.rollout.driver" in loaded and not {"torch", "transformers"} & loaded, sorted(loaded)[:40]


def test_gathered_lora_state_is_merged_like_peft_for_vllm(tiny_dir):
    """A job pushes a LoRA policy's gathered state dict to vLLM replicas merged: W + scale * B @ A
    under the base checkpoint's names, equal to PEFT's own merge (``merge_and_unload``)."""
    import copy

    from vagent.models.loading import LoraSettings, load_policy
    from vagent.rollout.replicas import _base_model_keys, merge_lora_into_state

    policy = load_policy(tiny_dir, lora=LoraSettings(r=4, alpha=8, dropout=0.0)).model
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B starts at 0 (the merge would be the identity): make the adapters count
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    merged = merge_lora_into_state(_base_model_keys(policy.state_dict()), policy)
    want = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert merged.keys() == want.keys()
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    for k in want:
        torch.testing.assert_close(merged[k], want[k], rtol=1e-5, atol=1e-5)  # summation order
    base = {k.replace(".base_layer.", "."): v for k, v in _base_model_keys(policy.state_dict()).items()}
    assert any(not torch.allclose(merged[k], base[k]) for k in merged)  # the adapters were merged in
    assert merge_lora_into_state(want, policy) is want  # no LoRA tensors: unchanged
