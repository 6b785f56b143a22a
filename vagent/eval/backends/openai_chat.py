"""OpenAI-compatible chat completions (OpenAI, Azure, vLLM, SGLang, Together, ``transformers serve``).

Wire format (``POST {base_url}/chat/completions`` through the official ``openai`` SDK, with the
SDK's retries off: ``max_retries=0``):

- the system message is ``{"role": "system", "content": text}``;
- a message with images has ``content`` = a list of parts in the order of its ``<image>``
  placeholders: ``{"type": "text", "text": ...}`` and
  ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``; a message without
  images has plain string content (what text-only servers expect);
- sampling: ``temperature`` and ``top_p`` (only when < 1; neither with ``send_sampling: false``), ``max_tokens`` (or
  ``max_completion_tokens``, see ``ModelSpec.max_tokens_param``), ``stop`` (``stop_mode="server"``),
  ``seed`` (only with ``send_seed``). ``top_k`` has no OpenAI parameter and is not sent.

The reply: ``choices[0].message.content``. Servers with a reasoning parser (``transformers
serve`` for Qwen models, vLLM/SGLang ``--reasoning-parser``) move ``<think>...</think>`` out of the
content into ``reasoning_content`` (or ``reasoning``); with ``restore_think`` (default) the adapter
puts it back as ``<think>{reasoning}</think>`` before the content, so the env parses the reply the
model wrote (the reasoning formats need the ``<think>`` block). ``finish_reason`` ``stop`` -> ``"stop"`` (stop string
restored, see :func:`vagent.eval.backends.common.restore_stop`), ``length`` -> ``"length"``,
anything else (``content_filter``, ``tool_calls``) -> that name; usage from ``usage``.
"""

from __future__ import annotations

from typing import Any

from vagent.eval.backends.common import ApiError, ApiPolicy, deadline_http_client, http_package, interleave, \
    kind_of_status, parse_retry_after, png_base64, stop_reply, token_usage
from vagent.rollout.policy import Conversation, Message, Reply, SamplingConfig


def message_to_openai(message: Message) -> dict[str, Any]:
    """One chat message in the OpenAI wire format (images as PNG data URLs, in placeholder order)."""
    if not message.images:
        return {"role": message.role, "content": message.text}
    parts: list[dict[str, Any]] = []
    for piece in interleave(message):
        if isinstance(piece, str):
            parts.append({"type": "text", "text": piece})
        else:
            parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_base64(piece)}})
    return {"role": message.role, "content": parts}


def sdk_error(exc: Exception, sdk: Any) -> ApiError | None:
    """An :class:`ApiError` for an ``openai``/``anthropic`` SDK exception (same class shapes); None if foreign."""
    if isinstance(exc, sdk.APITimeoutError):
        return ApiError(f"timed out: {exc}", kind="timeout")
    if isinstance(exc, sdk.APIConnectionError):
        return ApiError(f"connection failed: {exc}", kind="connection")
    if isinstance(exc, sdk.APIStatusError):
        headers = getattr(getattr(exc, "response", None), "headers", None)
        return ApiError(str(exc), kind=kind_of_status(exc.status_code), status=exc.status_code,
                        retry_after=parse_retry_after(headers))
    if isinstance(exc, sdk.APIError):
        return ApiError(str(exc), kind="bad_response")
    return None


def _with_reasoning(text: str, message: Any) -> str:
    """``<think>{reasoning}</think>`` + text when the server split the reasoning off (module docstring)."""
    extra = getattr(message, "model_extra", None) or {}
    for field_name in ("reasoning_content", "reasoning"):
        value = extra.get(field_name)
        if isinstance(value, str) and value.strip() and "<think>" not in text:
            return f"<think>{value}</think>{text}"
    return text


class OpenAIChatAdapter:
    """Sends one conversation to an OpenAI-compatible chat endpoint (module docstring)."""

    backend = "openai"

    def __init__(self, model: str, *, base_url: str | None, api_key: str, timeout_s: float = 60.0,
                 stop_mode: str = "server", max_tokens_param: str = "max_tokens", send_seed: bool = False,
                 restore_think: bool = True, send_sampling: bool = True):
        import openai

        self._sdk = openai
        self.model, self.stop_mode = model, stop_mode
        self.max_tokens_param, self.send_seed, self.restore_think = max_tokens_param, send_seed, restore_think
        self.send_sampling = send_sampling
        http = deadline_http_client(timeout_s, http_package(openai.DefaultHttpxClient))  # timeout_s: whole request
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0,
                                    http_client=http)

    def request(self, conversation: Conversation, sampling: SamplingConfig) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for this conversation."""
        kw: dict[str, Any] = {
            "model": self.model,
            "messages": [message_to_openai(m) for m in conversation.messages],
            self.max_tokens_param: int(sampling.max_new_tokens),
        }
        if self.send_sampling:
            kw["temperature"] = float(sampling.temperature)
        if self.send_sampling and sampling.top_p < 1.0:
            kw["top_p"] = float(sampling.top_p)
        if self.stop_mode == "server" and sampling.stop:
            kw["stop"] = list(sampling.stop)
        if self.send_seed:
            kw["seed"] = int(sampling.seed)
        return kw

    def send(self, conversation: Conversation, sampling: SamplingConfig) -> Reply:
        kw = self.request(conversation, sampling)
        try:
            completion = self.client.chat.completions.create(**kw)
        except self._sdk.OpenAIError as exc:
            err = sdk_error(exc, self._sdk)
            if err is None:
                raise
            raise err from exc
        if not completion.choices:
            raise ApiError(f"the answer has no choices: {completion!r}"[:500], kind="bad_response")
        choice = completion.choices[0]
        text = choice.message.content or ""
        if self.restore_think:
            text = _with_reasoning(text, choice.message)
        finish = choice.finish_reason or "stop"
        cu = completion.usage
        usage = token_usage(cu.prompt_tokens, cu.completion_tokens) if cu is not None else {}
        return stop_reply(text, finish, sampling, self.stop_mode, stopped=finish == "stop", usage=usage)

    def close(self) -> None:
        self.client.close()


def make_openai_policy(spec: Any) -> ApiPolicy:
    """An :class:`ApiPolicy` for a ``ModelSpec`` with ``backend: openai``."""
    adapter = OpenAIChatAdapter(
        spec.model, base_url=spec.resolved_base_url(), api_key=spec.resolved_api_key(), timeout_s=spec.timeout_s,
        stop_mode=spec.stop_mode, max_tokens_param=spec.max_tokens_param, send_seed=spec.send_seed,
        restore_think=spec.restore_think, send_sampling=spec.send_sampling is not False,
    )
    return ApiPolicy.from_spec(adapter, spec)


__all__ = ["OpenAIChatAdapter", "make_openai_policy", "message_to_openai", "sdk_error"]
