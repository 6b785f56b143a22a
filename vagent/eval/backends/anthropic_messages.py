"""Anthropic Messages API (``POST {base_url}/v1/messages`` through the ``anthropic`` SDK, ``max_retries=0``).

Conversion of the same chat:

- system messages go to the top-level ``system`` string (joined by blank lines; an image in a
  system message is an error: the API takes text only there);
- user/assistant messages become ``{"role", "content": [blocks]}`` with text blocks and image
  blocks ``{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ...}}``
  in placeholder order; consecutive messages of one role are merged (the API requires
  alternation);
- sampling: ``max_tokens`` (required) and ``stop_sequences`` (``stop_mode="server"``;
  whitespace-only stops are not allowed by the API and are dropped). The ``anthropic`` SDK 2.x
  ``messages.create`` takes no temperature/top_p/top_k (current Claude models fix them), so they
  are sent only with ``send_sampling: true``, in ``extra_body`` (``temperature``; ``top_p`` when
  < 1; ``top_k`` when > 0) for endpoints that still accept them.

The reply is the concatenated text blocks. ``stop_reason``: ``stop_sequence`` -> ``"stop"`` with
the matched ``stop_sequence`` re-appended (the API strips it and says which one matched),
``end_turn`` -> ``"eos"``, ``max_tokens`` -> ``"length"``, anything else kept by name. Usage:
``input_tokens`` -> ``prompt_tokens``, ``output_tokens`` -> ``completion_tokens``.
"""

from __future__ import annotations

from typing import Any

from vagent.eval.backends.common import ApiError, ApiPolicy, deadline_http_client, http_package, interleave, \
    png_base64, split_system, stop_reply, token_usage
from vagent.eval.backends.openai_chat import sdk_error
from vagent.rollout.policy import Conversation, Message, Reply, SamplingConfig

_STOP_REASONS = {"stop_sequence": "stop", "end_turn": "eos", "max_tokens": "length"}


def _blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for piece in interleave(message):
        if isinstance(piece, str):
            out.append({"type": "text", "text": piece})
        else:
            out.append({"type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": png_base64(piece)}})
    return out


def conversation_to_anthropic(conversation: Conversation) -> tuple[str, list[dict[str, Any]]]:
    """(system string, messages) of a conversation in the Messages API format."""
    system, rest = split_system(conversation, "Anthropic takes no images in the system prompt; move them to a user "
                                               "message.")
    messages: list[dict[str, Any]] = []
    for m in rest:
        blocks = _blocks(m)
        if messages and messages[-1]["role"] == m.role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": m.role, "content": blocks})
    return system, messages


class AnthropicMessagesAdapter:
    """Sends one conversation to the Anthropic Messages API (module docstring)."""

    backend = "anthropic"

    def __init__(self, model: str, *, base_url: str | None, api_key: str, timeout_s: float = 60.0,
                 stop_mode: str = "server", send_sampling: bool = False):
        import anthropic

        self._sdk = anthropic
        self.model, self.stop_mode, self.send_sampling = model, stop_mode, send_sampling
        http = deadline_http_client(timeout_s, http_package(anthropic.DefaultHttpxClient))  # timeout_s: whole request
        self.client = anthropic.Anthropic(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0,
                                          http_client=http)

    def request(self, conversation: Conversation, sampling: SamplingConfig) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for this conversation."""
        system, messages = conversation_to_anthropic(conversation)
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": int(sampling.max_new_tokens)}
        if system:
            kw["system"] = system
        if self.send_sampling:
            extra: dict[str, Any] = {"temperature": float(sampling.temperature)}
            if sampling.top_p < 1.0:
                extra["top_p"] = float(sampling.top_p)
            if sampling.top_k > 0:
                extra["top_k"] = int(sampling.top_k)
            kw["extra_body"] = extra
        stops = [s for s in sampling.stop if s.strip()]
        if self.stop_mode == "server" and stops:
            kw["stop_sequences"] = stops
        return kw

    def send(self, conversation: Conversation, sampling: SamplingConfig) -> Reply:
        kw = self.request(conversation, sampling)
        try:
            msg = self.client.messages.create(**kw)
        except self._sdk.AnthropicError as exc:
            err = sdk_error(exc, self._sdk)
            if err is None:
                raise
            raise err from exc
        if msg.content is None:
            raise ApiError(f"the answer has no content: {msg!r}"[:500], kind="bad_response")
        text = "".join(getattr(b, "text", "") for b in msg.content if getattr(b, "type", "") == "text")
        reason = msg.stop_reason or "end_turn"
        finish = _STOP_REASONS.get(reason, reason)
        matched = msg.stop_sequence if reason == "stop_sequence" else None
        usage = token_usage(msg.usage.input_tokens, msg.usage.output_tokens) if msg.usage is not None else {}
        return stop_reply(text, finish, sampling, self.stop_mode, stopped=False, matched=matched, usage=usage)

    def close(self) -> None:
        self.client.close()


def make_anthropic_policy(spec: Any) -> ApiPolicy:
    """An :class:`ApiPolicy` for a ``ModelSpec`` with ``backend: anthropic``."""
    adapter = AnthropicMessagesAdapter(spec.model, base_url=spec.resolved_base_url(), api_key=spec.resolved_api_key(),
                                       timeout_s=spec.timeout_s, stop_mode=spec.stop_mode,
                                       send_sampling=bool(spec.send_sampling))
    return ApiPolicy.from_spec(adapter, spec)


__all__ = ["AnthropicMessagesAdapter", "make_anthropic_policy", "conversation_to_anthropic"]
