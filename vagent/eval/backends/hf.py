"""Local checkpoints (or tiny model directories) through ``vagent.rollout.HFPolicy``.

The same token-level policy training uses: batched generation, the model's own chat template,
``SamplingConfig`` as in training (temperature 0 = greedy). The runner rolls out
``ModelSpec.batch_size`` episodes per ``rollout`` call so one ``act`` generates for all of them.
Greedy evaluation is reproducible per episode; with sampling the draws depend on the batch (the
engine seeds one generator per batch), as in training.
"""

from __future__ import annotations

from typing import Any


def make_hf_policy(spec: Any) -> Any:
    """An ``HFPolicy`` for a ``ModelSpec`` with ``backend: hf`` (``model`` = a local directory)."""
    from vagent.startup import heavy_imports

    with heavy_imports():  # torch, transformers: out of the garbage collector's walks
        from vagent.rollout.hf_policy import HFPolicy

    kw: dict[str, Any] = {"device": spec.device, "dtype": spec.dtype}
    if spec.gguf_file:
        kw["gguf_file"] = spec.gguf_file
    return HFPolicy.from_pretrained(spec.model, max_context_tokens=spec.max_context_tokens or None, **kw)


__all__ = ["make_hf_policy"]
