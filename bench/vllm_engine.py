"""VLLMEngine's own numbers on this machine: start-up, parity with HFEngine, weight-push time.

    .venv-vllm/bin/python bench/vllm_engine.py [--pushes 5] [--json FILE]

For each tiny family (qwen2_5_vl, qwen3_vl; hidden 128, 2 layers, weights re-drawn with
``vagent.models.tiny.redraw_weights`` so that replies depend on the image): the seconds of
``import vllm`` (first family only) and of building the engine (``VLLMEngine``, fp32, 256 MiB KV
cache); greedy replies (12 tokens) to 8 prompts with 96 px images from vLLM and from ``HFEngine``:
how many are equal and the largest |log-prob difference|; then the median seconds of ``--pushes``
weight pushes (``update_weights`` of the trainer's model, including the cache reset). The
throughput comparison vLLM vs HF is bench/rollout_engines.py. Build .venv-vllm first
(scripts/vllm-env).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def prompts(encoder, n: int):
    import numpy as np
    from PIL import Image

    from vagent.models.engine import GenerationRequest

    out = []
    for i in range(n):
        image = Image.fromarray(np.random.default_rng(i).integers(0, 256, (96, 96, 3), dtype=np.uint8))
        seg = encoder.encode_user("Where is the goal? <image>", [image])
        ids = list(encoder.encode_system("You are an agent.").input_ids) + list(seg.input_ids)
        out.append(GenerationRequest(ids, seg.pixel_values, seg.image_grid_thw, images=(image,)))
    return out


def measure(family: str, workdir: Path, pushes: int) -> dict:
    from vagent.models.engine import HFEngine, SamplingParams
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm, redraw_weights
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(workdir / family, family=family, seed=0)
    loaded = load_policy(path)
    redraw_weights(loaded.model, seed=1)
    loaded.model.save_pretrained(path)
    t0 = time.perf_counter()
    engine = VLLMEngine(path, loaded.encoder, dtype="float32", kv_cache_memory_bytes=256 << 20, max_model_len=2048)
    start_s = time.perf_counter() - t0
    greedy = SamplingParams(do_sample=False, max_new_tokens=12)
    reqs = prompts(loaded.encoder, 8)
    want, got = HFEngine(loaded.model, loaded.encoder).generate(reqs, greedy), engine.generate(reqs, greedy)
    equal = sum(a.token_ids == b.token_ids for a, b in zip(want, got))
    delta = max(abs(x - y) for a, b in zip(want, got) for x, y in zip(a.logprobs, b.logprobs))
    times = []
    for _ in range(pushes):
        t0 = time.perf_counter()
        engine.update_weights(loaded.model)
        times.append(time.perf_counter() - t0)
    engine.close()
    return {"family": family, "engine_start_s": round(start_s, 1), "greedy_equal": f"{equal}/{len(reqs)}",
            "distinct_replies": len({tuple(a.token_ids) for a in want}), "max_abs_logprob_delta": delta,
            "push_s_median": round(statistics.median(times), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    import vllm

    import_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("qwen2_5_vl", "qwen3_vl"):
            rows.append(measure(family, Path(tmp), args.pushes))
    result = {"cpu": cpu_name(), "vllm": vllm.__version__, "import_vllm_s": round(import_s, 1), "rows": rows}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
