"""Bytes and seconds per weight push of a LoRA policy: the adapter alone against the whole model, in
one run on the same engine.

- ``--part hf`` (the main venv; Ray): one HF engine replica (``RemoteEngine``) of the default run's
  tiny Qwen3-VL with LoRA (``model.lora_rank`` 16 on every attention and MLP projection): the
  adapter push (``update_weights``: the ``lora_`` tensors only) against a push of the full state.
- ``--part vllm`` (``.venv-vllm/bin/python``): the in-process ``VLLMEngine`` built with ``lora_rank``
  (``update_adapter``: PEFT files + a ``LoRARequest``) against one built without it (merged weights
  through vLLM's in-place reload).

Each push is timed ``--rounds`` times (median). The 7B figures are extrapolated from parameter
counts (Qwen2.5-VL-7B: 28 layers, hidden 3584, MLP 18944, 4 KV heads of 128; 8.29e9 parameters;
LoRA r=16 on q/k/v/o/gate/up/down of the language model), labelled as such: bytes scale with the
parameters pushed, a push's time with its bytes once the fixed cost is small.

Run:  PYTHONPATH=. .venv/bin/python bench/lora_push.py --part hf
      PYTHONPATH=. .venv-vllm/bin/python bench/lora_push.py --part vllm
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

from common import median_s

QWEN25_VL_7B_PARAMS = 8.29e9
#: r x (in + out) per adapted projection of one layer, x 28 layers (the module docstring)
LORA_7B_PARAMS = 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3) * 28


def tiny_policy(root: Path, r: int = 16):
    from vagent.models.loading import LoraSettings, apply_lora, load_policy
    from vagent.models.tiny import build_tiny_vlm

    path = build_tiny_vlm(root / "tiny", family="qwen3_vl", hidden=128, layers=3, image_size=128)
    loaded = load_policy(path)
    policy = apply_lora(copy.deepcopy(loaded.model), LoraSettings(r=r, alpha=32, dropout=0.0))
    return path, loaded, policy


def nbytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def part_hf(rounds: int) -> None:
    from vagent.models.remote import RemoteEngine, pushed_state, start_ray

    root = Path(tempfile.mkdtemp(prefix="vagent-lora-push-"))
    _, loaded, policy = tiny_policy(root)
    ray = start_ray(num_cpus=2)
    try:
        engine = RemoteEngine(policy, loaded.encoder, replicas=1)
        adapter, full = pushed_state(policy), {k: v.detach() for k, v in policy.get_base_model().state_dict().items()}
        t_adapter = median_s(lambda: engine.update_weights(policy), rounds)
        t_full = median_s(lambda: engine.update_state(full), rounds)
        report("hf replica (Ray)", nbytes(adapter), nbytes(full), t_adapter, t_full)
        engine.close()
    finally:
        ray.shutdown()


def part_vllm(rounds: int) -> None:
    from vagent.models.vllm_engine import VLLMEngine
    from vagent.models.vllm_weights import weights_to_push

    root = Path(tempfile.mkdtemp(prefix="vagent-lora-push-"))
    path, loaded, policy = tiny_policy(root)
    kw = dict(dtype="float32", kv_cache_memory_bytes=256 << 20, max_model_len=2048)
    with_adapters = VLLMEngine(path, loaded.encoder, lora_rank=16, **kw)
    t_adapter = median_s(lambda: with_adapters.update_weights(policy), rounds)
    adapter_bytes = with_adapters.stats["adapter_bytes"]
    with_adapters.close()
    merged_engine = VLLMEngine(path, loaded.encoder, **kw)
    merged = dict(weights_to_push(policy))
    t_full = median_s(lambda: merged_engine.update_weights(policy), rounds)
    merged_engine.close()
    report("vLLM in process (CPU build)", adapter_bytes, nbytes(merged), t_adapter, t_full)


def report(where: str, adapter: int, full: int, t_adapter: float, t_full: float) -> None:
    print(f"\n| engine | adapter push | whole-model push | bytes ratio | s / push adapter | s / push whole | "
          f"time ratio |\n|---|---|---|---|---|---|---|\n| {where} | {adapter / 1e6:.2f} MB | {full / 1e6:.2f} MB | "
          f"{full / adapter:.0f}x | {t_adapter:.3f} | {t_full:.3f} | {t_full / t_adapter:.1f}x |")
    print(f"7B (extrapolated from parameter counts, bf16): adapter {LORA_7B_PARAMS * 2 / 1e6:.0f} MB "
          f"({LORA_7B_PARAMS / 1e6:.1f}M parameters) vs whole model {QWEN25_VL_7B_PARAMS * 2 / 1e9:.1f} GB: "
          f"{QWEN25_VL_7B_PARAMS / LORA_7B_PARAMS:.0f}x fewer bytes per push")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    (part_hf if args.part == "hf" else part_vllm)(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
