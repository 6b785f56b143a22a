#!/usr/bin/env python3
"""Check ``vagent.rl.correction`` against verl's own ``rollout_corr_helper`` on random batches.

verl is not a dependency (it pulls Ray, vLLM and more), so this imports its helper module from a
checkout you point at, with stand-ins for the three verl imports that module needs only for its
batch-level wrappers (``DataProto``, two config classes); ``verl/utils/torch_functional.py``'s
``masked_sum`` / ``masked_mean`` are taken from the checkout as they are.

    git clone https://github.com/volcengine/verl /tmp/verl
    .venv/bin/python scripts/check_correction_against_verl.py /tmp/verl

Compared (200 random batches of 6 x 40 tokens): token and sequence truncated IS weights, the
rejection masks of verl's ``token_k1`` / ``seq_sum_k1`` / ``seq_mean_k1`` with symmetric bounds
(vagent's ``rs_level`` token / sequence / geometric), ``k3_kl`` and ``ppl_ratio`` of
``compute_offpolicy_metrics`` (vagent's ``mismatch/kl`` / ``mismatch/ppl_ratio``). Exits 1 on a
difference above 1e-5.
"""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

import torch

from vagent.rl.correction import CorrectionSettings, correct, mismatch_metrics


def load_verl(checkout: Path):
    """verl's rollout_corr_helper module, from ``checkout``, beside stand-ins for its batch-level imports."""
    root = Path(tempfile.mkdtemp(prefix="verl-shim-"))
    src = (checkout / "verl/trainer/ppo/rollout_corr_helper.py").read_text()
    tf = (checkout / "verl/utils/torch_functional.py").read_text()
    tree = ast.parse(tf)
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("masked_sum", "masked_mean")]
    files = {
        "verl/utils/torch_functional.py": "import torch\n\n" + "\n\n".join(ast.get_source_segment(tf, n) for n in wanted),
        "verl/protocol.py": "class DataProto:\n    @staticmethod\n    def from_dict(tensors):\n        return tensors\n",
        "verl/trainer/config/algorithm.py": "RolloutCorrectionConfig = dict\n",
        "verl/workers/config/actor.py": "PolicyLossConfig = dict\n",
        "verl/trainer/ppo/rollout_corr_helper.py": src,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
    sys.path.insert(0, str(root))
    from verl.trainer.ppo import rollout_corr_helper

    return rollout_corr_helper


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    V = load_verl(Path(sys.argv[1]))
    worst: dict[str, float] = {}

    def note(name, a, b):
        d = float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().max())
        worst[name] = max(worst.get(name, 0.0), d)

    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        engine = -torch.rand(6, 40, generator=g) * 3
        trainer = engine + torch.randn(6, 40, generator=g) * 0.3
        mask = torch.rand(6, 40, generator=g) < 0.6
        mask[:, 0] = True
        m, lr = mask.float(), trainer - engine
        for level, c in (("token", 2.0), ("sequence", 5.0), ("token", 1.3)):
            weights, _ = V.compute_rollout_correction_weights(lr, m, rollout_is=level, rollout_is_threshold=c)
            note(f"is {level}", weights * m, correct(trainer, engine, mask, CorrectionSettings(level, c)).weights)
        for option, level, hi in (("token_k1", "token", 1.5), ("seq_sum_k1", "sequence", 3.0),
                                  ("seq_mean_k1", "geometric", 1.1)):
            keep, _ = V.compute_rollout_rejection_mask(lr, m, rollout_rs=option, rollout_rs_threshold=hi)
            mine = correct(trainer, engine, mask, CorrectionSettings(rs_level=level, rs_high=hi))
            note(f"rs {level} ({option})", keep, mine.mask.float())
        ours, theirs = mismatch_metrics(trainer, engine, mask), V.compute_offpolicy_metrics(trainer, engine, m)
        note("mismatch/kl (k3_kl)", theirs["k3_kl"], ours["mismatch/kl"])
        note("mismatch/ppl_ratio (ppl_ratio)", theirs["ppl_ratio"], ours["mismatch/ppl_ratio"])
    for name, d in worst.items():
        print(f"{name:40s} max |vagent - verl| = {d:.2e}")
    bad = [k for k, v in worst.items() if not v < 1e-5]
    print("equal to verl" if not bad else f"DIFFERENT: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
