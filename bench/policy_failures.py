"""Where a FrozenLake policy fails: greedy episodes on val boards, broken down move by move.

    python bench/policy_failures.py POLICY_DIR [--n 64] [--max-turns 4] [--threads 2] [--answers]

POLICY_DIR is a saved policy, e.g. ``runs/<run>/checkpoints/sft_000500/policy`` (after SFT) or
``runs/<run>/checkpoints/step_000020/policy`` (after PPO). It plays ``--n`` val-split boards
greedily in the default run's env config (128 px images, grounding_worldmodeling, symbolic
descriptions) and reports:

- episode outcomes: ``success`` / ``hole`` (fell in) / ``truncated`` (out of turns);
- per turn: ``observation_exact`` (the <observation> grid is the true grid),
  ``relation_right`` (the goal's direction in <reasoning> names the true one),
  ``plan_is_answer`` (the "I move ..." plan in <reasoning> equals the <answer>'s actions);
- per executed move: ``closer`` (BFS distance to the goal drops), ``away`` (moved, but not
  closer), ``wall`` (into the edge: no move), ``hole``;
- with ``--answers``: the most common answers. One answer on most turns means the answer ignores
  the state and the plan (the collapse that 300 SFT steps left; see docs/training.md).

A measurement of a policy, not a speed benchmark: the figures are shares of turns or moves.
"""

from __future__ import annotations

import collections
import re

from common import policy_probe_parser



def turn_checks(turn) -> dict[str, bool]:
    """observation_exact / relation_right / plan_is_answer for one turn."""
    state, parsed = turn.state_before, turn.parsed
    goal = next(r for r in state["relations"] if r["object"] == "goal")
    relation_text = parsed.reasoning.split("I move")[0]
    wanted = [w for w in (goal["vertical"], goal["horizontal"]) if w != "same"]
    plan = re.search(r"I move (.*?)\.", parsed.reasoning)
    return {
        "observation_exact": parsed.observation.strip() == "\n".join(state["grid"]),
        "relation_right": all(w in relation_text for w in wanted),
        "plan_is_answer": bool(plan) and [a.strip() for a in plan.group(1).split(",")] == list(parsed.actions),
    }


def move_kinds(turn) -> list[str]:
    """closer / away / wall / hole for each action the env executed this turn."""
    from vagent.envs.frozenlake import goal_distance, move

    state = turn.state_before
    size, goal = len(state["grid"]), tuple(state["goal"])
    holes = frozenset(map(tuple, state["holes"]))
    cell, kinds = tuple(state["player"]), []
    for action in turn.info.get("executed_actions") or []:
        nxt = move(size, cell, action)
        if nxt in holes:
            kinds.append("hole")
            break
        before, after = goal_distance(size, holes, cell, goal), goal_distance(size, holes, nxt, goal)
        kinds.append("wall" if nxt == cell else "closer" if after is not None and before is not None
                     and after < before else "away")
        cell = nxt
        if cell == goal:
            break
    return kinds


def main() -> int:
    ap = policy_probe_parser(__doc__, n=64)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--answers", action="store_true", help="also print the most common answers")
    args = ap.parse_args()

    import torch

    from vagent.models import load_policy
    from vagent.runconfig import load_config
    from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
    from vagent.seeds import split_seeds

    torch.set_num_threads(args.threads)
    policy = HFPolicy(load_policy(args.policy_dir))
    env = load_config().envs[0]  # the default run's env entry
    specs = [EnvSpec(env.name, env.config, seed) for seed in split_seeds("val", args.n)]
    episodes = rollout(specs, policy, SamplingConfig(temperature=0.0, max_new_tokens=96, stop=["</answer>"]),
                       max_turns=args.max_turns)

    outcomes, turns, moves, answers = collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter()
    n_turns = 0
    for ep in episodes:
        last = ep.turns[-1].info if ep.turns else {}
        outcomes["success" if last.get("success") else "hole" if last.get("fell_in_hole") else "truncated"] += 1
        for turn in ep.turns:
            n_turns += 1
            turns.update(k for k, ok in turn_checks(turn).items() if ok)
            moves.update(move_kinds(turn))
            answers[",".join(turn.parsed.actions) or "(none)"] += 1
    n_moves = sum(moves.values())
    print(f"{args.policy_dir}: {args.n} val boards, greedy, <= {args.max_turns} turns")
    print("episodes: " + ", ".join(f"{k} {outcomes[k]}" for k in ("success", "hole", "truncated")))
    print(f"turns ({n_turns}): " + ", ".join(f"{k} {turns[k] / max(1, n_turns):.3f}"
                                             for k in ("observation_exact", "relation_right", "plan_is_answer")))
    print(f"moves ({n_moves}): " + ", ".join(f"{k} {moves[k] / max(1, n_moves):.3f}"
                                             for k in ("closer", "away", "wall", "hole")))
    if args.answers:
        print("answers: " + ", ".join(f"{a} x{c}" for a, c in answers.most_common(8)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
