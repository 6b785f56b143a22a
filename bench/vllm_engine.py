"""VLLMEngine's own numbers on this machine: start-up, parity with HFEngine, weight-push time, and
what ``VLLMEngine.generate`` costs beside vLLM's own ``llm.generate``.

    .venv-vllm/bin/python bench/vllm_engine.py [--part all|parity|cost] [--pushes 5] [--rounds 5] [--json FILE]

``parity``: for each tiny family (qwen2_5_vl, qwen3_vl; hidden 128, 2 layers, weights re-drawn with
``vagent.models.tiny.redraw_weights`` so that replies depend on the image): the seconds of
``import vllm`` (first family only) and of building the engine (``VLLMEngine``, fp32, 256 MiB KV
cache); greedy replies (12 tokens) to 8 prompts with 96 px images from vLLM and from ``HFEngine``:
how many are equal and the largest |log-prob difference|; then the median seconds of ``--pushes``
weight pushes (``update_weights`` of the trainer's model, including the cache reset).

``cost``: one engine on the tiny Qwen2.5-VL, 32 FrozenLake first-turn prompts (a 96 px image each,
encoded as the rollout encodes them), 64 new tokens, sampled (T 0.7, a seed per request) and
greedy, and sampled with the stop string ``</answer>`` (vLLM then detokenizes, as in training);
``--rounds`` rounds (after a warm-up), the calls alternated within each round, median
seconds of: ``llm.generate`` asked for no log-probs, ``llm.generate`` asked only for the sampled
token's log-prob (``logprobs=0``, otherwise ``VLLMEngine``'s sampling parameters),
``VLLMEngine.generate`` (its requests built, the log-probs corrected for the placeholder bias,
replies cut and decoded), and the engine's earlier log-prob request (top-2 + the placeholder ids,
as dicts, corrected token by token; without the cut and decode); checks that ``VLLMEngine`` records the same log-probs as the per-token
correction over vLLM's dict log-probs (``unsuppressed_logprob``, the engine's earlier path) and
prints how far the correction moves them.

The throughput comparison vLLM vs HF on rollouts is bench/rollout_engines.py. Build .venv-vllm
first (scripts/vllm-env).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
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
    engine.start()
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


def frozenlake_requests(encoder, n: int):
    """``n`` FrozenLake first-turn prompts (96 px image) encoded as the rollout encodes them."""
    from vagent.models.engine import GenerationRequest
    from vagent.rollout.canary import build_probe
    from vagent.rollout.trajectory import EnvSpec

    env = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 96, "description_style": "symbolic"}
    probe, _ = build_probe([EnvSpec("frozenlake", env, 1000 + s) for s in range(n)], encoder, n=n)
    return [GenerationRequest(p.input_ids, p.pixel_values, p.image_grid_thw, images=p.images) for p in probe]


def dict_path_logprobs(engine, outs, params) -> list[list[float]]:
    """The placeholder-corrected log-probs from vLLM's dict log-probs, token by token
    (``unsuppressed_logprob``): the reference ``VLLMEngine``'s vectorised path must equal."""
    from vagent.models.vllm_logprobs import unsuppressed_logprob

    temperature = params.temperature if params.do_sample else 1.0
    rows = []
    for out in outs:
        c = out.outputs[0]
        rows.append([unsuppressed_logprob(step[t].logprob, [step[s].logprob for s in engine.suppress_token_ids
                                                             if s in step and s != t], temperature)
                     for t, step in zip(c.token_ids, c.logprobs)])
    return rows


def vllm_params(engine, params, seeds, mode: str):
    """``VLLMEngine``'s sampling parameters for ``seeds`` with the log-prob request replaced:
    "none" (no log-probs), "sampled" (the sampled token's only), "dict" (the sampled token's and the
    placeholders', as dicts)."""
    out = []
    for seed in seeds:
        sp = engine._sampling(params, seed).clone()
        sp.flat_logprobs = False
        if mode == "dict":
            sp.logprobs = len(engine.suppress_token_ids)
        else:
            sp.logprobs, sp.logprob_token_ids = (None if mode == "none" else 0), None
        out.append(sp)
    return out


def measure_cost(workdir: Path, rounds: int) -> dict:
    """The ``cost`` part (module docstring)."""
    from vagent.models.engine import SamplingParams
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm, redraw_weights
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(workdir / "cost", family="qwen2_5_vl", seed=0)
    loaded = load_policy(path)
    redraw_weights(loaded.model, seed=1)
    loaded.model.save_pretrained(path)
    engine = VLLMEngine(path, loaded.encoder, dtype="float32", kv_cache_memory_bytes=256 << 20, max_model_len=4096)
    reqs = frozenlake_requests(loaded.encoder, 32)
    prompts = [engine._prompt(i, r) for i, r in enumerate(reqs)]
    seeds = list(range(100, 100 + len(reqs)))
    reqs = [replace(r, seed=s) for r, s in zip(reqs, seeds)]
    rows = {}
    try:
        for label, params in (("sampled", SamplingParams(do_sample=True, temperature=0.7, max_new_tokens=64)),
                              ("greedy", SamplingParams(do_sample=False, max_new_tokens=64)),
                              ("sampled, stop </answer>", SamplingParams(do_sample=True, temperature=0.7, max_new_tokens=64,
                                                                         stop_strings=("</answer>",)))):
            calls = {"vLLM, no log-probs": lambda: engine.llm.generate(prompts, vllm_params(engine, params, seeds, "none"), use_tqdm=False),
                     "vLLM, sampled token's log-prob": lambda: engine.llm.generate(prompts, vllm_params(engine, params, seeds, "sampled"), use_tqdm=False),
                     "VLLMEngine.generate": lambda: engine.generate(reqs, params),
                     "earlier request (top-k + ids as dicts), per-token correction": lambda: dict_path_logprobs(
                         engine, engine.llm.generate(prompts, vllm_params(engine, params, seeds, "dict"), use_tqdm=False),
                         params)}
            times: dict[str, list[float]] = {k: [] for k in calls}
            for r in range(rounds + 1):  # round 0: warm-up
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    if r:
                        times[name].append(time.perf_counter() - t0)
            got = engine.generate(reqs, params)
            ref_outs = engine.llm.generate(prompts, vllm_params(engine, params, seeds, "dict"), use_tqdm=False)
            ref = dict_path_logprobs(engine, ref_outs, params)
            biased = [[float(step[t].logprob) for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                      for o in ref_outs]
            same_ids = all(g.token_ids == list(o.outputs[0].token_ids)[:len(g.token_ids)] for g, o in zip(got, ref_outs))
            diff = max(abs(a - b) for g, r in zip(got, ref) for a, b in zip(g.logprobs, r))
            moved = max(abs(a - b) for r, b_ in zip(ref, biased) for a, b in zip(r, b_))
            med = {k: statistics.median(v) for k, v in times.items()}
            base = med["vLLM, sampled token's log-prob"]
            rows[label] = {"tokens": sum(len(o.outputs[0].token_ids) for o in ref_outs),
                           "median_s": {k: round(v, 4) for k, v in med.items()},
                           "vs_sampled_logprob": {k: round(base / v, 3) for k, v in med.items()},
                           "same_ids_as_dict_path": same_ids, "max_abs_diff_vs_dict_path": diff,
                           "max_correction": moved}
    finally:
        engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["all", "parity", "cost"], default="all")
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of the cost part")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    import vllm

    import_s = time.perf_counter() - t0
    result: dict = {"cpu": cpu_name(), "load_average": [round(x, 2) for x in os.getloadavg()], "vllm": vllm.__version__,
                    "import_vllm_s": round(import_s, 1)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "parity"):
            result["rows"] = [measure(family, Path(tmp), args.pushes) for family in ("qwen2_5_vl", "qwen3_vl")]
        if args.part in ("all", "cost"):
            result["cost"] = measure_cost(Path(tmp), args.rounds)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
