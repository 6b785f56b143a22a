"""The wire format and the in-process session host (no HTTP)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from tests.service import toyenv  # noqa: F401 - registers svc_toy
from vagent.service.host import SessionHost, to_jsonable
from vagent.service.protocol import (
    FrameError, decode_frames, decode_image, decode_png, encode_frames, encode_image, encode_png, observation_from_wire,
)
from vagent.service.metrics import Metrics


def test_frames_roundtrip_and_reject_corruption():
    parts = [b"\x89PNG-one", b"", b"three" * 100]
    body = encode_frames({"obs": {"text": "a <image> b", "images": [0]}}, parts)
    header, got = decode_frames(body)
    assert got == parts and header["obs"]["images"] == [0] and header["parts"] == [8, 0, 500]
    with pytest.raises(FrameError, match="magic"):
        decode_frames(b"JSON" + body[4:])
    with pytest.raises(FrameError, match="add up"):
        decode_frames(body[:-1])
    with pytest.raises(FrameError, match="overruns"):
        decode_frames(body[:8] + b"{")


@pytest.mark.parametrize("codec", ["png", "raw", "zlib"])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "1", "I;16"])
def test_every_image_codec_is_lossless_for_every_mode(mode, codec):
    rng = np.random.default_rng(1)
    im = Image.fromarray(rng.integers(0, 256, (19, 29, 3), dtype=np.uint8), "RGB").convert(mode)
    part, fmt = encode_image(im, codec)
    assert fmt[0] == ("png" if mode == "P" else codec)  # a palette image travels as PNG whatever the codec
    back = decode_image(part, fmt)
    assert (back.mode, back.size, back.tobytes()) == (im.mode, im.size, im.tobytes())
    if mode == "P":
        assert back.getpalette() == im.getpalette()


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "1", "I;16"])
def test_png_is_lossless_for_every_mode(mode):
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (17, 23, 3), dtype=np.uint8), "RGB").convert(mode)
    for level in (0, 1, 9):
        back = decode_png(encode_png(im, level))
        assert (back.mode, back.size, back.tobytes()) == (im.mode, im.size, im.tobytes())


def test_observation_from_wire_checks_placeholders():
    png = encode_png(Image.new("RGB", (4, 4), (1, 2, 3)))
    obs = observation_from_wire({"text": "x <image>", "images": [0]}, [png])
    assert obs.images[0].getpixel((0, 0)) == (1, 2, 3)
    with pytest.raises(ValueError, match="placeholder"):
        observation_from_wire({"text": "no image here", "images": [0]}, [png])


def test_to_jsonable_documented_conversions():
    out = to_jsonable({"a": (1, 2), "b": np.int64(3), "c": np.array([[1.5]]), "d": math.inf, 4: {1}, "e": None})
    assert out == {"a": [1, 2], "b": 3, "c": [[1.5]], "d": "inf", "4": "{1}", "e": None}


def test_nearest_rank_percentiles():
    assert Metrics._pct([], 0.5) is None
    values = [0.001 * i for i in range(1, 101)]  # 1..100 ms
    assert Metrics._pct(values, 0.50) == pytest.approx(0.050)
    assert Metrics._pct(values, 0.99) == pytest.approx(0.099)
    assert Metrics._pct([0.007], 0.99) == 0.007


def test_host_operations_and_error_mapping():
    host = SessionHost(allowed=("svc_toy",))
    assert host.run(("create", "s", "frozenlake", {}, None, []))[2]["error"] == "UnknownEnv"
    ok, out = host.run(("create", "s", "svc_toy", {"format": "no_think"}, 4, []))
    assert ok == "ok" and out["reset"]["obs"]["images"][0].startswith(b"\x89PNG") and out["solvable"]
    first = host.run(("step", "s", "<answer>Right</answer>", 0))
    assert host.run(("step", "s", "<answer>Right</answer>", 0)) == first  # a retried step: same answer
    assert host.sessions["s"].steps == 1
    err = host.run(("step", "s", "<answer>Right</answer>", 3))
    assert err[1] == 409 and err[2]["error"] == "OutOfOrder"
    boom = host.run(("step", "s", "__boom__", None))
    assert boom[1] == 500 and boom[2]["session_closed"] and "exploded" in boom[2]["detail"] and "s" not in host.sessions
    assert host.run(("state", "s"))[1] == 404
    # a create whose reset raises leaves no session behind
    bad = host.run(("create", "t", "svc_toy", {}, 1, ["__boom__"]))
    assert bad[1] == 500 and "t" not in host.sessions
    # replay restores the same state as stepping
    a = host.run(("create", "a", "svc_toy", {"format": "no_think"}, 9, ["<answer>Left</answer>"] * 3))
    b = SessionHost()
    b.run(("create", "b", "svc_toy", {"format": "no_think"}, 9, []))
    for _ in range(3):
        last = b.run(("step", "b", "<answer>Left</answer>", None))
    assert a[1]["last_step"] == last[1] and host.sessions["a"].steps == 3
    host.close_all()
    assert host.sessions == {}


def test_import_plugins_by_path_and_name(tmp_path):
    import sys

    from vagent.service.host import import_plugins

    from vagent.plugins import PluginImportError

    plugin = tmp_path / "my_plugin_envs.py"
    plugin.write_text("LOADED = True\n")
    import_plugins([str(plugin), "json"])  # as every command imports (vagent.plugins): under its own name
    assert sys.modules["my_plugin_envs"].LOADED
    with pytest.raises(PluginImportError, match="no such file"):
        import_plugins([str(tmp_path / "missing.py")])
