"""PrimitiveSkill: the kinematic tabletop's skills, the four tasks with their oracle and stage
rewards (hand-derived), parsing, judging, rendering, determinism and the checker."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vagent.config import ConfigError
from vagent.envs import make
from vagent.envs.checker import check_env
from vagent.envs.formats import _STYLE_TEXT, format_reminder, render_response
from vagent.envs.primitive_skill import (
    Body, Bounds, Drawer, PrimitiveSkillEnv, Scene, Skill, Target, TaskParams, Tolerances, describe_state, get_task,
    parse_primitive_response, parse_skill, render_scene,
)
from vagent.envs.primitive_skill.sim import CARRY_Z, DRAWER, TABLE
from vagent.envs.primitive_skill.tasks import COLORS, CUBE_HALF
from vagent.rewards.rule import rule_score
from vagent.rollout.scripted import solver_reply

GW = "grounding_worldmodeling"


def reply(actions, fmt: str = GW) -> str:
    answer = actions if isinstance(actions, str) else "|".join(actions)
    return render_response(fmt, {"think": "t", "observation": "o", "reasoning": "r", "prediction": "p",
                                 "answer": answer})


def cube(name: str, x: float, y: float, z: float = 20.0, support: str = TABLE) -> Body:
    return Body(name, "cube", COLORS[name], CUBE_HALF, (x, y, z), support)


def scene(*bodies: Body, **kw) -> Scene:
    return Scene({b.name: b for b in bodies}, **kw)


def play_oracle(env, seed: int, per_turn: int | None = None) -> tuple[list[float], list[int], list[dict]]:
    env.reset(seed)
    rewards, stages, infos = [], [], []
    for _ in range(env.config.max_steps):
        actions = env.optimal_actions()[: per_turn or env.config.max_actions_per_turn]
        res = env.step(reply(actions))
        rewards.append(round(res.reward, 6))
        stages.append(res.info["stage"])
        infos.append(res.info)
        if res.terminated or res.truncated:
            break
    return rewards, stages, infos


# ---------------------------------------------------------------------------------------------
# The oracle solves every task with the hand-derived stage rewards
# ---------------------------------------------------------------------------------------------

# paper preset, one skill per turn: reward = progress(after) - progress(before) - 0.1 per skill + 0.1 format,
# progress = 2 * stages (VAGEN's (max stage + 1) * 2) and 10 once solved.
PAPER_ONE_SKILL = {
    # push red onto x=0 (stage "a cube aligned": 0 -> 2), push green (2 -> 10)
    "align": ([2.0, 8.0], [1, 2]),
    # pick red (2), place on left target (4), pick green (6), place (10)
    "place": ([2.0, 2.0, 2.0, 4.0], [1, 2, 3, 4]),
    # pick red (2), red on green (4), pick purple (6), purple on red (10)
    "stack": ([2.0, 2.0, 2.0, 4.0], [1, 2, 3, 4]),
    # pull the drawer open (2), pick the apple (4), put it in (10)
    "drawer": ([2.0, 2.0, 6.0], [1, 2, 3]),
}


@pytest.mark.parametrize("task", sorted(PAPER_ONE_SKILL))
def test_oracle_solves_each_task_with_the_hand_derived_stage_rewards(task):
    env = make("primitive_skill", task=task, rewards="paper", max_actions_per_turn=1)
    want_rewards, want_stages = PAPER_ONE_SKILL[task]
    for seed in range(6):
        rewards, stages, infos = play_oracle(env, seed)
        assert rewards == want_rewards, (seed, [i["executed_actions"] for i in infos])
        assert stages == want_stages
        assert infos[-1]["success"] and all(i["action_is_valid"] and i["n_valid_actions"] == 1 for i in infos)
        assert env.optimal_actions() == []
        assert sum(rewards) == pytest.approx(10.0)  # one skill a turn: the 0.1 format bonus pays its 0.1 cost


def test_drawer_close_variant_and_two_skills_per_turn_and_lite_preset():
    # drawer_close adds the stage "apple in the drawer": pull (2), pick (4), put in (6), push closed (10)
    env = make("primitive_skill", task="drawer", drawer_close=True, rewards="paper", max_actions_per_turn=1)
    rewards, stages, infos = play_oracle(env, 3)
    assert rewards == [2.0, 2.0, 2.0, 4.0] and stages == [1, 2, 3, 4]
    assert env.state()["drawer"]["open_mm"] == 0 and env.state()["objects"]["apple"]["on"] == DRAWER
    # two skills a turn (the default): place = pick+place red (0 -> 4), pick+place green (4 -> 10), 2 skills cost 0.2
    env = make("primitive_skill", task="place", rewards="paper")
    assert play_oracle(env, 0)[0] == [3.9, 5.9]
    # align: both pushes in one turn: 10 - 0.2 + 0.1
    assert play_oracle(make("primitive_skill", task="align", rewards="paper"), 1)[0] == [9.9]
    # lite: stage 0.2, success 1, format 0.1, no action cost
    env = make("primitive_skill", task="stack", max_actions_per_turn=1)
    assert play_oracle(env, 2)[0] == [0.3, 0.3, 0.3, 0.5]


@pytest.mark.parametrize("task", ["align", "place", "stack", "drawer"])
def test_solver_policy_solves_every_task_and_its_predictions_are_exact(task):
    env = make("primitive_skill", task=task, drawer_close=(task == "drawer"), format=GW)
    spec = PrimitiveSkillEnv.judge_spec
    for seed in range(10, 16):
        env.reset(seed)
        for _ in range(env.config.max_steps):
            text = solver_reply(env)
            prediction = text.split("<prediction>")[1].split("</prediction>")[0]
            res = env.step(text)
            assert res.info["action_is_valid"], res.info["skill_error"]
            assert rule_score(prediction, env.state(), spec).score == 1.0
            if res.terminated:
                break
        assert res.info["success"], (task, seed)


def test_solver_policy_rollout_solves_all_tasks_with_one_turn_per_two_skills():
    from vagent.rollout import EnvSpec, SamplingConfig, SolverPolicy, rollout

    specs = [EnvSpec("primitive_skill", {"task": task, "rewards": "paper"}, seed)
             for task in ("align", "place", "stack", "drawer") for seed in (0, 1)]
    eps = rollout(specs, SolverPolicy(), SamplingConfig(max_new_tokens=32), max_turns=10)
    m = eps.metrics
    assert m["rollout/success_rate"] == 1.0 and m["rollout/action_valid_rate"] == 1.0 and m["rollout/errors"] == 0
    # align: 2 pushes in 1 turn; place/stack: 4 skills in 2 turns; drawer: 3 skills in 2 turns
    assert [len(e.turns) for e in eps] == [1, 1, 2, 2, 2, 2, 2, 2]
    for e in eps:  # paper: 10 for success - 0.1 per skill + 0.1 format per turn
        n_skills = sum(t.info["n_valid_actions"] for t in e.turns)
        assert e.total_reward == pytest.approx(10 - 0.1 * n_skills + 0.1 * len(e.turns))
        for t in e.turns:
            assert t.parsed.observation == describe_state(t.state_before, "structured")
            assert t.parsed.prediction == describe_state(t.state_after, "structured")


def test_oracle_recovers_from_tangled_states():
    env = make("primitive_skill", task="stack", max_actions_per_turn=1)
    env.reset(0)
    s = env._backend.scene()
    # the agent stacked green on purple and holds red: the oracle must untangle and still finish
    g, p = s.bodies["green_cube"], s.bodies["purple_cube"]
    assert s.apply(Skill("pick", g.pos)).ok and s.apply(Skill("place", (p.pos[0], p.pos[1], 60))).ok
    assert s.apply(Skill("pick", s.bodies["red_cube"].pos)).ok
    env.config.max_actions_per_turn = 2
    for _ in range(10):
        res = env.step(reply(env.optimal_actions()[:2]))
        assert res.info["action_is_valid"], res.info["skill_error"]
        if res.terminated:
            break
    assert res.info["success"]
    # align: a cube held and the other stacked on a third spot
    env = make("primitive_skill", task="align", max_actions_per_turn=2)
    env.reset(4)
    s = env._backend.scene()
    r, g = s.bodies["red_cube"], s.bodies["green_cube"]
    assert s.apply(Skill("pick", g.pos)).ok and s.apply(Skill("place", (r.pos[0], r.pos[1], 60))).ok
    assert env.optimal_actions()[0].startswith("pick(")  # take green off red first
    for _ in range(3):
        res = env.step(reply(env.optimal_actions()[:2]))
        if res.terminated:
            break
    assert res.info["success"]


def _random_skill(s: Scene, rng: np.random.Generator, plan: list[Skill]) -> Skill:
    """A plausible skill: pick an object, place on another or anywhere, an oracle step, or a push."""
    names = list(s.bodies)
    b = s.bodies[names[int(rng.integers(len(names)))]]
    r = rng.random()
    if r < 0.3:
        return Skill("pick", b.pos)
    if r < 0.6:
        if rng.random() < 0.5:
            return Skill("place", (b.pos[0], b.pos[1], 150))
        return Skill("place", (float(rng.integers(-80, 130)), float(rng.integers(-180, 180)), 150))
    if r < 0.8 and plan:
        return plan[0]
    if s.drawer is not None and rng.random() < 0.5:
        h = s.drawer.handle
        return Skill("push", (*h, h[0] + float(rng.integers(-120, 120)), h[1], h[2]))
    dx, dy = [(1, 0), (-1, 0), (0, 1), (0, -1)][int(rng.integers(4))]
    p1 = (b.pos[0] - dx * (b.half[0] + 5), b.pos[1] - dy * (b.half[1] + 5), b.pos[2])
    d = float(rng.integers(10, 120))
    return Skill("push", (*p1, p1[0] + dx * d, p1[1] + dy * d, p1[2]))


@pytest.mark.parametrize("task, close", [("align", False), ("place", False), ("stack", False), ("drawer", False),
                                         ("drawer", True)])
def test_oracle_replanning_from_random_states_never_grows_and_always_succeeds(task, close):
    """From states reached by random skills, re-planning after each oracle step shortens the plan
    by one (the oracle never undoes its own plan) and reaches success."""
    t, p = get_task(task), TaskParams(drawer_close=close)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        s = t.build(np.random.default_rng(seed + 1000), Bounds(), Tolerances())
        for _ in range(int(rng.integers(0, 12))):
            s.apply(_random_skill(s, rng, t.plan(s, p)))
        plan = t.plan(s, p)
        while plan:
            assert s.apply(plan[0]).ok
            nxt = t.plan(s, p)
            assert len(nxt) <= len(plan) - 1, (seed, [k.text() for k in plan], [k.text() for k in nxt])
            plan = nxt
        assert t.success(s, p), seed


# ---------------------------------------------------------------------------------------------
# Skills of the simulator (hand-built scenes)
# ---------------------------------------------------------------------------------------------

def test_push_slides_the_object_by_the_part_of_the_segment_after_contact():
    s = scene(cube("red_cube", 100, 0), cube("green_cube", 0, 120))
    # the gripper starts 5 mm from the red cube's +x face (x=120) and moves 75 mm: the cube moves 70 mm
    res = s.apply(Skill("push", (125, 0, 20, 50, 0, 20)))
    assert res.ok and res.changed and s.bodies["red_cube"].pos == (30, 0, 20) and s.gripper == (50, 0, 20)
    # a diagonal push from the -y side: contact after 10 mm of a 50 mm move along y (x drifts along)
    res = s.apply(Skill("push", (30, -30, 20, 40, 20, 20)))
    assert res.ok and s.bodies["red_cube"].pos == pytest.approx((30 + 0.8 * 10, 0.8 * 50, 20))


@pytest.mark.parametrize("skill, why", [
    (Skill("push", (160, 0, 20, 100, 0, 20)), "out of reach"),               # x > 150
    (Skill("push", (150, 0, 20, 100, 0, 20)), "starts 30 mm from the red_cube"),
    (Skill("push", (125, 0, 50, 50, 0, 50)), "touched nothing"),            # above the cube's top
    (Skill("push", (110, 0, 20, 50, 0, 20)), "starts inside the red_cube"),
    (Skill("push", (125, 0, 20, -50, 0, 20)), "would hit the green_cube"),  # green stands in the way
    (Skill("push", (100, -25, 20, 100, 190, 20)), "pushed off the table"),
])
def test_push_failures_change_nothing(skill, why):
    s = scene(cube("red_cube", 100, 0), cube("green_cube", 20, 10))
    before = s.copy()
    res = s.apply(skill)
    assert not res.ok and why in res.message
    assert s == before


def test_pick_and_place_rules():
    s = scene(cube("red_cube", 100, 0), cube("green_cube", 0, 100), cube("purple_cube", -50, -100))
    before = s.copy()
    for skill, why in [
        (Skill("place", (0, 0, 20)), "gripper is empty"),
        (Skill("pick", (0, 0, 20)), "no object to grasp"),
        (Skill("pick", (100, 16, 20)), "no object to grasp"),        # 16 mm > grasp tolerance 15
        (Skill("pick", (100, 0, 80)), "no object to grasp"),         # above top + 15
        (Skill("pick", (100, 0, 250)), "out of reach"),
    ]:
        res = s.apply(skill)
        assert not res.ok and why in res.message, (skill, res)
        assert s == before
    assert s.apply(Skill("pick", (110, -10, 55))).ok                 # within the tolerances
    assert s.held == "red_cube" and s.bodies["red_cube"].pos == (100, 0, CARRY_Z)
    assert "already holds" in s.apply(Skill("pick", (0, 100, 20))).message
    assert "holds the red_cube" in s.apply(Skill("push", (25, 100, 20, 0, 100, 20))).message
    assert "stick out of the table" in s.apply(Skill("place", (140, 0, 20))).message
    assert "off-centre" in s.apply(Skill("place", (25, 100, 60))).message   # 25 mm > stack tolerance 20
    assert "too low" in s.apply(Skill("place", (12, 91, 44))).message       # rests at 60, 44 < 60 - 15
    res = s.apply(Skill("place", (12, 91, 45)))                             # snaps onto the green cube's centre
    assert res.ok and s.bodies["red_cube"].pos == (0, 100, 60) and s.bodies["red_cube"].support == "green_cube"
    assert "red_cube is on top of it" in s.apply(Skill("pick", (0, 100, 20))).message
    assert s.apply(Skill("pick", (0, 100, 60))).ok                          # the top one is nearest in z
    assert s.apply(Skill("place", (-50, -100, 200))).ok                     # dropped from high onto purple
    assert s.bodies["red_cube"].pos == (-50, -100, 60)
    # pushing the purple cube carries the red one on it
    assert s.apply(Skill("push", (-50, -125, 20, -50, -75, 20))).ok      # 5 mm gap, then 45 mm
    assert s.bodies["purple_cube"].pos == (-50, -55, 20) and s.bodies["red_cube"].pos == (-50, -55, 60)
    assert "does not stand on the table" in s.apply(Skill("push", (-50, -30, 60, -50, -60, 60))).message


def test_drawer_pull_place_close_and_collisions():
    apple = Body("apple", "apple", COLORS["apple"], (30, 30, 30), (-50, -120, 30))
    s = Scene({"apple": apple}, drawer=Drawer(front_x=40, y=60))
    assert s.apply(Skill("pick", apple.pos)).ok
    assert "hit the cabinet" in s.apply(Skill("place", (95, 60, 100))).message   # onto the closed cabinet
    assert "place it before pushing" in s.apply(Skill("push", (25, 60, 60, -75, 60, 60))).message
    assert s.apply(Skill("place", (-20, 60, 30))).ok                             # in front of the drawer
    res = s.apply(Skill("push", (25, 60, 60, -75, 60, 60)))
    assert not res.ok and "drawer would hit the apple" in res.message and s.drawer.open == 0
    assert s.apply(Skill("pick", (-20, 60, 30))).ok and s.apply(Skill("place", (-50, -120, 30))).ok
    # the handle is at x = 40 - 15 = 25; dragging it 150 mm towards the robot opens the drawer fully (100)
    res = s.apply(Skill("push", (30, 55, 55, -120 + 30, 55, 55)))
    assert res.ok and s.drawer.open == 100 and s.drawer.handle == (-75, 60, 60)
    assert s.apply(Skill("pick", (-50, -120, 30))).ok
    assert "drawer walls" in s.apply(Skill("place", (-40, 60, 45))).message       # footprint over the front wall
    assert s.apply(Skill("place", (-6, 60, 45))).ok
    assert s.bodies["apple"].support == DRAWER and s.bodies["apple"].pos == (-6, 60, 45)
    # closing moves the apple in with the drawer; then it cannot be picked
    assert s.apply(Skill("push", (-75, 60, 60, 50, 60, 60))).ok and s.drawer.open == 0
    assert s.bodies["apple"].pos == (94, 60, 45)
    assert "inside the cabinet" in s.apply(Skill("pick", (94, 60, 45))).message
    assert "did not move" in s.apply(Skill("push", (25, 60, 60, 60, 60, 60))).message


# ---------------------------------------------------------------------------------------------
# Replies through the env: invalid skills fail cleanly with feedback
# ---------------------------------------------------------------------------------------------

def test_invalid_skills_fail_cleanly_with_feedback():
    env = make("primitive_skill", task="stack", rewards="paper", max_actions_per_turn=3, render="text")
    env.reset(0)
    red = env.state()["objects"]["red_cube"]["position"]
    before = env.state()
    res = env.step(reply("pick(500, 0, 20)|pick(1, 2, 3)"))
    assert not res.info["action_is_valid"] and res.info["n_valid_actions"] == 0 and res.reward == 0.0
    assert "out of reach" in res.info["skill_error"] and "x=500 is outside the workspace" in res.obs.text
    assert "execution stopped there" in res.obs.text and env.state() == before
    res = env.step(reply("place(0, 0, 20)"))
    assert "gripper is empty" in res.info["skill_error"] and res.info["format_ok"] and res.reward == 0.0
    # pick red (stage 1: +2 - 0.1 + format 0.1), then a failing pick stops the turn before the place
    res = env.step(reply(f"pick({red[0]}, {red[1]}, 20)|pick(0, 0, 20)|place(0, 0, 20)"))
    assert res.info["executed_actions"] == [f"pick({red[0]}, {red[1]}, 20)"] and res.info["held_object"] == "red_cube"
    assert "already holds the red_cube" in res.info["skill_error"] and res.reward == pytest.approx(2.0)
    assert not res.info["action_is_valid"] and res.info["action_is_effective"]
    res = env.step(reply("jump(1,2,3)|place(0, 0, 20)"))
    assert res.info["n_valid_actions"] == 0 and "unknown skill 'jump'" in res.info["skill_error"]
    assert "Invalid action" in res.obs.text
    res = env.step("<answer>pick(1,2,3)")  # broken format: nothing runs
    assert not res.info["format_ok"] and "format error" in res.obs.text and res.info["n_valid_actions"] == 0
    assert env.state()["gripper"]["holding"] == "red_cube"


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

def test_parse_skills_and_garbage():
    ps = parse_primitive_response("<answer>pick(1,2,3)|place(4,5,6)</answer>", "no_think", 2)
    assert ps.all_valid and ps.skills == (Skill("pick", (1, 2, 3)), Skill("place", (4, 5, 6)))
    ps = parse_primitive_response("<answer> PICK ( 1 , -2.5 , +3 ) | push(0,0,20,.5,-1.,20) </answer>", "no_think", 2)
    assert ps.skills == (Skill("pick", (1, -2.5, 3)), Skill("push", (0, 0, 20, 0.5, -1, 20)))
    ps = parse_primitive_response("<answer>pick(1,2,3)|place(4,5,6)|push(1,2,3,4,5,6)</answer>", "no_think", 2)
    assert len(ps.skills) == 2 and ps.parsed.n_dropped_actions == 1
    ps = parse_primitive_response("<answer>pick(1,2,3)|jump|place(4,5,6)</answer>", "no_think", 3)
    assert ps.skills == (Skill("pick", (1, 2, 3)),) and ps.invalid == "jump" and not ps.all_valid
    for bad, why in [("pick(1,2)", "takes 3 coordinates, got 2"), ("push(1,2,3)", "takes 6 coordinates"),
                     ("pik(1,2,3)", "did you mean pick"), ("pick(a,2,3)", "'a'"), ("pick(1,2,3", "not a skill call"),
                     ("pick(nan,2,3)", "not a number"), ("pick(1e3,2,3)", "not a number"), ("pick()", "got 0"),
                     ("pick 1 2 3", "not a skill call"), ("pick(1,,3)", "'' in")]:
        out = parse_skill(bad)
        assert isinstance(out, str) and why in out, (bad, out)
    ps = parse_primitive_response("<think>x</think><answer>pick(1,2,3)</answer>", "no_think", 2)
    assert not ps.parsed.format_ok and ps.skills == ()


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_raises(text):
    for t in (text, f"<answer>{text}</answer>"):
        ps = parse_primitive_response(t, "no_think", 2)
        assert len(ps.skills) <= 2 and (ps.invalid is None) == (ps.invalid_reason is None)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["pick", "place", "push"]),
       st.lists(st.integers(-3000, 3000), min_size=6, max_size=6))
def test_skill_text_round_trips(name, tenths):
    args = tuple(v / 10 for v in tenths[: {"pick": 3, "place": 3, "push": 6}[name]])
    skill = Skill(name, args)
    assert parse_skill(skill.text()) == skill


# ---------------------------------------------------------------------------------------------
# State, descriptions and the rule judge
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["align", "place", "stack", "drawer"])
def test_descriptions_score_one_and_wrong_coordinates_score_less(task):
    env = make("primitive_skill", task=task, max_actions_per_turn=1)
    spec = PrimitiveSkillEnv.judge_spec
    env.reset(7)
    for _ in range(5):
        state = env.state()
        json.dumps(state)
        for style in ("structured", "natural", "symbolic"):
            text = describe_state(state, style)
            assert rule_score(text, state, spec).score == 1.0, (style, text)
        wrong = json.loads(describe_state(state, "structured"))
        first = state["relations"][0]["object"]
        wrong[first] = [v + 30 for v in wrong[first]]  # 52 mm off: outside the 10 mm tolerance
        assert rule_score(json.dumps(wrong), state, spec).score < 1.0
        actions = env.optimal_actions()[:1]
        if not actions or env.step(reply(actions)).terminated:
            break
    structured = json.loads(describe_state(state, "structured"))
    assert set(structured) == {r["object"] for r in state["relations"]} | {"gripper", "holding"}


def test_observation_text_lists_coordinates_and_prompt_uses_coordinate_style():
    env = make("primitive_skill", task="place", render="text")
    obs, info = env.reset(1)
    state = env.state()
    assert not obs.images and "<image>" not in obs.text
    for name, o in state["objects"].items():
        assert f"{name} ({', '.join(str(v) for v in o['position'])})" in obs.text
    for name, p in state["targets"].items():
        assert f"{name} ({', '.join(str(v) for v in p)})" in obs.text
    prompt = env.system_prompt()
    assert "relative to you" not in prompt and "relative to you" not in obs.text
    assert '{"red_cube": [52, -80, 20]}' in obs.text and "pick(" in prompt and "<answer>" in prompt
    # the additive style_text of formats.format_reminder replaces only the description sentence
    base = format_reminder(GW, "structured", "|", 2)
    mine = format_reminder(GW, "structured", "|", 2, style_text="Write coordinates.")
    assert _STYLE_TEXT["structured"] in base and mine == base.replace(_STYLE_TEXT["structured"], "Write coordinates.")


# ---------------------------------------------------------------------------------------------
# Rendering, determinism, config, the checker, the ManiSkill backend
# ---------------------------------------------------------------------------------------------

def _red_pixels(img) -> np.ndarray:
    a = np.asarray(img).astype(int)
    return np.argwhere((a[..., 0] > 180) & (a[..., 1] < 80) & (a[..., 2] < 80))


def test_render_is_top_down_with_x_up_and_y_left_and_raised_objects_bigger():
    s = scene(cube("red_cube", 120, 150))  # far (x up) and to the robot's left (y left)
    img = render_scene(s, 128)
    assert img.size == (128, 128) and img.mode == "RGB"
    rows, cols = _red_pixels(img).T
    assert rows.mean() < 64 and cols.mean() < 64
    on_table = len(rows)
    s.apply(Skill("pick", (120, 150, 20)))
    assert len(_red_pixels(render_scene(s, 128))) > on_table  # held: drawn larger
    assert render_scene(s, 128).tobytes() == render_scene(s.copy(), 128).tobytes()


def test_same_seed_same_episode_different_seeds_differ():
    a, b = make("primitive_skill", task="drawer"), make("primitive_skill", task="drawer")
    oa, _ = a.reset(5)
    ob, _ = b.reset(5)
    assert oa.text == ob.text and oa.images[0].tobytes() == ob.images[0].tobytes() and a.state() == b.state()
    assert len({json.dumps(a.reset(s)[0].text) for s in range(8)}) == 8


def test_config_errors_say_how_to_fix():
    with pytest.raises(ConfigError, match="Did you mean 'stack'"):
        make("primitive_skill", task="stak")
    with pytest.raises(ConfigError, match="backend: expected one of kinematic, maniskill"):
        make("primitive_skill", backend="mujoco")
    with pytest.raises(ConfigError, match="grasp_tolerance"):
        make("primitive_skill", grasp_tolerance=0)


@pytest.mark.parametrize("task", ["place", "stack", "drawer"])
def test_checker_passes_for_every_task(task):
    check_env(lambda: make("primitive_skill", task=task, format="free_think", description_style="natural"),
              check_subprocess=False)


def test_checker_passes_in_a_fresh_process_for_the_drawer_close_variant():
    report = check_env(lambda: make("primitive_skill", task="drawer", drawer_close=True, render="text",
                                    description_style="symbolic"))
    assert "determinism in a fresh process" in report.checks


@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is not None, reason="mani_skill is installed here")
def test_maniskill_backend_is_lazy_and_says_how_to_install():
    with pytest.raises(ImportError, match=r"needs ManiSkill 3 and a Vulkan device: run scripts/maniskill-env"):
        make("primitive_skill", backend="maniskill")
    code = ("import sys, vagent.envs.primitive_skill as p; from vagent.envs import make; make('primitive_skill'); "
            "assert 'vagent.envs.primitive_skill.maniskill' not in sys.modules and 'mani_skill' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_targets_and_drawer_are_in_the_scene_as_built():
    env = make("primitive_skill", task="place")
    env.reset(0)
    s = env._backend.scene()
    assert isinstance(s.targets["left_target"], Target) and s.targets["left_target"].y > 0 > s.targets["right_target"].y
    env = make("primitive_skill", task="drawer")
    env.reset(0)
    d = env._backend.scene().drawer
    assert d.open == 0 and env.state()["drawer"]["handle"] == [25, int(d.y), 60]
