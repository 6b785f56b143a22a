"""The wire protocol of the env service: typed request/response models and the binary framing.

Server (:mod:`vagent.service.server`) and client (:mod:`vagent.service.client`) import the same
pydantic models, so a field renamed on one side is renamed on the other.

Framing (``application/vnd.vagent.frames``): a response that carries observations is one JSON
header followed by the PNG files of its images, raw, never base64::

    b"VAGF"                 4 bytes, magic and version
    uint32 big-endian       H, the header length in bytes
    H bytes                 the JSON header (UTF-8); its "parts" lists the length of each part
    part 0 | part 1 | ...   the PNG bytes, in order, back to back

An observation in the header names its images by index into the parts
(``{"text": "... <image> ...", "images": [0]}``). Requests are plain JSON (replies are text).
Errors are JSON :class:`ErrorBody` with the HTTP status of :data:`ERROR_STATUS`.

Image codecs. The request header ``X-Vagent-Images`` (:data:`IMAGES_HEADER`) picks how the
parts hold pixels; every codec is lossless:

- ``png`` (the default): PNG files (``--png-level``); ~3.3 ms to encode and decode a 256 px
  image, a few KB;
- ``raw``: the pixel bytes (``Image.tobytes``), ~0.2 ms, ``w*h*channels`` bytes: the choice on
  one host (loopback), where bytes are free and CPU is not;
- ``zlib``: the pixel bytes compressed with zlib level 1, ~0.8 ms, about PNG's size: the choice
  across a network.

With ``raw`` or ``zlib`` the observation lists each image's format,
``"formats": [["raw", "RGB", 256, 256], ...]`` (``["png"]`` for an image whose mode cannot travel
as bytes, e.g. a palette image); without ``formats`` every part is a PNG.
"""

from __future__ import annotations

import io
import ipaddress
import json
import struct
import zlib
from typing import Any

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, Strict
from typing_extensions import Annotated

from vagent.envs.base import Observation

#: media type of framed responses (JSON header + PNG parts)
FRAMES_MEDIA_TYPE = "application/vnd.vagent.frames"
#: request header that picks the image codec of the response's parts (see the module docstring)
IMAGES_HEADER = "X-Vagent-Images"
IMAGE_CODECS = ("png", "raw", "zlib")
#: modes whose pixels round-trip through tobytes/frombytes (others, e.g. palette "P", go as PNG)
_BYTES_MODES = frozenset({"1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16"})
MAGIC = b"VAGF"
API_PREFIX = "/v1"
#: the most items one batch request may hold
MAX_BATCH = 1024
#: env names, session ids and seeds are bounded so that no request can ask for absurd work
MAX_NAME = 128
MAX_SEED = 2**63 - 1
#: integers are strict: JSON true/false or "3" are rejected (422), not read as 1/0/3
Int = Annotated[int, Strict()]

# HTTP status of each error type (the ``error`` field of ErrorBody). The client maps the types
# back to exceptions (EnvError -> EnvError, EpisodeOverError -> EpisodeOverError, ...).
ERROR_STATUS: dict[str, int] = {
    "Unauthorized": 401,          # missing or wrong bearer token
    "UnknownSession": 404,        # expired, closed, or the server restarted: the client replays
    "NotFound": 404,              # no such route
    "MethodNotAllowed": 405,
    "EnvError": 409,              # the env was used wrongly (e.g. step before reset)
    "EpisodeOverError": 409,      # step after the episode ended: reset first
    "OutOfOrder": 409,            # a step index that is neither the next step nor a retry of the last
    "NotSupported": 409,          # e.g. optimal_actions on an env without a solver
    "ConfigMismatch": 409,        # a create's config_hash is not this server's resolved config: try another
    "PayloadTooLarge": 413,
    "ValidationError": 422,       # malformed JSON, wrong types, out-of-range values
    "ConfigError": 422,           # the env config was rejected by the env's declared Config
    "UnknownEnv": 422,            # the env name is not registered or not served here
    "EnvException": 500,          # the env raised: the error text is in ``detail``
    "Busy": 503,                  # max sessions reached, or a worker is restarting (Retry-After)
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------- requests


class CreateRequest(_Strict):
    """Create a session of ``env`` with ``config``; with ``seed``, reset it in the same round trip.

    ``replay`` (needs ``seed``): replies to step right after the reset, in order; the response then
    carries the last step's result. The client uses it to restore a lost episode in one request.

    ``config_hash`` (optional): the :func:`config_hash` the session must have, i.e. the one the
    episode (or the RemoteEnv) started with. A server whose operator config resolves ``config``
    to another env config answers 409 ``ConfigMismatch`` (with its resolved ``config``) and
    creates nothing, so a replay never continues an episode under another config.
    """

    env: str = Field(min_length=1, max_length=MAX_NAME)
    config: dict[str, Any] = Field(default_factory=dict)
    seed: Int | None = Field(default=None, ge=0, le=MAX_SEED)
    replay: list[str] = Field(default_factory=list, max_length=100_000)
    config_hash: str | None = Field(default=None, min_length=1, max_length=64)


class ResetRequest(_Strict):
    seed: Int = Field(ge=0, le=MAX_SEED)


class StepRequest(_Strict):
    """One reply. ``index`` (optional) is the step's 0-based position in the episode: a retry of a
    step the server already applied (same index) returns the stored result instead of stepping
    twice, and any other mismatch is a 409 ``OutOfOrder``; without it the step is applied as is."""

    response: str
    index: Int | None = Field(default=None, ge=0, le=10_000_000)


class BatchCreateRequest(_Strict):
    items: list[CreateRequest] = Field(min_length=1, max_length=MAX_BATCH)


class BatchResetItem(_Strict):
    session_id: str = Field(min_length=1, max_length=MAX_NAME)
    seed: Int = Field(ge=0, le=MAX_SEED)


class BatchResetRequest(_Strict):
    items: list[BatchResetItem] = Field(min_length=1, max_length=MAX_BATCH)


class BatchStepItem(_Strict):
    session_id: str = Field(min_length=1, max_length=MAX_NAME)
    response: str
    index: Int | None = Field(default=None, ge=0, le=10_000_000)


class BatchStepRequest(_Strict):
    items: list[BatchStepItem] = Field(min_length=1, max_length=MAX_BATCH)


class BatchCloseRequest(_Strict):
    session_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)


# --------------------------------------------------------------------------------- responses


class ObservationOut(BaseModel):
    """An observation in a frame header: ``images`` are indices into the frame's binary parts."""

    text: str
    images: list[int] = Field(default_factory=list)
    #: per image: ["png"], or [codec ("raw"/"zlib"), mode, width, height]; absent = all PNG
    formats: list[list[Any]] | None = None


class ResetOut(BaseModel):
    obs: ObservationOut
    info: dict[str, Any] = Field(default_factory=dict)


class StepOut(BaseModel):
    obs: ObservationOut
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(default_factory=dict)


class CreateOut(BaseModel):
    """A new session. ``reset`` is set when the request had a seed and no replay; ``last_step``
    when it had a replay (the result of its last reply), so the client can check the restore."""

    session_id: str
    env: str
    solvable: bool = False
    #: the env's resolved config, action_names, action_sep and judge_spec (see host.env_spec)
    spec: dict[str, Any] = Field(default_factory=dict)
    #: :func:`config_hash` of the env name and ``spec["config"]`` (what a restore must match)
    config_hash: str = ""
    reset: ResetOut | None = None
    last_step: StepOut | None = None


class ErrorBody(BaseModel):
    """Every error: ``error`` is a type of :data:`ERROR_STATUS`, ``detail`` says what and how to
    fix it; ``session_closed`` is true when the server closed the session because of the error."""

    error: str
    detail: str
    session_closed: bool = False
    #: ``ConfigMismatch`` only: this server's resolved env config (the client names the fields that differ)
    config: dict[str, Any] | None = None


class ItemResult(BaseModel):
    """One item of a batch: exactly one of ``ok`` (a CreateOut/ResetOut/StepOut/{} as JSON) and
    ``error`` is set; ``status`` is the HTTP status the item would have had on its own."""

    status: int = 200
    ok: dict[str, Any] | None = None
    error: ErrorBody | None = None


class BatchOut(BaseModel):
    results: list[ItemResult]


class SystemPromptOut(BaseModel):
    system_prompt: str


class StateOut(BaseModel):
    state: dict[str, Any]


class OptimalActionsOut(BaseModel):
    actions: list[str]


class ClosedOut(BaseModel):
    closed: bool


class EnvsOut(BaseModel):
    envs: list[str]


class ConfigFieldOut(BaseModel):
    """One field of an env's declared Config (as ``vagent envs NAME`` lists it)."""

    name: str
    type: str
    default: Any = None
    doc: str = ""


class EnvInfoOut(BaseModel):
    """What a trainer needs to know about a served env class before any session exists
    (``GET /v1/envs/{name}``): the env may live only on the server."""

    name: str
    #: the first line of the env module's docstring (or the class name)
    description: str
    #: strings that end a reply besides ``</answer>`` (the class's ``reply_stop``)
    reply_stop: list[str] = Field(default_factory=list)
    action_names: list[str] = Field(default_factory=list)
    action_sep: str = ","
    #: the declared config fields a client may set (server-only fields left out)
    config_fields: list[ConfigFieldOut] = Field(default_factory=list)


class HealthOut(BaseModel):
    status: str
    version: str
    sessions: int
    workers: int
    worker_pids: list[int] = Field(default_factory=list)


# ----------------------------------------------------------------------------------- framing


def config_hash(env: str, config: dict[str, Any]) -> str:
    """16 hex digits of sha256 over the env name and its resolved config as canonical JSON (sorted
    keys): equal for two servers exactly when their sessions of ``env`` run under the same config.

    ``config`` is the session spec's config (``CreateOut.spec["config"]``): server-only fields
    (data folders, modules) are not in it, since their paths may differ between machines serving
    the same data; the replayed observations are still compared with the original ones."""
    import hashlib

    blob = json.dumps([env, config], sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (anything else, 0.0.0.0 included, is exposed)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def encode_png(image: Image.Image, compress_level: int = 1) -> bytes:
    """PNG bytes of ``image`` (lossless at every level; level 1 is ~3x faster to encode than 6)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def decode_png(data: bytes) -> Image.Image:
    """A PIL image from PNG bytes, fully loaded (same mode and pixels as the encoded image)."""
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def encode_image(image: Image.Image, codec: str, png_level: int = 1) -> tuple[bytes, list[Any]]:
    """(part bytes, format entry) of ``image`` in ``codec`` (png, raw, zlib); lossless."""
    if codec == "png" or image.mode not in _BYTES_MODES:
        return encode_png(image, png_level), ["png"]
    data = image.tobytes()
    if codec == "zlib":
        data = zlib.compress(data, 1)
    return data, [codec, image.mode, image.width, image.height]


def decode_image(part: bytes, fmt: list[Any] | None) -> Image.Image:
    """The image of one part, given its format entry (None or ["png"]: a PNG file)."""
    if not fmt or fmt[0] == "png":
        return decode_png(part)
    codec, mode, width, height = fmt
    if codec == "zlib":
        part = zlib.decompress(part)
    elif codec != "raw":
        raise FrameError(f"unknown image codec {codec!r}; known: {', '.join(IMAGE_CODECS)}")
    return Image.frombytes(str(mode), (int(width), int(height)), part)


def encode_frames(header: dict[str, Any], parts: list[bytes]) -> bytes:
    """The framed body: magic, header length, JSON header (with ``parts`` lengths), the parts."""
    header = dict(header, parts=[len(p) for p in parts])
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([MAGIC, struct.pack(">I", len(head)), head, *parts])


class FrameError(ValueError):
    """A framed body is malformed (wrong magic, truncated, lengths that do not add up)."""


def decode_frames(body: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """Split a framed body into its JSON header and its binary parts (checks every length)."""
    if len(body) < 8 or body[:4] != MAGIC:
        raise FrameError(f"not a vagent frame: expected magic {MAGIC!r}, got {body[:4]!r}")
    (hlen,) = struct.unpack(">I", body[4:8])
    if 8 + hlen > len(body):
        raise FrameError(f"frame header of {hlen} bytes overruns the {len(body)}-byte body")
    header = json.loads(body[8 : 8 + hlen])
    lengths = header.get("parts", [])
    pos, parts = 8 + hlen, []
    for n in lengths:
        parts.append(body[pos : pos + n])
        pos += n
    if pos != len(body):
        raise FrameError(f"frame parts add up to {pos} bytes but the body has {len(body)}")
    return header, parts


def observation_from_wire(obs: dict[str, Any] | ObservationOut, parts: list[bytes]) -> Observation:
    """Rebuild an :class:`Observation` from its header entry and the frame's PNG parts."""
    if isinstance(obs, ObservationOut):
        text, idx, formats = obs.text, obs.images, obs.formats
    else:
        text, idx, formats = obs["text"], obs.get("images", []), obs.get("formats")
    formats = formats or [None] * len(idx)
    return Observation(text=text, images=tuple(decode_image(parts[i], f) for i, f in zip(idx, formats)))
