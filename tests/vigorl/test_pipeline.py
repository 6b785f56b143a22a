"""End to end through the CLI in subprocesses (make-data -> mcts -> traces), the training preset,
and MCTS with a real (tiny, random-weight) VLM through HFPolicy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vigorl.conftest import tree_fingerprint
from vagent.envs import make
from vagent.recipes.sft import read_chats
from vagent.vigorl.grounding import parse_grounded
from vagent.vigorl.mcts import MCTSConfig, search
from vagent.vigorl.scripted import ScriptedSearchPolicy
from vagent.vigorl.traces import BACKTRACK_MESSAGE, write_traces

ROOT = Path(__file__).resolve().parents[2]


def vagent(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "vagent.cli", "vigorl", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    if ok:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_cli_pipeline(tmp_path):
    data, trees, traces = tmp_path / "data", tmp_path / "trees.jsonl", tmp_path / "sft" / "traces.jsonl"
    vagent("make-data", str(data), "--n", "4", "--seed", "0")
    records = [json.loads(line) for line in (data / "data.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all((data / r["image"]).is_file() for r in records)
    out = vagent("mcts", str(trees), "--data", str(data / "data.jsonl"), "--n", "4", "--policy", "scripted")
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["mcts/trees"] == 4 and metrics["mcts/best_path_accuracy"] == 1.0
    assert len(trees.read_text().splitlines()) == 4
    out = vagent("traces", str(trees), str(traces), "--env", "vigorl_zoom")
    tm = json.loads(out.stdout.strip().splitlines()[-1])
    assert tm["traces/chats"] >= 4 and tm["traces/backtrack"] >= 1 and tm["traces/env_failures"] == 0
    assert json.loads((tmp_path / "sft" / "traces.jsonl.summary.json").read_text()) == tm
    chats = read_chats(traces)  # the SFT recipe's own reader: format, images, placeholders
    assert len(chats) == tm["traces/chats"]
    replies = [m.text for c in chats for m in c.messages if m.role == "assistant"]
    assert any(BACKTRACK_MESSAGE in r for r in replies)
    assert all(parse_grounded(r, 224, 224, allow_tool=True).format_ok for r in replies)
    # errors: clear message, exit code 2
    bad = vagent("mcts", str(tmp_path / "x.jsonl"), "--policy", "gpt", ok=False)
    assert bad.returncode == 2 and "expected scripted, hf:DIR, openai:MODEL" in bad.stderr
    bad = vagent("traces", str(tmp_path / "none.jsonl"), str(tmp_path / "o.jsonl"), ok=False)
    assert bad.returncode == 2 and "vagent vigorl mcts" in bad.stderr


def test_preset_loads_and_its_documented_traces_match_the_rl_env(tmp_path):
    from vagent.runconfig import load_config

    path = ROOT / "configs" / "vigorl_zoom_grpo.yaml"
    cfg = load_config(path)
    assert cfg.recipe == "grpo" and cfg.rollout.group_size >= 2 and cfg.sft.data.endswith("traces_zoom.jsonl")
    (entry,) = cfg.envs
    env = make(entry.name, **entry.config)
    assert cfg.rollout.max_turns == env.config.max_zooms + 1 and cfg.model.tiny_image_size == env.config.image_size
    # the --config of the documented mcts command equals the RL env config
    comment = " ".join(line.lstrip("# ").rstrip("\\") for line in path.read_text().splitlines() if line.startswith("#"))
    documented = dict(kv.split("=") for kv in re.search(r"mcts .*?--config ((?:\S+=\S+ *)+)", comment).group(1).split())
    assert {k: int(v) for k, v in documented.items()} == entry.config
    # the traces made that way carry exactly the RL prompts
    tree = search(entry.name, dict(entry.config), 0, ScriptedSearchPolicy(), MCTSConfig(n_simulations=3))
    out = tmp_path / "t.jsonl"
    assert write_traces([tree], out)["traces/chats"] >= 1
    rec = json.loads(out.read_text().splitlines()[0])
    obs, _ = env.reset(0)
    assert rec["messages"][0]["content"] == env.system_prompt() and rec["messages"][1]["content"] == obs.text


@pytest.mark.slow
def test_mcts_with_a_tiny_vlm_through_hfpolicy(tmp_path):
    """A real model's policy: images encoded, replies sampled, tree deterministic; its chats encode
    with the same ChatEncoder the SFT recipe uses."""
    from vagent.models import build_tiny_vlm
    from vagent.recipes.sft import encode_chat
    from vagent.rollout.hf_policy import HFPolicy

    model_dir = build_tiny_vlm(tmp_path / "tiny", hidden=64, layers=1, image_size=56)
    policy = HFPolicy.from_pretrained(str(model_dir))
    env_config = {"canvas_size": 112, "image_size": 56}
    cfg = MCTSConfig(n_simulations=2, n_children=2, n_rollouts=1, max_thought_tokens=8, max_rollout_tokens=8)
    a = search("vigorl_search", env_config, 0, policy, cfg)
    b = search("vigorl_search", env_config, 0, policy, cfg)
    assert tree_fingerprint(a) == tree_fingerprint(b)
    assert len(a.nodes) >= 3 and a.policy_calls >= 2 and a.policy_errors == 0
    # linearise a scripted tree at this image size and encode its chats with the model's encoder
    scripted = search("vigorl_search", env_config, 0, ScriptedSearchPolicy(), MCTSConfig(n_simulations=3))
    out = tmp_path / "t.jsonl"
    write_traces([scripted], out, env_name="vigorl_zoom")
    for chat in read_chats(out):
        conv = encode_chat(chat, policy.encoder)
        sampled = [s for s in conv.segments if s.sampled]
        assert len(sampled) == sum(m.role == "assistant" for m in chat.messages)
        assert sum(s.n_images for s in conv.segments) == sum(len(m.images) for m in chat.messages)
