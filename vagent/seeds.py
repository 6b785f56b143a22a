"""Named seed splits: disjoint ranges for train, validation and test (docs/algorithms.md reference bug 2).

Legacy VAGEN's test seeds were a subset of its train seeds; here the splits are fixed,
non-overlapping ranges and ``split_seeds`` refuses to hand out a seed outside its split.
"""

from __future__ import annotations

import hashlib

SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "val": range(1_000_000, 1_010_000),
    "test": range(2_000_000, 2_010_000),
}


def split_seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """``n`` consecutive seeds of ``split`` starting at ``offset`` within it."""
    if split not in SPLITS:
        raise KeyError(f"Unknown split '{split}'; valid splits: {', '.join(SPLITS)}.")
    r = SPLITS[split]
    if offset < 0 or offset + n > len(r):
        raise ValueError(f"Split '{split}' has {len(r)} seeds; asked for [{offset}, {offset + n}).")
    return list(r[offset : offset + n])


def split_of(seed: int) -> str:
    """The split a seed belongs to (ValueError if none)."""
    for name, r in SPLITS.items():
        if seed in r:
            return name
    raise ValueError(f"Seed {seed} belongs to no split; splits: " + ", ".join(f"{k}={v.start}..{v.stop - 1}" for k, v in SPLITS.items()))


def derive_seed(*parts: object) -> int:
    """A 62-bit seed from any parts (sha256 of their reprs joined by ``|``): same parts, same seed,
    in any process. The one seed derivation of vagent (recipes, rollouts, MCTS)."""
    blob = "|".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 2
