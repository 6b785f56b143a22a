"""cut_reply with the stop string ``</answer>``: the token-by-token scan (``find_stop_scan``, what
``cut_reply`` ran before) vs ``find_stop`` (a few decodes), on a batch of 32 replies of the tiny
tokenizer as engines return them: stopped at ``</answer>`` (HF and vLLM stop there), and cut by
``max_new_tokens`` without one. Prints ms per batch of each and their ratio, machine named.

    python bench/stop_strings.py [--replies 32] [--tokens 96] [--rounds 20]
"""

from __future__ import annotations

import argparse
import platform
import random
import tempfile
import time

import vagent.models.stops as stops
from common import cpu_name
from vagent.models.loading import load_policy
from vagent.models.tiny import build_tiny_vlm

WORDS = "the goal is below and to the right of the player , hole above left down up".split()


def replies(tokenizer, n: int, tokens: int, stopped: bool, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = "<think><observation>" + " ".join(rng.choice(WORDS) for _ in range(200)) + "</observation></think>"
        ids = tokenizer.encode(text, add_special_tokens=False)
        if stopped:
            tail = tokenizer.encode("<answer>down, right</answer>", add_special_tokens=False)
            ids = ids[:tokens - len(tail)] + tail
        out.append(ids[:tokens])
    return out


def batch_ms(rows, eos, decode, scan: bool, rounds: int) -> float:
    find = stops.find_stop
    if scan:  # cut_reply as before: the scan from the first token
        stops.find_stop = stops.find_stop_scan
    try:
        t0 = time.perf_counter()
        for _ in range(rounds):
            cuts = [stops.cut_reply(r, eos, decode, ("</answer>",)) for r in rows]
        return (time.perf_counter() - t0) / rounds * 1e3, cuts
    finally:
        stops.find_stop = find


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replies", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    loaded = load_policy(build_tiny_vlm(tempfile.mkdtemp(), seed=0))
    tok = loaded.encoder.tokenizer

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    print(f"machine: {platform.processor() or platform.machine()} ({cpu_name()}); {args.replies} replies x "
          f"{args.tokens} tokens, stop string </answer>, {args.rounds} rounds")
    for stopped in (True, False):
        rows = replies(tok, args.replies, args.tokens, stopped)
        before, cuts_before = batch_ms(rows, loaded.encoder.eos_token_ids, decode, True, args.rounds)
        after, cuts_after = batch_ms(rows, loaded.encoder.eos_token_ids, decode, False, args.rounds)
        assert cuts_before == cuts_after, "the cuts differ"
        label = "stopped at </answer>" if stopped else "no stop string (length)"
        print(f"{label:26s} scan {before:8.2f} ms/batch   find_stop {after:6.2f} ms/batch   {before / after:6.1f}x "
              f"(same cuts: {cuts_after[0]})")


if __name__ == "__main__":
    main()
