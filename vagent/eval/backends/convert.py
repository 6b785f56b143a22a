"""Conversation conversion helpers shared by the API adapters: images as PNG, ``<image>``
placeholders interleaved, the system prompt apart, and the stop strings that APIs strip put back.
"""

from __future__ import annotations

import base64
import io
from typing import Sequence

from PIL import Image

from vagent.envs.base import IMAGE_PLACEHOLDER
from vagent.rollout.policy import Conversation, Message, Reply, SamplingConfig


def encode_png(image: Image.Image) -> bytes:
    """The image as PNG bytes (RGBA/RGB/L kept; other modes converted to RGB)."""
    if image.mode not in ("RGB", "RGBA", "L", "LA"):
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def png_base64(image: Image.Image) -> str:
    return base64.b64encode(encode_png(image)).decode("ascii")


def interleave(message: Message) -> list[str | Image.Image]:
    """The message as text pieces and images in order (``<image>`` placeholders replaced).

    Empty text pieces are dropped. ValueError if the placeholder count differs from the images.
    """
    pieces = message.text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != len(message.images):
        raise ValueError(
            f"{message.role} message has {len(pieces) - 1} '{IMAGE_PLACEHOLDER}' placeholder(s) but "
            f"{len(message.images)} image(s); put exactly one placeholder per image, in order."
        )
    out: list[str | Image.Image] = []
    for i, piece in enumerate(pieces):
        if piece:
            out.append(piece)
        if i < len(message.images):
            out.append(message.images[i])
    return out


def split_system(conversation: Conversation, refusal: str) -> tuple[str, list[Message]]:
    """The system messages' texts joined by a blank line, and the other messages in order, for APIs
    that take the system prompt apart and as text only: ValueError(``refusal``) for a system message
    with images."""
    system: list[str] = []
    rest: list[Message] = []
    for m in conversation.messages:
        if m.role != "system":
            rest.append(m)
        elif m.images:
            raise ValueError(refusal)
        else:
            system.append(m.text)
    return "\n\n".join(system), rest


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """``text`` cut right after the earliest stop string, and that string (None if none occurs)."""
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i != -1 and (best is None or i + len(s) < best[0] + len(best[1])):
            best = (i, s)
    if best is None:
        return text, None
    return text[: best[0] + len(best[1])], best[1]


def _stop_plausible(text: str, stop: str) -> bool:
    """A closing tag ``</x>`` is restored only when ``<x>`` is open at the end of the text."""
    if stop.startswith("</") and stop.endswith(">"):
        opener = "<" + stop[2:]
        return text.rfind(opener) > text.rfind(stop)
    return True


def restore_stop(text: str, stops: Sequence[str], *, stopped: bool, matched: str | None = None) -> str:
    """The reply as the model wrote it up to and including the stop string.

    APIs strip the stop sequence they matched. ``matched`` is that sequence when the API says
    (Anthropic); otherwise, when the API reports a stop (``stopped``: OpenAI ``finish_reason ==
    "stop"``, Gemini ``STOP``) and exactly one configured stop string is plausible (a closing
    tag only while its opening tag is open), that one is appended. Known limit: the OpenAI and
    Gemini wire formats do not distinguish a stop-sequence match from an end-of-sequence token,
    so a reply that ended right after an unclosed ``<answer>`` gets ``</answer>`` appended; use
    ``stop_mode="client"`` where that matters. The text is also cut at the first stop string
    (for servers that ignore ``stop``).
    """
    text, found = cut_at_stop(text, stops)
    if found is not None:
        return text
    if matched:
        return text + matched
    if stopped:
        candidates = [s for s in stops if s and _stop_plausible(text, s)]
        if len(candidates) == 1:
            return text + candidates[0]
    return text


def stop_reply(text: str, finish: str, sampling: SamplingConfig, stop_mode: str, *, stopped: bool,
               matched: str | None = None, usage: dict[str, int] | None = None) -> Reply:
    """The :class:`Reply` of an API answer: with ``stop_mode="server"`` the stop string the API cut
    off is put back (:func:`restore_stop`); with ``"client"`` the text is cut at the first stop
    string here and ``finish`` becomes ``"stop"`` when one was found."""
    if stop_mode == "server":
        text = restore_stop(text, sampling.stop, stopped=stopped, matched=matched)
    else:
        text, found = cut_at_stop(text, sampling.stop)
        finish = "stop" if found else finish
    return Reply(text=text, finish_reason=finish, usage=usage or {})


def token_usage(prompt: int | None, completion: int | None) -> dict[str, int]:
    """``{"prompt_tokens", "completion_tokens"}`` from an API's counts (None counts as 0)."""
    return {"prompt_tokens": int(prompt or 0), "completion_tokens": int(completion or 0)}
