"""The search tree of :mod:`vagent.vigorl.mcts` as records: :class:`Node` (one thought),
:class:`RolloutRecord` (one completion from a node), :class:`ThoughtTree` (one example's search,
JSON round trip with ``to_dict`` / ``from_dict``), and :func:`tree_metrics` over a batch of trees.

:mod:`vagent.vigorl.traces` reads these trees back to build SFT chats; ``vagent.vigorl.mcts``
re-exports the names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence


@dataclass
class RolloutRecord:
    """One completion from a node: the reply, its thinking (the steps after the node's path), the
    answer, its accuracy (the reward) and whether its format was correct."""

    text: str
    continuation: str
    answer: str
    reward: float
    format_ok: bool


@dataclass
class Node:
    """A thought. ``answer``/``reward`` are set for a terminal thought (it answered); ``point`` is
    its first valid citation (None if it cites none)."""

    id: int
    parent: int | None
    depth: int
    thought: str = ""
    point: list[int] | None = None
    answer: str | None = None
    reward: float | None = None
    visits: int = 0
    value_sum: float = 0.0
    children: list[int] = field(default_factory=list)
    rollouts: list[RolloutRecord] = field(default_factory=list)
    reply: str = ""

    @property
    def terminal(self) -> bool:
        return self.answer is not None

    @property
    def value(self) -> float:
        """Q: the mean reward backed up through this node (0 before any visit)."""
        return self.value_sum / self.visits if self.visits else 0.0


@dataclass
class ThoughtTree:
    """The search result for one example (JSON-serialisable with :meth:`to_dict`)."""

    env: str
    env_config: dict
    seed: int
    question: str
    shown_size: list[int]
    reference_answer: str
    config: dict
    nodes: list[Node]
    policy_calls: int = 0
    policy_errors: int = 0
    time_s: float = 0.0
    #: accuracy of best_answer() (set by search)
    best_accuracy: float = 0.0

    # -- structure ------------------------------------------------------------------------------
    def path(self, node_id: int) -> list[Node]:
        """The nodes from depth 1 down to ``node_id`` (the root excluded)."""
        out = []
        node = self.nodes[node_id]
        while node.parent is not None:
            out.append(node)
            node = self.nodes[node.parent]
        return out[::-1]

    def best_path(self) -> list[Node]:
        """Greedy descent by (Q, visits, -id) through visited children, from the root."""
        out, node = [], self.nodes[0]
        while node.children:
            visited = [self.nodes[c] for c in node.children if self.nodes[c].visits]
            if not visited:
                break
            node = max(visited, key=lambda n: (n.value, n.visits, -n.id))
            out.append(node)
        return out

    def best_answer(self) -> str | None:
        """The answer at the end of the best path: the terminal answer, else the most common
        rollout answer of the last node (ties: the first seen); None if it has none."""
        path = self.best_path()
        if not path:
            return None
        leaf = path[-1]
        if leaf.terminal:
            return leaf.answer
        answers = [r.answer for r in leaf.rollouts if r.answer]
        return Counter(answers).most_common(1)[0][0] if answers else None

    @property
    def solved(self) -> bool:
        """Some rollout or terminal thought in the tree answered correctly."""
        return any((n.reward or 0) >= 1 or any(r.reward >= 1 for r in n.rollouts) for n in self.nodes)

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ThoughtTree":
        names = {f.name for f in fields(cls)}
        missing = {"env", "env_config", "seed", "nodes"} - set(d)
        if missing:
            raise ValueError(f"not a ThoughtTree record: missing {sorted(missing)} (write trees with `vagent vigorl mcts`).")
        kw = {k: v for k, v in d.items() if k in names}
        nodes = []
        for n in d["nodes"]:
            n = dict(n)
            n["rollouts"] = [RolloutRecord(**r) for r in n.get("rollouts", [])]
            nodes.append(Node(**n))
        kw["nodes"] = nodes
        return cls(**kw)


def tree_metrics(trees: Sequence[ThoughtTree]) -> dict[str, float]:
    """Summary metrics of a batch of trees (documented in docs/metrics/vigorl.md)."""
    n = len(trees)
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)
    return {
        "mcts/trees": float(n),
        "mcts/solved_frac": mean([float(t.solved) for t in trees]),
        "mcts/best_path_accuracy": mean([t.best_accuracy for t in trees]),
        "mcts/root_value_mean": mean([t.nodes[0].value for t in trees]),
        "mcts/nodes_mean": mean([float(len(t.nodes)) for t in trees]),
        "mcts/depth_max_mean": mean([float(max(n.depth for n in t.nodes)) for t in trees]),
        "mcts/policy_calls": float(sum(t.policy_calls for t in trees)),
        "mcts/policy_errors": float(sum(t.policy_errors for t in trees)),
        "perf/mcts_time_s": float(sum(t.time_s for t in trees)),
    }
