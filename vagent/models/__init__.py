"""Models: loading, a tiny VLM builder, chat encoding, the critic, the reference model, generation.

Modules (each importable on its own; names below are re-exported lazily so ``import vagent.models``
stays cheap):

- ``tiny``: ``build_tiny_vlm``, ``build_tiny_lm`` -- random-weight checkpoints for tests.
- ``loading``: ``load_policy`` -> ``LoadedModel``, ``LoraSettings``.
- ``processor``: ``ChatEncoder`` (turn-by-turn encoding without re-encoding), ``EncodedSegment``.
- ``forward``: ``forward_logits``, ``forward_hidden``, ``token_logprobs``, ``token_entropy``.
- ``value``: ``ValueModel``, ``build_critic``, ``reference_model``.
- ``engine``: ``Engine`` protocol, ``HFEngine``, ``SamplingParams``, ``GenerationRequest``,
  ``GenerationOutput``; ``vllm_engine.VLLMEngine`` (vLLM: CUDA build, or the CPU build in .venv-vllm).
- ``cli``: ``vagent model init-tiny`` / ``vagent model info``.
"""

from __future__ import annotations

from vagent.startup import lazy_exports

_EXPORTS = {
    "build_tiny_vlm": "tiny", "build_tiny_lm": "tiny",
    "load_policy": "loading", "LoadedModel": "loading", "LoraSettings": "loading",
    "count_parameters": "loading",
    "ChatEncoder": "processor", "EncodedSegment": "processor", "IMAGE_PLACEHOLDER": "processor",
    "forward_logits": "forward", "forward_hidden": "forward", "token_logprobs": "forward",
    "token_entropy": "forward",
    "ValueModel": "value", "build_critic": "value", "reference_model": "value", "ReferenceModel": "value",
    "Engine": "engine", "HFEngine": "engine", "SamplingParams": "engine",
    "GenerationRequest": "engine", "GenerationOutput": "engine",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, {name: f"vagent.models.{module}" for name, module in _EXPORTS.items()})
