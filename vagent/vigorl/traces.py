"""Linearise MCTS trees into grounded reasoning chains and write them as SFT chats.

Chains of one tree (:func:`tree_chains`):

- ``direct``: the correct completion reached by the best path. Walking
  ``ThoughtTree.best_path()`` from its deepest node up, the first node that answered correctly
  (a terminal thought) or has a correct, well-formed rollout gives the chain: the thoughts on its
  path, then the rollout's thinking, then its answer. If the best path has none, the correct
  completion of the highest-value node anywhere is used. A tree without any correct completion,
  or whose correct chain cites no point, gives no chain (counted as ``traces/unsolved_trees``).
- ``backtrack``: a wrong attempt, the phrase ``"Wait, this seems off. Let's try something else."``,
  then the correct attempt. The wrong attempt branches off the direct chain's path at depth d:
  a sibling of the path's node at depth d with a LOWER value (lowest first), followed by one of
  its wrong rollouts' thinking (or nothing, for a wrong terminal thought); after the phrase the
  chain resumes with the path from depth d. So the chain reads: shared steps, wrong branch,
  "Wait...", correct branch, answer. (ViGoRL restarts the whole chain after the phrase; we keep
  the shared prefix once.) Up to ``n_backtrack`` such chains, distinct texts only.

Chats (:func:`write_traces`): each chain becomes one line of the SFT chat format of
``vagent.recipes.sft`` (``{"messages", "images", "meta"}``) built by PLAYING the env: the system
prompt and every user message are the env's own ``system_prompt()`` and observations for the
tree's env config and seed (docs/algorithms.md reference bug 9: SFT prompts equal RL prompts), and each reply is
stepped through the env, whose reward and success go into ``meta``.

- ``vigorl_search``: one reply ``<think>step step ...</think><answer>A</answer>``.
- ``vigorl_zoom``: every step that cites a point ends a turn with a zoom tool call on that point,
  while zooms remain; the env's crop is the next user message; the backtracking phrase opens the
  next turn's thinking; the last turn answers (its thinking: the steps after the last zoom, or a
  sentence confirming the last zoom).

Images are written once each, named by the sha256 of their PNG bytes, in ``<out stem>_images/``
next to the JSONL file (paths in ``images`` are relative to it).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from vagent.vigorl.grounding import ToolCall, find_points, render_reply
from vagent.vigorl.mcts import Node, ThoughtTree

BACKTRACK_MESSAGE = "Wait, this seems off. Let's try something else."


@dataclass
class LinearizeConfig:
    """How trees become chains."""

    #: the phrase between a wrong attempt and the correct one (ViGoRL's)
    backtrack_message: str = BACKTRACK_MESSAGE
    #: most backtracking chains per tree (wrong branches from lower-value siblings of the best path)
    n_backtrack: int = 2
    #: also write the direct (correct-only) chain of each tree
    include_direct: bool = True


@dataclass
class Step:
    """One piece of a chain's thinking; ``point`` is its first cited point (None for the phrase)."""

    text: str
    point: tuple[int, int] | None = None


@dataclass
class Chain:
    """A linear reasoning chain: ``kind`` "direct" or "backtrack", its steps and the final answer;
    ``nodes`` are the tree nodes it went through, in order."""

    kind: str
    steps: list[Step]
    answer: str
    nodes: list[int] = field(default_factory=list)
    #: backtrack chains: [the lower-value sibling it leaves, the best-path node it resumes with]
    branch: list[int] = field(default_factory=list)

    @property
    def think(self) -> str:
        return " ".join(s.text for s in self.steps if s.text)


def _steps(texts: Iterable[str], width: int, height: int) -> list[Step]:
    out = []
    for t in texts:
        t = " ".join(str(t).split())
        if not t:
            continue
        valid, _ = find_points(t, width, height)
        out.append(Step(t, valid[0] if valid else None))
    return out


def _correct_completion(node: Node) -> tuple[str, str] | None:
    """(thinking after the node, answer) of the node's first correct completion, else None."""
    if node.terminal:
        return ("", node.answer) if (node.reward or 0) >= 1 else None
    for r in node.rollouts:
        if r.reward >= 1 and r.format_ok:
            return r.continuation, r.answer
    return None


def _wrong_completion(node: Node) -> str | None:
    """The thinking of the node's first wrong, well-formed completion ("" for a wrong terminal)."""
    if node.terminal:
        return "" if (node.reward or 0) < 1 else None
    for r in node.rollouts:
        if r.reward < 1 and r.format_ok:
            return r.continuation
    return None


def _direct(tree: ThoughtTree) -> tuple[list[Node], str, str] | None:
    """(path, continuation, answer) of the direct chain (see the module docstring)."""
    for node in reversed(tree.best_path()):
        done = _correct_completion(node)
        if done is not None:
            return tree.path(node.id), done[0], done[1]
    ranked = sorted(tree.nodes[1:], key=lambda n: (-n.value, -n.depth, n.id))
    for node in ranked:
        done = _correct_completion(node)
        if done is not None:
            return tree.path(node.id), done[0], done[1]
    return None


def tree_chains(tree: ThoughtTree, cfg: LinearizeConfig | None = None) -> list[Chain]:
    """The chains of one tree: [direct] + up to ``n_backtrack`` backtracking chains."""
    cfg = cfg or LinearizeConfig()
    w, h = tree.shown_size
    found = _direct(tree)
    if found is None:
        return []
    path, continuation, answer = found
    right = [n.thought for n in path] + [continuation]
    if not any(s.point is not None for s in _steps(right, w, h)):
        return []  # an ungrounded chain (e.g. a first thought that just answered) teaches nothing here
    chains = []
    if cfg.include_direct:
        chains.append(Chain("direct", _steps(right, w, h), answer, [n.id for n in path]))
    candidates = []
    for d, node in enumerate(path):
        parent = tree.nodes[node.parent]
        for sid in parent.children:
            sib = tree.nodes[sid]
            if sid == node.id or sib.visits == 0 or sib.value >= node.value:
                continue
            wrong = _wrong_completion(sib)
            if wrong is not None:
                candidates.append((sib.value, sib.id, d, sib, wrong))
    seen = {chains[0].think} if chains else set()
    for _, _, d, sib, wrong in sorted(candidates, key=lambda c: (c[0], c[1])):
        if len([c for c in chains if c.kind == "backtrack"]) >= cfg.n_backtrack:
            break
        prefix = [n.thought for n in path[:d]]
        texts = prefix + [sib.thought, wrong]
        steps = _steps(texts, w, h) + [Step(cfg.backtrack_message)] + _steps(right[d:], w, h)
        chain = Chain("backtrack", steps, answer, [n.id for n in path[:d]] + [sib.id] + [n.id for n in path[d:]],
                      branch=[sib.id, path[d].id])
        if chain.think not in seen and sib.thought.strip() != path[d].thought.strip():
            seen.add(chain.think)
            chains.append(chain)
    return chains


# ---------------------------------------------------------------------------------------------
# Chats through the env
# ---------------------------------------------------------------------------------------------

class _ImageStore:
    """Writes PNGs by content hash under ``folder`` and returns paths relative to ``root``."""

    def __init__(self, root: Path, folder: Path):
        self.root, self.folder = root, folder
        folder.mkdir(parents=True, exist_ok=True)

    def save(self, image: Any) -> str:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        data = buf.getvalue()
        path = self.folder / f"{hashlib.sha256(data).hexdigest()[:20]}.png"
        if not path.exists():
            path.write_bytes(data)
        return path.relative_to(self.root).as_posix()


def _zoom_turns(chain: Chain, max_zooms: int) -> list[tuple[str, tuple[int, int] | None]]:
    """(thinking, zoom point or None for the answer turn) per turn of a multi-turn chat: the first
    ``max_zooms`` steps citing a point each end a turn with a zoom there; the answer turn holds the
    remaining steps, or a sentence confirming the last zoom."""
    turns, pending = [], []
    zoomable = [i for i, s in enumerate(chain.steps) if s.point is not None][:max_zooms]
    for i, step in enumerate(chain.steps):
        pending.append(step.text)
        if i in zoomable:
            turns.append((" ".join(pending), step.point))
            pending = []
    if not pending and turns:
        x, y = turns[-1][1]
        pending = [f"The zoomed view around ({x}, {y}) confirms it."]
    turns.append((" ".join(pending) or "I have what I need.", None))
    return turns


def env_config_for(env_name: str, config: dict, overrides: dict | None = None) -> dict:
    """``config`` restricted to the keys env ``env_name`` declares (a vigorl_zoom tree's zoom keys
    are dropped for vigorl_search chats), then ``overrides``."""
    import dataclasses

    from vagent.envs import env_class

    names = {f.name for f in dataclasses.fields(env_class(env_name).Config)}
    return {**{k: v for k, v in config.items() if k in names}, **(overrides or {})}


def chain_chat(tree: ThoughtTree, chain: Chain, env_name: str, store: _ImageStore,
               env_config: dict | None = None) -> dict[str, Any]:
    """One SFT chat record of ``chain`` played through env ``env_name`` (the tree's config and seed)."""
    from vagent.envs import make

    config = env_config_for(env_name, tree.env_config) if env_config is None else dict(env_config)
    env = make(env_name, **config)
    try:
        obs, _ = env.reset(tree.seed)
        if list(env.task.shown) != list(tree.shown_size):
            raise ValueError(f"env {env_name} shows {list(env.task.shown)} px but the tree was searched at "
                             f"{tree.shown_size} px: linearise with the same image_size as the search.")
        messages = [{"role": "system", "content": env.system_prompt()}]
        images: list[str] = []

        def user(o) -> None:
            messages.append({"role": "user", "content": o.text})
            images.extend(store.save(im) for im in o.images)

        user(obs)
        if env_name == "vigorl_zoom":
            turns = _zoom_turns(chain, env.config.max_zooms)
        else:
            turns = [(chain.think, None)]
        result = None
        for think, point in turns:
            if point is None:
                reply = render_reply(think, answer=chain.answer)
            else:
                reply = render_reply(think, tool_call=ToolCall("search_coordinate", int(point[0]), int(point[1])))
            result = env.step(reply)
            messages.append({"role": "assistant", "content": reply})
            if point is not None:
                user(result.obs)
        meta = {"env_name": env_name, "env_config": config, "seed": tree.seed, "kind": chain.kind,
                "reward": float(result.reward), "success": bool(result.info.get("success")),
                "format_ok": bool(result.info.get("episode_format_ok", result.info.get("format_ok"))),
                "tree_nodes": chain.nodes, "branch": chain.branch}
        return {"messages": messages, "images": images, "meta": meta}
    finally:
        env.close()


def read_trees(path: str | Path) -> list[ThoughtTree]:
    """Trees from a JSONL file written by ``vagent vigorl mcts`` (one tree per line)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"tree file {str(path)!r} does not exist; write it with `vagent vigorl mcts`.")
    out = []
    for no, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(ThoughtTree.from_dict(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{p}:{no}: not a tree record ({exc}).") from exc
    return out


def write_traces(trees: Sequence[ThoughtTree], out_path: str | Path, env_name: str | None = None,
                 cfg: LinearizeConfig | None = None, keep_failed: bool = False,
                 env_overrides: dict | None = None) -> dict[str, float]:
    """Write the chats of ``trees`` to ``out_path`` (JSONL) and its images folder; returns metrics.

    ``env_name``: vigorl_search or vigorl_zoom (default: each tree's env); the env config is the
    tree's (:func:`env_config_for`) updated with ``env_overrides``; it must equal the RL env's
    config for the prompts to match. A chat whose final env step did not succeed with a correct
    format is dropped unless ``keep_failed`` (it would mean the chain and the env disagree;
    counted in ``traces/env_failures``).
    """
    cfg = cfg or LinearizeConfig()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    store = _ImageStore(out.parent, out.parent / f"{out.stem}_images")
    lines, counts = [], {"direct": 0, "backtrack": 0, "unsolved": 0, "failures": 0}
    for tree in trees:
        chains = tree_chains(tree, cfg)
        if not chains:
            counts["unsolved"] += 1
            continue
        for chain in chains:
            name = env_name or tree.env
            rec = chain_chat(tree, chain, name, store, env_config_for(name, tree.env_config, env_overrides))
            if not (rec["meta"]["success"] and rec["meta"]["format_ok"]):
                counts["failures"] += 1
                if not keep_failed:
                    continue
            counts[chain.kind] += 1
            lines.append(json.dumps(rec))
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + ("\n" if lines else ""))
    tmp.replace(out)
    return {
        "traces/trees": float(len(trees)), "traces/chats": float(len(lines)),
        "traces/direct": float(counts["direct"]), "traces/backtrack": float(counts["backtrack"]),
        "traces/unsolved_trees": float(counts["unsolved"]), "traces/env_failures": float(counts["failures"]),
    }


__all__ = ["BACKTRACK_MESSAGE", "LinearizeConfig", "Step", "Chain", "tree_chains", "env_config_for", "chain_chat",
           "read_trees",
           "write_traces"]
