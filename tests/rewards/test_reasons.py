"""The judges' reasons (``JudgeResult.reason``, ``Turn.judge_reasons``): what each says, and that
recording them changes no reward.

Hand-derived from the rule judge's docstring: Sokoban, truth box (above, left), target (below,
same); "The box is above and to the left of you. The target is below and to the right of you."
-> box matched exactly (F1 1), target one axis right (half, F1 0.5), score 0.75.
"""

from __future__ import annotations

import pytest

from tests.rewards._episodes import run
from vagent.envs.frozenlake import LEGEND, FrozenLakeEnv, state_from_grid
from vagent.rewards import AntiHackingConfig, JudgeItem, ReasoningReward, RuleJudge, rule_checks, rule_score
from vagent.rewards.base import env_judge_info
from vagent.rewards.rule import MAX_REASON_CHARS

SOKOBAN = {"relations": [{"object": "box", "vertical": "above", "horizontal": "left"},
                         {"object": "target", "vertical": "below", "horizontal": "same"}]}


def test_rule_reason_names_each_claim_its_true_position_and_the_f1():
    spec = env_judge_info("sokoban").spec
    text = "The box is above and to the left of you. The target is below and to the right of you."
    r = rule_score(text, SOKOBAN, spec)
    assert r.score == pytest.approx(0.75)
    assert r.reason.startswith("rule judge (natural, 2 claims) 0.75: ")
    assert "box F1 1.00: said (above, left), true (above, left): match" in r.reason
    assert "target F1 0.50: said (below, right), true (below, same): half" in r.reason


def test_rule_reason_lists_unmatched_claims_and_missed_objects():
    spec = FrozenLakeEnv.judge_spec
    state = state_from_grid(["O__G", "_P__", "___O", "____"])  # goal above-right; holes above-left, below-right
    r = rule_score("The goal is below and to the left of you.", state, spec, LEGEND)
    assert "goal F1 0.00: said (below, left), true (above, right): wrong" in r.reason
    assert "hole F1 0.00: not said (above, left), (below, right)" in r.reason
    r = rule_score("The goal is above and to the right. A hole is above. A hole is below. A hole is left.",
                   state, spec, LEGEND)
    assert "extra (" in r.reason  # three hole claims, two holes: one claim matched nothing
    long = rule_score(" ".join(f"A hole is above, {i}." for i in range(200)), state, spec, LEGEND)
    assert len(long.reason) <= MAX_REASON_CHARS and long.reason.endswith("...")


def test_rule_check_reason_says_what_is_missing():
    spec = FrozenLakeEnv.judge_spec
    state = state_from_grid(["O__G", "_P__", "___O", "____"])
    item = JudgeItem("A hole is above and to the left.", state, spec, "grounding", LEGEND)
    assert rule_checks(item, AntiHackingConfig()).reason == "does not mention goal"
    assert rule_checks(item, AntiHackingConfig(max_chars=5)).reason == "longer than anti_hacking.max_chars"
    ok = JudgeItem("The goal is above and to the right.", state, spec, "grounding", LEGEND)
    assert rule_checks(ok, AntiHackingConfig()).reason == ""


def test_turn_reasons_hold_the_judges_reason_and_the_guards():
    eps = run(ReasoningReward({"judge": "rule"}))
    t0, t1, t2 = eps[0].turns
    # turn 0: both fields judged; the reason ends with the arithmetic of its reward
    assert set(t0.judge_reasons) == {"grounding", "worldmodeling"}
    for kind in ("grounding", "worldmodeling"):
        assert t0.judge_reasons[kind].startswith("rule judge (natural")
        assert t0.judge_reasons[kind].endswith(f"= {t0.reasoning_rewards[kind]:+.3f}")
    assert t1.judge_reasons == {} and not t1.parsed.format_ok  # a malformed turn is not judged
    assert "goal F1 0.00" in t2.judge_reasons["grounding"]  # the goal said above-left, truly below-right


def test_turn_reason_of_a_failed_rule_check_and_of_the_frequency_penalty():
    eps = run(ReasoningReward({"judge": "rule", "anti_hacking": {"required_weight": 0.0}}))
    why = eps[0].turns[2].judge_reasons["worldmodeling"]  # the prediction names no hole
    assert "rule check failed (does not mention hole): score set to 0" in why
    rr = ReasoningReward({"judge": "rule", "anti_hacking": {"min_count": 2}})
    eps = run(rr, n_envs=3)
    penalized = [t.judge_reasons[k] for e in eps for t in e.turns for k, r in t.reasoning_rewards.items() if r < 0]
    assert penalized and all("anti-hacking penalty -0.100: a frequent description (seen" in w for w in penalized)


def test_reasons_change_no_reward():
    """The rewards equal those of a judge whose results carry no reason (the fallback text)."""

    class Reasonless(RuleJudge):
        def score(self, items):
            return [type(r)(r.score, r.fallback, r.detail) for r in super().score(items)]

    a = run(ReasoningReward({"judge": "rule"}), n_envs=2)
    b = run(ReasoningReward({"judge": "rule"}, judge=Reasonless()), n_envs=2)
    assert [(t.reward, t.reasoning_rewards, t.reasoning_scores) for e in a for t in e.turns] == \
           [(t.reward, t.reasoning_rewards, t.reasoning_scores) for e in b for t in e.turns]
    assert b[0].turns[0].judge_reasons["grounding"].startswith("Reasonless score ")
