"""PrimitiveSkill on ManiSkill 3 (backend="maniskill", PhysX and lavapipe on the CPU): the
kinematic oracle's plan solves every offline task with the kinematic rewards, the same seed lays
out the same scene, the camera image shows the cubes where the state says and changes when one
moves, a bad skill changes nothing, drawer is refused with the download command, check_env passes,
the solver's replies predict the simulated outcome without changing the env, one SFT step on
solver demonstrations and one PPO step train, and the guides' ``.venv-maniskill`` commands run
as written.

Needs scripts/maniskill-env; run with .venv-maniskill/bin/python. Skipped where ManiSkill or a
Vulkan device is missing, failing instead when VAGENT_REQUIRE_MANISKILL=1 (CI). One ManiSkill env
per task for the whole module (the first render in a process compiles lavapipe's pipelines).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vagent.config import ConfigError
from vagent.envs import make
from vagent.envs.checker import check_env
from vagent.envs.formats import render_response
from vagent.envs.primitive_skill import Bounds

pytestmark = pytest.mark.maniskill
OFFLINE_TASKS = ("align", "place", "stack")


def _require() -> None:
    from vagent.envs.primitive_skill.tabletop import unavailable_reason

    why = unavailable_reason()
    if why is None:
        return
    if os.environ.get("VAGENT_REQUIRE_MANISKILL") == "1":
        pytest.fail(f"VAGENT_REQUIRE_MANISKILL=1 but backend='maniskill' cannot run: {why}")
    pytest.skip(f"ManiSkill backend unavailable (run scripts/maniskill-env, then .venv-maniskill/bin/python -m pytest): "
                f"{why[:200]}")


@pytest.fixture(scope="module")
def ms_envs():
    """task -> one ManiSkill-backed env (vision, 128 px), made on first use and shared by the module."""
    _require()
    envs: dict[str, object] = {}

    def get(task: str):
        if task not in envs:
            envs[task] = make("primitive_skill", task=task, backend="maniskill", render="vision")
        return envs[task]

    yield get
    for env in envs.values():
        env.close()


def reply(actions) -> str:
    return render_response("grounding_worldmodeling", {"think": "t", "observation": "o", "reasoning": "r",
                                                       "prediction": "p", "answer": "|".join(actions)})


def play(env, seed: int, plan: list[str]) -> tuple[list[float], list[int], dict]:
    """Play ``plan`` two skills a turn from reset(seed); rewards, stages and the last info."""
    env.reset(seed)
    rewards, stages, info = [], [], {}
    for i in range(0, len(plan), 2):
        res = env.step(reply(plan[i:i + 2]))
        rewards.append(round(res.reward, 6))
        stages.append(res.info["stage"])
        info = res.info
        assert res.info["action_is_valid"], res.obs.text.splitlines()[0]
        if res.terminated or res.truncated:
            break
    return rewards, stages, info


@pytest.mark.parametrize("task", OFFLINE_TASKS)
def test_the_kinematic_oracle_plan_solves_the_maniskill_scene_with_the_same_rewards(ms_envs, task):
    env = ms_envs(task)
    kin = make("primitive_skill", task=task, render="vision")
    for seed in (0, 1):
        # same seed, same layout: positions as built (the cubes settle by well under 1 mm), same targets
        kin.reset(seed)
        env.reset(seed)
        ks, ms = kin.state(), env.state()
        assert ms["targets"] == ks["targets"]
        for name, obj in ks["objects"].items():
            assert np.allclose(ms["objects"][name]["position"], obj["position"], atol=1.0), (name, seed)
            assert ms["objects"][name]["on"] == obj["on"] == "table"
        plan = kin.optimal_actions()
        assert env.optimal_actions() == plan
        k_rewards, k_stages, _ = play(kin, seed, plan)
        m_rewards, m_stages, info = play(env, seed, plan)
        assert info["success"], (task, seed, env.state())
        assert m_rewards == k_rewards and m_stages == k_stages


def _patch(img: np.ndarray, uv: tuple[float, float]) -> np.ndarray:
    u, v = int(round(uv[0])), int(round(uv[1]))
    return img[v - 1:v + 2, u - 1:u + 2].reshape(-1, 3).astype(float).mean(0)


def _colour_class(rgb: np.ndarray) -> str:
    """What a rendered pixel shows: the lit cube tops are pinkish red, mint green and lilac; the
    table is orange wood (blue well below green)."""
    r, g, b = rgb
    if g > r + 40 and g > b + 30:
        return "green_cube"
    if b > g + 40 and r > g + 30:
        return "purple_cube"
    if r > g + 60 and abs(g - b) < 25:
        return "red_cube"
    if r > g > b + 20:
        return "table"
    return "other"


def _project(env, p_mm) -> tuple[float, float]:
    cam = env._backend.camera_params()
    c = cam["extrinsic_cv"] @ np.r_[np.asarray(p_mm, dtype=float) / 1000.0, 1.0]
    u = cam["intrinsic_cv"] @ c
    return u[0] / u[2], u[1] / u[2]


def test_the_image_shows_the_cubes_where_the_state_says_and_changes_when_one_moves(ms_envs):
    env = ms_envs("stack")
    obs, _ = env.reset(0)
    before = np.asarray(obs.images[0])
    assert before.shape == (128, 128, 3)
    state = env.state()
    tops = {n: (o["position"][0], o["position"][1], o["position"][2] + 20) for n, o in state["objects"].items()}
    for name, top in tops.items():
        assert _colour_class(_patch(before, _project(env, top))) == name, (name, _patch(before, _project(env, top)))
    red_was = tops["red_cube"]
    assert _colour_class(_patch(before, _project(env, (red_was[0], red_was[1], 0)))) == "red_cube"
    # red onto green: where red stood is table now; the stack's top shows red, nearer the camera
    res = env.step(reply(env.optimal_actions()[:2]))
    assert res.info["action_is_valid"] and env.state()["objects"]["red_cube"]["on"] == "green_cube"
    after = np.asarray(res.obs.images[0])
    assert np.abs(after.astype(int) - before.astype(int)).max() > 100
    assert _colour_class(_patch(after, _project(env, (red_was[0], red_was[1], 0)))) == "table"
    red = env.state()["objects"]["red_cube"]["position"]
    assert _colour_class(_patch(after, _project(env, (red[0], red[1], red[2] + 20)))) == "red_cube"
    # the projection is where the cube is: 10 px to either side of a cube's centre is table
    green = tops["green_cube"]
    u, v = _project(env, green)
    for du in (-12, 12):
        assert _colour_class(_patch(before, (u + du, v))) == "table"


def test_a_bad_skill_gets_the_feedback_line_and_changes_nothing(ms_envs):
    env = ms_envs("stack")
    obs, _ = env.reset(1)
    state, image = env.state(), np.asarray(obs.images[0]).copy()
    qpos = env._backend._qpos().copy()
    for bad, why in (("pick(500, 0, 20)", "x=500 is outside the workspace"),
                     ("place(0, 0, 20)", "the gripper is empty"),
                     ("pick(0, 0, 20)", "no object to grasp at (0, 0, 20)")):
        res = env.step(reply([bad]))
        first = res.obs.text.splitlines()[0]
        assert first.startswith(f"Last reply: executed nothing. {bad} failed: ") and why in first, first
        assert not res.info["action_is_valid"] and why in res.info["skill_error"]
        assert env.state() == state
        assert np.array_equal(np.asarray(res.obs.images[0]), image)
        assert np.array_equal(env._backend._qpos(), qpos)
    # every workspace point is reachable, so a failed motion plan needs a wider workspace: with the
    # table stretched to x = 900 mm the rules accept place(800, 0, 20), the arm cannot get there, the
    # feedback says so and nothing moves
    backend = env._backend
    res = env.step(reply([env.optimal_actions()[0]]))
    assert res.info["action_is_valid"] and res.info["held_object"] == "red_cube"
    held, qpos = env.state(), backend._qpos().copy()
    wide = Bounds(x=(-100.0, 900.0))
    backend.bounds, backend._scene_cache = wide, None
    try:
        res = env.step(reply(["place(800, 0, 20)"]))
    finally:
        backend.bounds, backend._scene_cache = Bounds(), None
    first = res.obs.text.splitlines()[0]
    assert first.startswith("Last reply: executed nothing. place(800, 0, 20) failed: no motion plan: "), first
    assert "no inverse-kinematics solution at (" in first or "the arm would have to jump near (" in first, first
    assert not res.info["action_is_valid"] and env.state() == held
    assert np.array_equal(backend._qpos(), qpos)


def test_drawer_is_refused_at_make_with_the_download_command(ms_envs, tmp_path, monkeypatch):
    import mani_skill

    monkeypatch.setattr(mani_skill, "ASSET_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"python -m mani_skill.utils.download_asset partnet_mobility_cabinet -y"
                                          r".*download_asset ycb -y"):
        make("primitive_skill", task="drawer", backend="maniskill")


def test_check_env_passes_on_the_maniskill_backend(ms_envs):
    report = check_env(lambda: make("primitive_skill", task="place", backend="maniskill", max_steps=3, image_size=64),
                       seeds=(0, 1), n_steps=2, check_subprocess=False)
    assert {"determinism on one instance (seeds [0, 1])", "determinism across instances"} <= set(report.checks)


def test_the_solver_predicts_the_simulated_state_and_leaves_the_env_unchanged(ms_envs):
    """The solver's <prediction> is the state after its actions on the simulator (found from a
    saved simulator state that is put back: ManiSkill cannot be deep-copied), within 3 mm of the
    step that follows (PhysX's contact caches are not part of the saved state, so the step replays
    the motion with small differences: 1.0 mm measured on stack seed 0); ``state()`` is unchanged
    by the prediction."""
    from vagent.envs.formats import parse_response
    from vagent.rollout.scripted import solver_reply

    env = ms_envs("stack")
    env.reset(0)
    for _ in range(3):
        before = env.state()
        reply = solver_reply(env)
        assert env.state() == before
        predicted = json.loads(parse_response(reply, env.config.format, "|", 2).prediction)
        res = env.step(reply)
        actual = env.state()
        assert predicted["holding"] == actual["gripper"]["holding"]
        for name, pos in predicted.items():
            if name == "holding":
                continue
            true = actual["gripper"]["position"] if name == "gripper" else next(
                r["position"] for r in actual["relations"] if r["object"] == name)
            assert max(abs(a - b) for a, b in zip(pos, true)) < 3.0, (name, pos, true)
        if res.terminated:
            break
    assert res.terminated and res.info["success"]


ROOT = Path(__file__).resolve().parents[2]
GUIDES = ("README.md", "docs/envs_primitive_skill.md")


def guide_commands() -> list[tuple[str, str]]:
    """(guide, command) for each line of a fenced bash block that runs ``.venv-maniskill/bin/vagent``
    (the user commands of the ManiSkill backend; the test commands are this file)."""
    out = []
    for guide in GUIDES:
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / guide).read_text(), re.S):
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith(".venv-maniskill/bin/vagent "):
                    out.append((guide, line))
    return out


def test_the_guides_name_maniskill_user_commands():
    cmds = guide_commands()
    assert {g for g, _ in cmds} == set(GUIDES), cmds
    assert any("--policy solver" in c for _, c in cmds) and any(" demos " in c for _, c in cmds)


@pytest.mark.parametrize("guide,command", guide_commands())
def test_the_guides_maniskill_commands_run_as_written(ms_envs, tmp_path, guide, command):
    """Each command as written, from a folder where .venv-maniskill is this checkout's."""
    import sys

    (tmp_path / ".venv-maniskill").symlink_to(Path(sys.executable).parent.parent)
    out = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, f"{guide}: `{command}` exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    if "--policy solver" in command:
        assert "success=True" in out.stdout, out.stdout[-2000:]
    if " demos " in command:
        assert "wrote 1 demonstrations" in out.stdout, out.stdout[-1000:]


def test_one_sft_step_on_solver_demos_and_one_ppo_step_train_on_the_maniskill_backend(ms_envs, tmp_path):
    import torch

    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.runconfig import load_config
    from vagent.recipes.run import train
    from vagent.runs import read_metrics

    model = build_tiny_vlm(tmp_path / "tiny-vlm", hidden=64, layers=2, image_size=64)
    cfg = load_config(None, [
        "steps=1", "val.every=0", "threads=1", "model.cache_dir=UNUSED", f"model.path={model}",
        f"out_dir={tmp_path / 'runs'}", "envs.0.name=primitive_skill", "envs.0.n_train=1", "envs.0.n_val=1",
        "envs.0.config={task: stack, backend: maniskill, image_size: 64}", "rollout.max_turns=2",
        "sft.steps=1", "sft.demos_per_env=1", "sft.batch_size=1", "sft.max_turns=2",
        "rollout.max_new_tokens=12", "update.epochs=1", "update.mini_batches=1", "update.warmup_steps=0",
        "ppo.critic_warmup_steps=0", "log.tensorboard=false", "log.progress=false", "log.checkpoint_every=1",
        "log.plot_every=0", "log.plots=false"])
    initial = {k: v.clone() for k, v in load_policy(model).model.state_dict().items()}
    run = train(cfg, quiet=True)
    rec = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rec) == 1 and rec[0]["rollout/episodes"] == 1
    for key in ("loss/policy", "loss/value", "actor/grad_norm"):
        assert math.isfinite(rec[0][key]), key
    policy = torch.load(run / "checkpoints" / "step_000001" / "policy.pt", weights_only=True)
    assert any(not torch.equal(v, initial[k]) for k, v in policy.items()), "no policy parameter changed"
