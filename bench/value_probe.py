"""How much of a FrozenLake policy's return could a value head explain? A linear probe.

    python bench/value_probe.py POLICY_DIR [--n 256] [--seed 0] [--threads 2] [--gamma-turn 0.5]

Plays ``--n`` train-split boards with POLICY_DIR in the default run's env and rollout settings
(``configs/frozenlake_ppo.yaml``: 128 px images, grounding_worldmodeling, symbolic descriptions,
``reward_progress`` 0.5; temperature 0.7, 96 tokens a turn, 4 turns),
computes the bi-level GAE returns with V = 0 (gamma_token 1, lam 1: Monte Carlo turn returns
discounted by ``--gamma-turn``; truncated episodes bootstrap 0) on every sampled token, and
fits ridge regressions on the first half of the episodes, reporting the explained variance on
the second half (and on the fitting half, as an upper bound) for:

- ``features``: the policy's last hidden state before each sampled token, i.e. exactly what
  the PPO recipe's value head (``ValueModel``, a linear map) reads;
- ``true state``: hand features of the board before the turn (BFS distance to the goal,
  one-hot; turn index; number of holes), what an ideal state-value critic could know;
- both together.

Explained variance near 0 for all three means the return is decided by what is sampled in the
turn, not by the state: no state-value critic can then lower the advantages' variance much.
A measurement of a policy, not a speed benchmark.
"""

from __future__ import annotations

import collections

import numpy as np

from common import policy_probe_parser

MAX_DISTANCE = 9  # distances >= 9 (and no path) share one bin


def ridge_ev(x_fit: np.ndarray, y_fit: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
             alpha: float) -> tuple[float, float]:
    """(held-out EV, fitting-half EV) of a ridge regression on standardised features (the bias
    is not penalised)."""
    mu, sd = x_fit.mean(0), x_fit.std(0) + 1e-6

    def design(x):
        return np.hstack([(x - mu) / sd, np.ones((len(x), 1))])

    a, b = design(x_fit), design(x_test)
    reg = alpha * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    w = np.linalg.solve(a.T @ a + reg, a.T @ y_fit)
    return (float(1 - np.var(y_test - b @ w) / np.var(y_test)),
            float(1 - np.var(y_fit - a @ w) / np.var(y_fit)))


def state_features(turn, index: int) -> list[float]:
    """(BFS distance to the goal, turn index, holes) of the board before ``turn`` (turn ``index``)."""
    from vagent.envs.frozenlake import goal_distance

    s = turn.state_before  # a FrozenLake state: grid, holes, player, goal
    holes = frozenset(map(tuple, s["holes"]))
    d = goal_distance(len(s["grid"]), holes, tuple(s["player"]), tuple(s["goal"]))
    return [min(d, MAX_DISTANCE) if d is not None else MAX_DISTANCE, index, len(holes)]


def main() -> int:
    ap = policy_probe_parser(__doc__, n=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gamma-turn", type=float, default=0.5)
    args = ap.parse_args()
    if args.n < 4:
        ap.error("--n must be at least 4 (half the episodes fit, half test)")

    import torch

    from vagent.models import load_policy
    from vagent.models.forward import forward_hidden
    from vagent.runconfig import load_config
    from vagent.rl.advantages import bi_level_gae
    from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
    from vagent.rollout.batch import build_token_batch
    from vagent.seeds import split_seeds

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = load_config()  # the default run: its env entry and rollout settings
    env, ro = cfg.envs[0], cfg.rollout
    loaded = load_policy(args.policy_dir)
    specs = [EnvSpec(env.name, env.config, seed) for seed in split_seeds("train", args.n)]
    sampling = SamplingConfig(temperature=ro.temperature, max_new_tokens=ro.max_new_tokens, stop=tuple(ro.stop),
                              seed=args.seed)
    episodes = rollout(specs, HFPolicy(loaded), sampling, max_turns=ro.max_turns)
    episodes = [e for e in episodes if e.error is None and e.turns]
    batch = build_token_batch(episodes, pad_token_id=loaded.encoder.pad_token_id)
    zeros = torch.zeros(batch.loss_mask.shape)
    _, returns = bi_level_gae(batch.token_rewards, zeros, batch.loss_mask, batch.turn_end_mask, 1.0,
                              args.gamma_turn, 1.0, truncated=batch.truncated,
                              final_values=torch.zeros(batch.batch_size))

    feats, ys, rows, state, first = [], [], [], [], []
    loaded.model.eval()
    with torch.no_grad():
        for b, ep in enumerate(episodes):
            row = batch.select([b])
            hidden = forward_hidden(loaded.model, row.input_ids, row.attention_mask, row.pixel_values,
                                    row.image_grid_thw)[0]
            mask = row.loss_mask[0].bool()
            pos = torch.nonzero(mask)[:, 0]
            length = mask.shape[0]
            feats.append(hidden[pos - 1].float().numpy())  # V before token p reads h[p - 1]
            ys.append(returns[b][:length][mask].numpy())
            rows.append(np.full(len(pos), b))
            turn = batch.turn_index[b][:length][mask].numpy()
            per_turn = np.array([state_features(t, k) for k, t in enumerate(ep.turns)], dtype=float)
            state.append(per_turn[turn])  # one BFS per turn, spread over its tokens
            first.append(np.concatenate([[True], turn[1:] != turn[:-1]]))
    x, y, r, s, f = (np.concatenate(v) for v in (feats, ys, rows, state, first))
    fit, test = r < len(episodes) // 2, r >= len(episodes) // 2
    s_x = np.hstack([s, np.eye(MAX_DISTANCE + 1)[s[:, 0].astype(int)], np.eye(4)[s[:, 1].astype(int)]])

    success = np.mean([bool(e.turns[-1].info.get("success")) for e in episodes])
    print(f"{args.policy_dir}: {len(episodes)} train boards at T {ro.temperature}, success {success:.3f}; "
          f"{len(y)} sampled tokens, return mean {y.mean():.3f} std {y.std():.3f} (gamma_turn {args.gamma_turn})")
    by_distance = collections.defaultdict(list)
    for d, ret in zip(s[f][:, 0], y[f]):
        by_distance[int(d)].append(ret)
    print("turn return by BFS distance before the turn (turns, mean, std): " + ", ".join(
        f"{d}: {len(v)} / {np.mean(v):.2f} / {np.std(v):.2f}" for d, v in sorted(by_distance.items())))
    print("explained variance, held-out half (fitting half):")
    for alpha in (1.0, 10.0, 100.0, 1000.0):
        held, fitted = ridge_ev(x[fit], y[fit], x[test], y[test], alpha)
        print(f"  features, ridge {alpha:g}: {held:.3f} ({fitted:.3f})")
    held, fitted = ridge_ev(s_x[fit], y[fit], s_x[test], y[test], 1.0)
    print(f"  true state: {held:.3f} ({fitted:.3f})")
    both = np.hstack([x, s_x])
    held, fitted = ridge_ev(both[fit], y[fit], both[test], y[test], 100.0)
    print(f"  features + true state, ridge 100: {held:.3f} ({fitted:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
