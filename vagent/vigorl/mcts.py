"""Monte Carlo tree search over grounded thoughts (ViGoRL's data engine, docs/algorithms.md reference section 10).

Each node below the root is ONE thought (a step citing one point ``(x, y)`` of the shown image)
or a terminal thought that answered. One simulation, in order::

    select    from the root, the child maximising UCB = Q + c * sqrt(ln N_parent / N_child)
              (Q = mean reward of the child's subtree; an unvisited child first; ties -> lower id)
              until a node without children
    stop?     a terminal node (it answered) or one at max_depth: back up its reward again
              (terminal: its accuracy; depth cap: the mean of its rollouts) and end the simulation
    expand    ask the policy for n_children next thoughts (ONE batched ``act`` call of n_children
              copies of the thought prompt; diversity comes from sampling)
    evaluate  n_rollouts completions per new non-terminal child (ONE batched ``act`` call): the
              policy finishes the chain and answers; the reward is the dataset's accuracy of that
              answer (:func:`vagent.vigorl.data.score_answer`); a terminal child scores its answer
    backup    each reward adds one visit and its value along the path to the root

Defaults are ViGoRL's: c = 2, 3 children, 2 rollouts per child, 8 simulations. The thought
generator is any ``vagent.rollout.policy.Policy`` (``HFPolicy`` for a local VLM, an
``vagent.eval.backends`` API policy, or :class:`vagent.vigorl.scripted.ScriptedSearchPolicy`).
Its prompts (:func:`thought_conversation`, :func:`rollout_conversation`) show the same question
and image as the env (``env.task``), plus the steps so far and an instruction.

Determinism: the sampling seed of each call is ``derive_seed(config.seed, episode seed, simulation,
phase)`` (sha256, not ``hash()``) and ties break by node id, so a seeded policy gives the same tree
in any process. Policy errors (``Reply.error``) drop that thought or rollout and are counted in
``ThoughtTree.policy_errors`` (never a silent reward).

Deviations from ViGoRL: synchronous and single-process (ViGoRL runs async workers against vLLM);
rollout rewards are accuracy only (format is not scored during search); the tree keeps every
rollout so :mod:`vagent.vigorl.traces` can build backtracking chains.
The tree's records (:class:`Node`, :class:`ThoughtTree`) are :mod:`vagent.vigorl.tree`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from vagent.rollout.policy import Conversation, Message, Policy, Reply, SamplingConfig
from vagent.seeds import derive_seed
from vagent.vigorl import data as D
from vagent.vigorl.grounding import find_points, parse_grounded
from vagent.vigorl.tree import Node, RolloutRecord, ThoughtTree, tree_metrics  # noqa: F401 -- re-exported

THOUGHT_SYSTEM = (
    "You solve a question about an image one reasoning step at a time. A step is one or two sentences "
    "about ONE place of the image and cites it as (x, y): integer pixel coordinates of the image as shown "
    "(x grows to the right, y grows downward, (0, 0) is the top-left pixel)."
)
STEPS_HEADER = "Steps so far:"
THOUGHT_INSTRUCTION = ("Write the next step only, as <think>step</think>. If the steps so far already settle "
                       "the question, reply with only the final answer instead, as <answer>...</answer>.")
ROLLOUT_INSTRUCTION = ("Finish the reasoning from the steps so far: reply <think>the remaining steps, each citing "
                       "one point (x, y)</think><answer>{hint}</answer>.")


@dataclass
class MCTSConfig:
    """Search settings (ViGoRL's defaults)."""

    #: UCB exploration constant c in Q + c * sqrt(ln N_parent / N_child)
    c: float = 2.0
    #: thoughts generated per expansion
    n_children: int = 3
    #: completions per new child, scored by the dataset's accuracy
    n_rollouts: int = 2
    #: simulations (select -> expand -> evaluate -> backup) per example
    n_simulations: int = 8
    #: deepest thought chain (depth of a node = thoughts on its path)
    max_depth: int = 5
    #: sampling temperature of thoughts and rollouts
    temperature: float = 1.0
    #: nucleus sampling mass
    top_p: float = 1.0
    #: token budget of one thought
    max_thought_tokens: int = 96
    #: token budget of one rollout (the rest of the chain and the answer)
    max_rollout_tokens: int = 256
    #: search seed; sampling seeds derive from (seed, episode seed, simulation, phase)
    seed: int = 0

    def validate(self) -> "MCTSConfig":
        for name in ("n_children", "n_rollouts", "n_simulations", "max_depth", "max_thought_tokens",
                     "max_rollout_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"MCTSConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.c < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("MCTSConfig: c and temperature must be >= 0 and top_p in (0, 1]")
        return self


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

def _steps_block(thoughts: Sequence[str]) -> str:
    lines = [f"{i}. {t}" for i, t in enumerate(thoughts, 1) if t]
    return STEPS_HEADER + "\n" + ("\n".join(lines) if lines else "(none yet)")


def _user(task: Any, thoughts: Sequence[str], instruction: str) -> Message:
    text, images = task.image_block()
    return Message("user", "\n".join([task.question(), text, _steps_block(thoughts), instruction]), images)


def thought_conversation(task: Any, thoughts: Sequence[str]) -> Conversation:
    """The prompt asking for the next single thought after ``thoughts`` (``task`` = ``env.task``)."""
    return Conversation([Message("system", THOUGHT_SYSTEM), _user(task, thoughts, THOUGHT_INSTRUCTION)])


def rollout_conversation(task: Any, thoughts: Sequence[str]) -> Conversation:
    """The prompt asking to finish the chain after ``thoughts`` and answer."""
    instruction = ROLLOUT_INSTRUCTION.replace("{hint}", task.answer_hint())
    return Conversation([Message("system", THOUGHT_SYSTEM), _user(task, thoughts, instruction)])


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------

def _ucb(child: Node, parent_visits: int, c: float) -> float:
    if child.visits == 0:
        return math.inf
    return child.value + c * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)


def select(tree: ThoughtTree, c: float) -> Node:
    """Descend from the root by UCB (ties -> lower id) to a node without children."""
    node = tree.nodes[0]
    while node.children:
        kids = [tree.nodes[i] for i in node.children]
        node = max(kids, key=lambda k: (_ucb(k, node.visits, c), -k.id))
    return node


def backup(tree: ThoughtTree, node: Node, reward: float) -> None:
    """Add one visit with ``reward`` to ``node`` and every ancestor."""
    cur: Node | None = node
    while cur is not None:
        cur.visits += 1
        cur.value_sum += float(reward)
        cur = tree.nodes[cur.parent] if cur.parent is not None else None


def _thoughts(tree: ThoughtTree, node: Node) -> list[str]:
    return [n.thought for n in tree.path(node.id) if n.thought]


def _first_block(text: str, tag: str) -> str | None:
    o = text.find(f"<{tag}>")
    c = text.find(f"</{tag}>", o + 1) if o != -1 else -1
    return text[o + len(tag) + 2: c].strip() if o != -1 and c != -1 else None


def parse_thought(text: str, width: int, height: int) -> tuple[str, list[int] | None, str | None]:
    """(thought, first valid point or None, answer or None) of a thought reply. The thought is the
    ``<think>`` content, else the reply without tags; an ``<answer>`` block makes it terminal."""
    answer = _first_block(text, "answer")
    think = _first_block(text, "think")
    if think is None:
        think = text
        for tag in ("<think>", "</think>", "<answer>", "</answer>"):
            think = think.replace(tag, " ")
        if answer is not None:
            think = think.replace(answer, " ")
        think = " ".join(think.split())
    valid, _ = find_points(think, width, height)
    return think[:2000], (list(valid[0]) if valid else None), (answer or None)


class _Search:
    """One example's search state (see the module docstring for the order of operations)."""

    def __init__(self, tree: ThoughtTree, task: Any, policy: Policy, cfg: MCTSConfig):
        self.tree, self.task, self.policy, self.cfg = tree, task, policy, cfg

    def sampling(self, sim: int, phase: str, max_tokens: int) -> SamplingConfig:
        return SamplingConfig(temperature=self.cfg.temperature, top_p=self.cfg.top_p, max_new_tokens=max_tokens,
                              stop=("</answer>",), seed=derive_seed(self.cfg.seed, self.tree.seed, sim, phase))

    def call(self, convs: list[Conversation], sampling: SamplingConfig) -> list[Reply]:
        replies = self.policy.act(convs, sampling)
        self.tree.policy_calls += 1
        if len(replies) != len(convs):
            raise RuntimeError(f"policy returned {len(replies)} replies for {len(convs)} conversations")
        return replies

    def expand(self, leaf: Node, sim: int) -> list[Node]:
        thoughts = _thoughts(self.tree, leaf)
        convs = [thought_conversation(self.task, thoughts) for _ in range(self.cfg.n_children)]
        # a thought ends at </think> or </answer>: stop strings for both
        sampling = replace(self.sampling(sim, "expand", self.cfg.max_thought_tokens), stop=("</think>", "</answer>"))
        children = []
        w, h = self.task.shown
        for reply in self.call(convs, sampling):
            if reply.error is not None:
                self.tree.policy_errors += 1
                continue
            text = reply.text
            if "<think>" in text and "</think>" not in text and "<answer>" not in text:
                text += "</think>"  # the stop string was stripped by the backend
            thought, point, answer = parse_thought(text, w, h)
            node = Node(id=len(self.tree.nodes), parent=leaf.id, depth=leaf.depth + 1, thought=thought,
                        point=point, answer=answer, reply=reply.text)
            if answer is not None:
                node.reward = self.task.score(answer)
            self.tree.nodes.append(node)
            leaf.children.append(node.id)
            children.append(node)
        return children

    def evaluate(self, children: list[Node], sim: int) -> None:
        pending = [c for c in children if not c.terminal]
        convs, owners = [], []
        for child in pending:
            thoughts = _thoughts(self.tree, child)
            for _ in range(self.cfg.n_rollouts):
                convs.append(rollout_conversation(self.task, thoughts))
                owners.append(child)
        replies = self.call(convs, self.sampling(sim, "rollout", self.cfg.max_rollout_tokens)) if convs else []
        w, h = self.task.shown
        for child, reply in zip(owners, replies):
            if reply.error is not None:
                self.tree.policy_errors += 1
                continue
            parsed = parse_grounded(reply.text, w, h)
            acc = self.task.score(parsed.answer)
            child.rollouts.append(RolloutRecord(reply.text, parsed.think, parsed.answer, acc, parsed.format_ok))
            backup(self.tree, child, acc)
        for child in children:
            if child.terminal:
                backup(self.tree, child, child.reward)

    def run(self) -> ThoughtTree:
        t0 = time.perf_counter()
        for sim in range(self.cfg.n_simulations):
            leaf = select(self.tree, self.cfg.c)
            if leaf.terminal or leaf.depth >= self.cfg.max_depth:
                rewards = [r.reward for r in leaf.rollouts]
                backup(self.tree, leaf, leaf.reward if leaf.terminal else (sum(rewards) / len(rewards) if rewards else 0.0))
                continue
            self.evaluate(self.expand(leaf, sim), sim)
        self.tree.time_s = time.perf_counter() - t0
        return self.tree


def search(env_name: str, env_config: dict, seed: int, policy: Policy, config: MCTSConfig | None = None) -> ThoughtTree:
    """Run MCTS for the example of ``seed`` in env ``env_name`` (vigorl_search or vigorl_zoom with
    ``env_config``); returns the tree. The env supplies the question and image (``env.task``)."""
    from vagent.envs import make

    cfg = (config or MCTSConfig()).validate()
    env = make(env_name, **env_config)
    try:
        env.reset(seed)
        task = env.task
        tree = ThoughtTree(env=env_name, env_config=dict(env_config), seed=int(seed), question=task.question(),
                           shown_size=list(task.shown), reference_answer=D.reference_answer(task.example, task.shown),
                           config=asdict(cfg), nodes=[Node(id=0, parent=None, depth=0)])
        _Search(tree, task, policy, cfg).run()
        answer = tree.best_answer()
        tree.best_accuracy = task.score(answer) if answer is not None else 0.0
        return tree
    finally:
        env.close()


__all__ = [
    "THOUGHT_SYSTEM", "STEPS_HEADER", "THOUGHT_INSTRUCTION", "ROLLOUT_INSTRUCTION", "MCTSConfig", "RolloutRecord",
    "Node", "ThoughtTree", "thought_conversation", "rollout_conversation", "derive_seed", "select", "backup",
    "parse_thought", "search", "tree_metrics",
]
