"""Where a generated reply ends: the first EOS, or the end of the first stop string found on the
decoded text (the cut rule every engine shares, ``vagent.models.engine``'s module docstring), with
a handful of decodes per reply instead of one per token (bench/stop_strings.py)."""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["cut_reply", "find_stop", "find_stop_scan", "stop_window"]


def stop_window(stop_strings: Sequence[str]) -> int:
    """Tokens to decode to see a whole stop string: every token covers at least one byte of it."""
    return max(len(s.encode("utf-8")) for s in stop_strings) + 1


def find_stop(token_ids: Sequence[int], decode: Callable[[list[int]], str], stop_strings: Sequence[str]) -> int | None:
    """Smallest k such that ``decode(token_ids[max(0, k - w):k])`` contains a stop string
    (``w = stop_window``: a stop string ending at token k spans at most that many tokens), else None.

    A handful of decodes instead of one per token: the whole reply is decoded once (no stop string
    in it: None; a window's text is a piece of the whole text, so it holds none either); else the
    first prefix whose text holds one is found by a galloping search back from the end (a reply the
    engine stopped at the stop string: 3 decodes), and the windows are checked from there on. The
    windows before that prefix hold no stop string (their text is a piece of a prefix that holds
    none), so the cut is the token-by-token scan's (:func:`find_stop_scan`; property-tested against
    it on the tiny tokenizer). A stop string with U+FFFD (what a window's cut-off bytes decode to)
    takes the scan.
    """
    if not stop_strings or not token_ids:
        return None
    ids = list(token_ids)
    if any("\ufffd" in s for s in stop_strings):
        return find_stop_scan(ids, decode, stop_strings)

    def holds(k: int) -> bool:  # the text of the first k tokens contains a stop string
        text = decode(ids[:k])
        return any(s in text for s in stop_strings)

    n = len(ids)
    if not holds(n):
        return None
    lo, hi, step = n - 1, n, 1  # invariant: holds(hi); the first prefix holding one is in (lo, hi]
    while lo > 0 and holds(lo):
        hi, step = lo, step * 2
        lo = max(0, n - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return find_stop_scan(ids, decode, stop_strings, start=hi)


def find_stop_scan(token_ids: Sequence[int], decode: Callable[[list[int]], str], stop_strings: Sequence[str],
                   start: int = 1) -> int | None:
    """:func:`find_stop` token by token from k = ``start``: decodes the last ``stop_window`` tokens
    at every k (O(len * window), one decode per token)."""
    if not stop_strings:
        return None
    window = stop_window(stop_strings)
    ids = list(token_ids)
    for k in range(max(1, start), len(ids) + 1):
        text = decode(ids[max(0, k - window):k])
        if any(s in text for s in stop_strings):
            return k
    return None


def cut_reply(
    token_ids: Sequence[int],
    eos_token_ids: Sequence[int],
    decode: Callable[[list[int]], str],
    stop_strings: Sequence[str],
) -> tuple[int, str]:
    """Where a generated id list ends and why: ``(length, finish_reason)``.

    The earliest of: the first EOS (kept, ``"eos"``), the end of the first stop string
    (``"stop"``); otherwise the whole list (``"length"``).
    """
    eos = set(eos_token_ids)
    end = next((i + 1 for i, t in enumerate(token_ids) if t in eos), None)
    stop = find_stop(token_ids[: end if end is not None else len(token_ids)], decode, stop_strings)
    if stop is not None:
        return stop, "stop"
    if end is not None:
        return end, "eos"
    return len(token_ids), "length"
