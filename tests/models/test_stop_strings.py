"""The stop-string cut (find_stop / cut_reply) with few decodes gives exactly the cut of the
token-by-token scan, on random ids of the tiny tokenizer (special tokens, cut UTF-8 bytes, added tags)."""

from __future__ import annotations

import random

import pytest

from vagent.models.stops import cut_reply, find_stop, find_stop_scan, stop_window


def old_find_stop(token_ids, decode, stop_strings):
    """find_stop as it was: one decode of the last stop_window tokens at every token."""
    if not stop_strings:
        return None
    window = stop_window(stop_strings)
    ids = list(token_ids)
    for k in range(1, len(ids) + 1):
        text = decode(ids[max(0, k - window):k])
        if any(s in text for s in stop_strings):
            return k
    return None


@pytest.fixture(scope="module")
def tokenizer(tiny_vlm):
    return tiny_vlm.encoder.tokenizer


class Counting:
    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def __call__(self, ids):
        self.calls += 1
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_same_cut_as_the_scan_on_random_ids(tokenizer):
    decode = Counting(tokenizer)
    rng = random.Random(0)
    vocab = len(tokenizer)
    tags = tokenizer.convert_tokens_to_ids(["<answer>", "</answer>", "<think>", "</think>"])
    hits = 0
    for case in range(1500):
        n = rng.randint(1, 60)
        # mostly ordinary ids, some special ids (0..6, skipped in the text), some reasoning tags
        ids = [rng.choice(tags) if rng.random() < 0.05 else rng.randrange(7) if rng.random() < 0.05
               else rng.randrange(vocab) for _ in range(n)]
        text = decode(ids)
        stops = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.5 and text:  # a piece of the reply's text: it is found
                i = rng.randrange(len(text))
                stops.append(text[i:i + rng.randint(1, 6)])
            elif kind < 0.7:
                stops.append("</answer>")
            else:  # the text of a random id: found or not
                stops.append(decode([rng.randrange(vocab)]) or "zz")
        stops = tuple(s for s in stops if s) or ("</answer>",)
        expected = old_find_stop(ids, decode, stops)
        assert find_stop(ids, decode, stops) == expected, (case, ids, stops)
        hits += expected is not None
    assert hits > 500  # most cases do cut


def test_few_decodes_for_a_reply_stopped_at_its_stop_string(tokenizer):
    ids = tokenizer.encode("<think>the goal is below</think><answer>down, right</answer>", add_special_tokens=False)
    decode = Counting(tokenizer)
    assert find_stop(ids, decode, ("</answer>",)) == len(ids) == find_stop_scan(ids, decode, ("</answer>",))
    decode.calls = 0
    assert find_stop(ids, decode, ("</answer>",)) == len(ids)
    assert decode.calls <= 4  # the scan: one per token
    decode.calls = 0
    assert cut_reply(ids, [2], decode, ("zzz",)) == (len(ids), "length") and decode.calls == 1
