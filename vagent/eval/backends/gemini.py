"""Gemini through the ``google-genai`` SDK (``POST {base_url}/v1beta/models/{model}:generateContent``).

The SDK's retries stay off (``HttpRetryOptions(attempts=1)``); ``timeout_s`` becomes the SDK's
``HttpOptions.timeout`` (milliseconds). Conversion of the same chat:

- system messages -> ``system_instruction`` (text only, joined by blank lines);
- user -> role ``user``, assistant -> role ``model``; parts are text parts and inline PNG parts
  (``Part.from_bytes(data=png, mime_type="image/png")``) in placeholder order; consecutive
  messages of one role are merged;
- sampling: ``temperature``, ``top_p`` (< 1), ``top_k`` (> 0) (none with ``send_sampling: false``), ``max_output_tokens``,
  ``stop_sequences`` (``stop_mode="server"``), ``seed`` (only with ``send_seed``).

The reply is the text of the first candidate's parts (thought parts excluded). ``finish_reason``
``STOP`` -> ``"stop"`` (stop string restored as for OpenAI: the API does not say whether a stop
sequence matched), ``MAX_TOKENS`` -> ``"length"``, others (``SAFETY``, ``RECITATION``, ...) ->
their lower-case name; the env then reads whatever text came back (usually none: an invalid
turn, a model failure rather than an API error). A response without candidates (a blocked
prompt) is a ``bad_response`` error. Usage: ``prompt_token_count`` -> ``prompt_tokens``,
``candidates_token_count + thoughts_token_count`` -> ``completion_tokens`` (both are billed as
output).
"""

from __future__ import annotations

from typing import Any

from vagent.eval.backends.common import ApiError, ApiPolicy, deadline_http_client, encode_png, interleave, \
    kind_of_status, parse_retry_after, split_system, stop_reply, token_usage
from vagent.rollout.policy import Conversation, Reply, SamplingConfig


def _transport_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(timeout exception classes, other transport exception classes) of httpx and httpx2."""
    timeouts, transport = [], []
    for name in ("httpx", "httpx2"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        timeouts.append(mod.TimeoutException)
        transport.append(mod.TransportError)
    return tuple(timeouts), tuple(transport)


def conversation_to_gemini(conversation: Conversation) -> tuple[str, list[Any]]:
    """(system instruction, contents as ``google.genai.types.Content``) of a conversation."""
    from google.genai import types

    system, rest = split_system(conversation, "Gemini's system_instruction takes text only; move images to a user "
                                               "message.")
    contents: list[Any] = []
    for m in rest:
        parts = [types.Part(text=p) if isinstance(p, str) else types.Part.from_bytes(data=encode_png(p),
                                                                                    mime_type="image/png")
                 for p in interleave(m)]
        role = "model" if m.role == "assistant" else "user"
        if contents and contents[-1].role == role:
            contents[-1].parts.extend(parts)
        else:
            contents.append(types.Content(role=role, parts=parts))
    return system, contents


class GeminiAdapter:
    """Sends one conversation to the Gemini API (module docstring)."""

    backend = "gemini"

    def __init__(self, model: str, *, base_url: str | None, api_key: str, timeout_s: float = 60.0,
                 stop_mode: str = "server", send_seed: bool = False, send_sampling: bool = True):
        from google import genai
        from google.genai import errors, types

        self._errors = errors
        self._timeouts, self._transport = _transport_errors()
        self.model, self.stop_mode, self.send_seed = model, stop_mode, send_seed
        self.send_sampling = send_sampling
        http = types.HttpOptions(base_url=base_url, timeout=int(timeout_s * 1000),
                                 retry_options=types.HttpRetryOptions(attempts=1),
                                 httpx_client=deadline_http_client(timeout_s))  # timeout_s: the whole request
        self.client = genai.Client(api_key=api_key, http_options=http)

    def request(self, conversation: Conversation, sampling: SamplingConfig) -> dict[str, Any]:
        """The keyword arguments of ``models.generate_content`` for this conversation."""
        from google.genai import types

        system, contents = conversation_to_gemini(conversation)
        cfg: dict[str, Any] = {"max_output_tokens": int(sampling.max_new_tokens)}
        if system:
            cfg["system_instruction"] = system
        if self.send_sampling:
            cfg["temperature"] = float(sampling.temperature)
            if sampling.top_p < 1.0:
                cfg["top_p"] = float(sampling.top_p)
            if sampling.top_k > 0:
                cfg["top_k"] = int(sampling.top_k)
        if self.stop_mode == "server" and sampling.stop:
            cfg["stop_sequences"] = list(sampling.stop)
        if self.send_seed:
            cfg["seed"] = int(sampling.seed)
        return {"model": self.model, "contents": contents, "config": types.GenerateContentConfig(**cfg)}

    def _classify(self, exc: Exception) -> ApiError | None:
        if isinstance(exc, self._errors.APIError):
            code = int(exc.code or 0)
            headers = getattr(getattr(exc, "response", None), "headers", None)
            return ApiError(str(exc), kind=kind_of_status(code) if code else "bad_response", status=code or None,
                            retry_after=parse_retry_after(headers))
        if isinstance(exc, self._timeouts):
            return ApiError(f"timed out: {exc!r}", kind="timeout")
        if isinstance(exc, self._transport):
            return ApiError(f"connection failed: {exc!r}", kind="connection")
        return None

    def send(self, conversation: Conversation, sampling: SamplingConfig) -> Reply:
        kw = self.request(conversation, sampling)
        try:
            resp = self.client.models.generate_content(**kw)
        except Exception as exc:
            err = self._classify(exc)
            if err is None:
                raise
            raise err from exc
        if not resp.candidates:
            feedback = getattr(resp, "prompt_feedback", None)
            raise ApiError(f"the answer has no candidates (prompt feedback: {feedback})", kind="bad_response")
        cand = resp.candidates[0]
        parts = (cand.content.parts if cand.content is not None else None) or []
        text = "".join(p.text for p in parts if p.text and not getattr(p, "thought", False))
        reason = str(getattr(cand.finish_reason, "value", cand.finish_reason) or "STOP")
        finish = {"STOP": "stop", "MAX_TOKENS": "length"}.get(reason, reason.lower())
        usage = {}
        um = resp.usage_metadata
        if um is not None and um.prompt_token_count is not None:
            usage = token_usage(um.prompt_token_count, int(um.candidates_token_count or 0) + int(um.thoughts_token_count or 0))
        return stop_reply(text, finish, sampling, self.stop_mode, stopped=reason == "STOP", usage=usage)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


def make_gemini_policy(spec: Any) -> ApiPolicy:
    """An :class:`ApiPolicy` for a ``ModelSpec`` with ``backend: gemini``."""
    adapter = GeminiAdapter(spec.model, base_url=spec.resolved_base_url(), api_key=spec.resolved_api_key(),
                            timeout_s=spec.timeout_s, stop_mode=spec.stop_mode, send_seed=spec.send_seed,
                            send_sampling=spec.send_sampling is not False)
    return ApiPolicy.from_spec(adapter, spec)


__all__ = ["GeminiAdapter", "make_gemini_policy", "conversation_to_gemini"]
