"""The SVG env: similarity math by hand, guarded rendering, the oracle, the judge vocabulary."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vagent.config import ConfigError
from vagent.envs import EnvError, EpisodeOverError, env_factory, make
from vagent.envs.checker import check_env
from vagent.envs.formats import render_response
from vagent.envs.svg import LEGEND, SVGEnv, describe_state, extract_svg, parse_svg_response
from vagent.envs.svg.render import (
    _WORKER, MAX_REF_CHARS, RendererUnavailable, RenderLimits, cairosvg_available, check_svg, render_svg, resolve_renderer, worker_starts,
)
from vagent.envs.svg.shapes import cell_of, position_phrase
from vagent.envs.svg.similarity import (
    SimilarityConfig, box_mean, dilate, dominant_colour, edge_iou, feature_encoder_available, feature_similarity,
    pixel_similarity, relative_pixel_similarity, similarity, sobel_edges, sobel_magnitude, ssim,
)
from vagent.rewards.rule import rule_score
from vagent.rollout import EnvSpec, SamplingConfig, SolverPolicy, rollout

HAS_CAIRO = cairosvg_available()[0]
needs_cairo = pytest.mark.skipif(not HAS_CAIRO, reason=f"cairosvg does not import ({cairosvg_available()[1]}): "
                                 "pip install cairosvg and apt-get install -y libcairo2")
BLANK = '<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96"/>'


def reply(fmt: str, answer: str) -> str:
    text = "a description"
    return render_response(fmt, {"think": text, "observation": text, "reasoning": text, "prediction": text,
                                 "answer": answer})


def _fast(**kw):
    """An env config that renders in-process (no worker), for speed where timeouts are not tested."""
    return make("svg", render_timeout_s=0, **kw)


# ---------------------------------------------------------------------------------------------
# Similarity functions on tiny arrays, by hand
# ---------------------------------------------------------------------------------------------

def test_pixel_similarities_by_hand():
    a = np.zeros((2, 2, 3))
    b = a.copy()
    b[0, 0, 0] = 255  # one of 12 values differs by 255
    assert pixel_similarity(a, b) == pytest.approx(1 - 1 / 12)
    assert pixel_similarity(np.zeros((1, 1, 3)), np.full((1, 1, 3), 255.0)) == 0.0
    # target: 3 grey pixels (100) and one red pixel (200, 0, 0); dominant colour grey
    t = np.full((2, 2, 3), 100.0)
    t[1, 1] = (200, 0, 0)
    assert dominant_colour(t).tolist() == [100, 100, 100]
    base = (100 + 100 + 100) / 12  # MAE of the flat grey image: |200-100| + |0-100| + |0-100| over 12 values
    flat = np.full_like(t, 100.0)
    assert relative_pixel_similarity(t, flat) == 0.0
    assert relative_pixel_similarity(t, t) == 1.0
    half = flat.copy()
    half[1, 1] = (150, 50, 50)  # half way: MAE = 150 / 12 = base / 2
    assert relative_pixel_similarity(t, half) == pytest.approx(0.5)
    assert relative_pixel_similarity(t, np.full_like(t, 255.0)) == 0.0  # worse than flat: clipped
    assert base == pytest.approx(25.0)
    # a flat target falls back to the plain similarity
    assert relative_pixel_similarity(flat, b[:, :, :] * 0 + 100) == 1.0


def test_box_mean_and_ssim_by_hand():
    x = np.arange(9, dtype=float).reshape(3, 3)
    assert box_mean(x, 2).tolist() == [[2.0, 3.0], [5.0, 6.0]]  # (0+1+3+4)/4, ...
    assert ssim(np.full((4, 4, 1), 7.0), np.full((4, 4, 1), 7.0), win=3) == pytest.approx(1.0)
    # two flat images: only the luminance term is left, (2 mu_a mu_b + C1) / (mu_a^2 + mu_b^2 + C1)
    c1 = (0.01 * 255) ** 2
    expect = (2 * 100 * 150 + c1) / (100 ** 2 + 150 ** 2 + c1)
    assert ssim(np.full((5, 5, 1), 100.0), np.full((5, 5, 1), 150.0), win=3) == pytest.approx(expect)
    # a checkerboard and its inverse: equal means, covariance = -variance -> SSIM < 0 -> clipped to 0
    board = (np.indices((6, 6)).sum(0) % 2 * 255.0)[:, :, None]
    assert ssim(board, 255.0 - board, win=3) == 0.0


def test_sobel_edges_dilation_and_edge_iou_by_hand():
    step = np.zeros((3, 5, 1))
    step[:, 3:] = 100.0  # a vertical step between columns 2 and 3
    mag = sobel_magnitude(step)
    assert mag[:, 2].tolist() == [100.0] * 3 and mag[:, 3].tolist() == [100.0] * 3  # (1+2+1) * 100 / 4
    assert mag[:, [0, 1, 4]].max() == 0.0
    assert sobel_edges(step, 100.0)[:, 2:4].all() and not sobel_edges(step, 100.1).any()
    dot = np.zeros((5, 5), dtype=bool)
    dot[2, 2] = True
    assert dilate(dot, 1).sum() == 9 and dilate(dot, 1)[1:4, 1:4].all() and dilate(dot, 0).sum() == 1
    a = np.zeros((1, 4), dtype=bool)
    b = a.copy()
    a[0, [0, 1]] = True
    b[0, [1, 2]] = True
    assert edge_iou(a, b, tolerance=0) == pytest.approx(1 / 3)  # |{1}| / |{0, 1, 2}|
    assert edge_iou(a, b, tolerance=1) == 1.0  # every pixel has a partner within 1 pixel
    far = np.zeros((1, 4), dtype=bool)
    far[0, 3] = True
    # A = {0, 1}, B = {3}: m_a = 0 (|1 - 3| > 1), m_b = 0 -> TP 0
    assert edge_iou(a, far, tolerance=1) == 0.0
    # A = {0, 1}, B = {2, 3} with t=1: m_a = 1 (pixel 1), m_b = 1 (pixel 2): TP 1, FP 1, FN 1 -> 1/3
    b2 = np.zeros((1, 4), dtype=bool)
    b2[0, [2, 3]] = True
    assert edge_iou(a, b2, tolerance=1) == pytest.approx(1 / 3)
    empty = np.zeros((1, 4), dtype=bool)
    assert edge_iou(empty, empty) == 1.0 and edge_iou(a, empty) == 0.0


def test_similarity_is_the_weighted_mean_of_its_components():
    rng = np.random.default_rng(0)
    t = rng.integers(0, 256, (12, 12, 3)).astype(float)
    a = np.clip(t + rng.normal(0, 30, t.shape), 0, 255).round()
    out = similarity(t, a, SimilarityConfig({"pixel": 1.0, "ssim": 0.0, "edge": 3.0}))
    assert set(out) == {"pixel", "edge", "score"}
    assert out["score"] == pytest.approx((out["pixel"] + 3 * out["edge"]) / 4)
    assert out["pixel"] == pytest.approx(relative_pixel_similarity(t, a))
    assert out["edge"] == pytest.approx(edge_iou(sobel_edges(t), sobel_edges(a), 1))
    assert similarity(t, t, SimilarityConfig({"pixel": 1, "ssim": 1, "edge": 1}))["score"] == pytest.approx(1.0)
    for bad in ({"pixel": 0.0}, {"pixel": -1.0, "edge": 2.0}, {"colour": 1.0}):
        with pytest.raises(ValueError):
            similarity(t, a, SimilarityConfig(bad))
    with pytest.raises(ValueError, match="same size"):
        similarity(t, a[:6], SimilarityConfig({"pixel": 1.0}))


@needs_cairo
def test_feature_similarity_ranks_a_near_copy_above_a_blank():
    ok, why = feature_encoder_available()
    if not ok:
        pytest.skip(f"optional feature encoder not installed: {why}")
    env = _fast()
    env.reset(0)
    target = env._target_image
    blank = render_svg(BLANK, 96, 96, "cairosvg", RenderLimits(timeout_s=0)).image
    shifted = re.sub(r'\b(x|cx|x1|x2)="(\d+)"', lambda m: f'{m.group(1)}="{int(m.group(2)) + 2}"', env._target.svg)
    assert shifted != env._target.svg
    near = render_svg(shifted, 96, 96, "cairosvg", RenderLimits(timeout_s=0)).image  # shapes 2 px to the right
    assert feature_similarity(target, target) == pytest.approx(1.0, abs=1e-5)
    assert feature_similarity(target, near) > feature_similarity(target, blank) + 0.2
    scored = make("svg", render_timeout_s=0, weight_feature=1.0)
    scored.reset(0)
    res = scored.step(reply(scored.config.format, scored.optimal_actions()[0]))
    assert res.info["svg_feature"] == pytest.approx(1.0, abs=1e-5) and res.info["success"]


# ---------------------------------------------------------------------------------------------
# Rendering guards
# ---------------------------------------------------------------------------------------------

def test_static_guards_name_the_problem():
    limits = RenderLimits(max_chars=2000, max_elements=50, max_use=3, max_depth=6)
    cases = {
        "<svg><rect": "well-formed",
        "not xml at all": "well-formed",
        "<html><body/></html>": "expected <svg>",
        '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><svg>&b;</svg>': "DTD",
        "<svg>" + "<rect/>" * 60 + "</svg>": "more than 50 elements",
        "<svg>" + "<g>" * 8 + "</g>" * 8 + "</svg>": "nested deeper",
        "<svg>" + '<use href="#a"/>' * 4 + "</svg>": "<use>",
        "<svg>" + " " * 2001 + "</svg>": "characters",
    }
    for svg, needle in cases.items():
        root, error, _ = check_svg(svg, limits)
        assert root is None and needle in error, (svg[:40], error)
        res = render_svg(svg, 32, 32, "pil", limits)
        assert res.image is None and needle in res.error
    assert render_svg(b"<svg/>", 8, 8, "pil").error.startswith("the SVG is not text")


@needs_cairo
def test_external_references_are_listed_and_never_loaded(tmp_path):
    red = tmp_path / "red.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(red)
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    long_url = "http://127.0.0.1:9/" + "a" * 200 + ".png"
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="32" height="32">'
           f'<image href="file://{red}" x="0" y="0" width="32" height="32"/>'
           f'<image xlink:href="{red}" x="0" y="0" width="32" height="32"/>'
           f'<image href="{data_url}" x="0" y="0" width="32" height="32"/>'
           '<image href="http://127.0.0.1:9/x.png" x="0" y="0" width="32" height="32"/>'
           f'<image href="{long_url}" x="0" y="0" width="32" height="32"/>'
           '<rect width="4" height="4" style="fill:url(http://127.0.0.1:9/p.svg#g)"/>'
           '<style>@import url("http://127.0.0.1:9/a.css");</style></svg>')
    for timeout in (0.0, 5.0):
        res = render_svg(svg, 32, 32, "cairosvg", RenderLimits(timeout_s=timeout))
        assert res.error is None
        assert np.asarray(res.image).min() == 255  # nothing was drawn: no file, data: or network access
        # each reference as far as MAX_REF_CHARS (the test's tmp_path may be longer: pytest-xdist's is)
        assert f"file://{red}"[:MAX_REF_CHARS] in res.refused_refs and str(red)[:MAX_REF_CHARS] in res.refused_refs
        assert "http://127.0.0.1:9/x.png" in res.refused_refs and "http://127.0.0.1:9/a.css" in res.refused_refs
        assert any(r.startswith("data:image/png") for r in res.refused_refs)
        assert long_url[:MAX_REF_CHARS] in res.refused_refs and max(map(len, res.refused_refs)) == MAX_REF_CHARS
    # internal references still work
    ok = render_svg('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="8" '
                    'height="8"><defs><rect id="r" width="8" height="8" fill="#0000ff"/></defs><use xlink:href="#r"/></svg>',
                    8, 8, "cairosvg", RenderLimits(timeout_s=0))
    assert ok.refused_refs == () and tuple(np.asarray(ok.image)[4, 4]) == (0, 0, 255)


@needs_cairo
def test_a_slow_render_times_out_and_the_worker_restarts():
    rng = random.Random(0)
    points = " ".join(f"{rng.randint(0, 96)},{rng.randint(0, 96)}" for _ in range(2000))
    slow = (f'<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96"><polygon points="{points}" fill="red" '
            'stroke="blue" stroke-width="30" stroke-dasharray="0.5"/></svg>')  # ~12 s in-process
    limits = RenderLimits(timeout_s=0.3)
    before = worker_starts()
    res = render_svg(slow, 96, 96, "cairosvg", limits)
    assert res.image is None and "timed out after 0.3 s" in res.error
    after = render_svg(BLANK, 96, 96, "cairosvg", limits)
    assert after.error is None and worker_starts() >= before + 1  # a fresh worker served it
    env = make("svg", render_timeout_s=0.3)
    env.reset(0)
    step = env.step(reply(env.config.format, slow))
    assert not step.info["action_is_valid"] and step.reward == 0.0 and "timed out" in step.info["svg_render_error"]
    assert "could not be rendered: render timed out" in step.obs.text


@needs_cairo
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_worker():
    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8" fill="#00f"/></svg>'
    assert render_svg(svg, 8, 8, "cairosvg").error is None
    parent_worker = _WORKER.proc.pid
    pid = os.fork()
    if pid == 0:  # the child: its own worker, the parent's untouched
        res = render_svg(svg, 8, 8, "cairosvg")
        ok = res.error is None and _WORKER.proc is not None and _WORKER.proc.pid != parent_worker
        _WORKER.kill()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert render_svg(svg, 8, 8, "cairosvg").error is None and _WORKER.proc.pid == parent_worker


@needs_cairo
def test_a_worker_that_cannot_start_is_an_env_error_not_a_zero_reward(tmp_path, monkeypatch):
    env = make("svg", format="no_think")
    env.reset(0)
    (tmp_path / "cairosvg.py").write_text("raise ImportError('libcairo.so.2: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker (only) imports this broken cairosvg
    _WORKER.kill()
    try:
        with pytest.raises(RendererUnavailable, match="worker failed to start.*libcairo"):
            render_svg(BLANK, 96, 96, "cairosvg")
        with pytest.raises(EnvError, match="renderer='pil'"):
            env.step(reply("no_think", BLANK))
    finally:
        monkeypatch.undo()
        _WORKER.kill()
    assert render_svg(BLANK, 96, 96, "cairosvg").error is None


@needs_cairo
def test_renderers_agree():
    env = _fast()
    for seed in range(3):
        env.reset(seed)
        svg = env.optimal_actions()[0]
        inline = render_svg(svg, 96, 96, "cairosvg", RenderLimits(timeout_s=0)).image
        worker = render_svg(svg, 96, 96, "cairosvg", RenderLimits(timeout_s=5)).image
        pil = render_svg(svg, 96, 96, "pil").image
        assert np.array_equal(np.asarray(inline), np.asarray(worker))
        assert np.abs(np.asarray(inline, float) - np.asarray(pil, float)).mean() < 3.0  # anti-aliasing differs
    assert resolve_renderer("auto") == "cairosvg"
    with pytest.raises(ValueError, match="valid"):
        resolve_renderer("skia")


def test_pil_renderer_subset_and_notes():
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><g fill="#00ff00"><rect width="5" height="10"/></g>'
           '<circle cx="7.5" cy="5" r="2" style="fill: none; stroke: #0000ff; stroke-width: 1"/><path d="M0 0 L1 1"/></svg>')
    res = render_svg(svg, 40, 40, "pil")
    px = np.asarray(res.image)
    assert tuple(px[20, 10]) == (0, 255, 0)  # the group's fill is inherited; viewBox scaled by 4
    # the ring: fill none, a 1-unit (4 px) blue outline at x = 9.5 units = 38 px
    assert tuple(px[20, 30]) == (255, 255, 255) and px[20, 37][2] > 200 and px[20, 37][0] < 100
    assert "<path> is not supported by the pil renderer" in res.notes


# ---------------------------------------------------------------------------------------------
# Parsing the reply
# ---------------------------------------------------------------------------------------------

def test_extract_svg_and_parse():
    assert extract_svg('```xml\n<svg width="1"><rect/></svg>\n```') == '<svg width="1"><rect/></svg>'
    assert extract_svg('here: <svg width="2"/> done') == '<svg width="2"/>'
    assert extract_svg("<rect/>") is None and extract_svg("<svg width='3'>") is None
    ps = parse_svg_response(reply("free_think", "<svg/>"), "free_think")
    assert ps.parsed.format_ok and ps.svg == "<svg/>" and ps.error is None
    assert "no <svg>" in parse_svg_response(reply("no_think", "a circle"), "no_think").error
    bad = parse_svg_response("<answer><svg/>", "no_think")
    assert bad.svg is None and bad.error.startswith("format error")
    # commas in the SVG are not action separators: the whole answer is one action
    assert parse_svg_response(reply("no_think", '<svg><polygon points="1,2 3,4 5,6"/></svg>'), "no_think").parsed.actions == (
        '<svg><polygon points="1,2 3,4 5,6"/></svg>',)


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("renderer", ["cairosvg", "pil"])
def test_oracle_scores_one_and_blank_scores_low(renderer):
    if renderer == "cairosvg" and not HAS_CAIRO:
        pytest.skip("cairosvg does not import")
    env = _fast(renderer=renderer)
    for seed in range(4):
        env.reset(seed)
        fmt = env.config.format
        res = env.step(reply(fmt, env.optimal_actions()[0]))
        assert res.info["svg_score"] == pytest.approx(1.0) and res.info["success"] and res.terminated
        assert not res.truncated and res.reward == pytest.approx(0.1 + 1.0)  # lite: format 0.1 + similarity 1
        assert res.info["action_is_valid"] and res.info["action_is_effective"] and res.info["n_valid_actions"] == 1
        with pytest.raises(EpisodeOverError):
            env.step(reply(fmt, BLANK))
        env.reset(seed)
        blank = env.step(reply(fmt, BLANK))
        assert blank.info["svg_score"] < 0.05 and not blank.info["success"] and not blank.terminated
        assert blank.info["svg_pixel"] == 0.0 and blank.info["svg_edge_iou"] == 0.0
        assert blank.reward == pytest.approx(0.1 + blank.info["svg_score"])


def test_malformed_huge_and_missing_svg_fail_with_feedback():
    env = _fast(max_svg_chars=500)
    env.reset(0)
    fmt = env.config.format
    cases = [("<svg><circle r='3'></svg>", "not well-formed XML"),
             ("<svg>" + '<rect width="1" height="1"/>' * 40 + "</svg>", "more than the limit of 500"),
             ("I would draw a red circle", "no <svg>"),
             # a DTD before <svg> is cut off by the extraction, so its entities are undefined
             ('<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]><svg>&x;</svg>', "undefined entity")]
    for answer, needle in cases:
        env.reset(0)
        res = env.step(reply(fmt, answer))
        assert res.info["format_ok"] and not res.info["action_is_valid"] and res.info["n_valid_actions"] == 0
        assert res.reward == 0.0 and res.info["svg_score"] == 0.0 and needle in res.info["svg_render_error"]
        assert needle in res.obs.text and "similarity 0" in res.obs.text
        assert len(res.obs.images) == 2 and res.obs.images[1].getpixel((5, 5)) == (128, 128, 128)
    env.reset(0)
    garbage = env.step("<think>no answer</think>")
    assert not garbage.info["format_ok"] and garbage.reward == 0.0 and "format error" in garbage.obs.text


@needs_cairo
def test_external_reference_in_a_reply_is_reported():
    env = _fast()
    env.reset(0)
    svg = env.optimal_actions()[0].replace("</svg>", '<image href="file:///etc/hostname" width="9" height="9"/></svg>')
    res = env.step(reply(env.config.format, svg))
    assert res.info["svg_refused_refs"] == 1 and res.info["success"]  # drawn without the resource
    assert "External references were not loaded: file:///etc/hostname" in res.obs.text


def test_revision_turn_truncation_and_improvement_reward():
    env = _fast(similarity_reward="improvement", rewards="paper")
    env.reset(5)
    fmt, oracle = env.config.format, env.optimal_actions()[0]
    partial = "\n".join(oracle.split("\n")[:-2] + ["</svg>"])  # the last shape missing
    first = env.step(reply(fmt, partial))
    assert not first.terminated and not first.truncated and "1 attempt(s) left" in first.obs.text
    second = env.step(reply(fmt, oracle))
    s1 = first.info["svg_score"]
    assert 0.2 < s1 < 0.95
    assert first.reward == pytest.approx(0.5 + 10 * s1)  # paper: format 0.5, similarity x10
    assert second.reward == pytest.approx(0.5 + 10 * (1.0 - s1)) and second.terminated and second.info["success"]
    assert env.state()["best_score"] == pytest.approx(1.0) and env.state()["turn"] == 2
    env = _fast(max_turns=2)
    env.reset(5)
    a = env.step(reply(fmt, partial))
    b = env.step(reply(fmt, partial))
    assert not a.truncated and b.truncated and not b.terminated and "No attempts left" in b.obs.text
    assert a.info["action_is_effective"] and not b.info["action_is_effective"]  # no improvement on the same score


def test_observations_in_each_mode():
    env = _fast(feedback_images="side_by_side", image_size=64)
    obs, info = env.reset(1)
    assert obs.text.count("<image>") == 1 and obs.images[0].size == (64, 64) and info["n_shapes"] >= 2
    res = env.step(reply(env.config.format, BLANK))
    assert len(res.obs.images) == 1 and res.obs.images[0].size == (2 * 64 + 4, 64)
    assert "Target (left) and your rendering (right)" in res.obs.text
    text = _fast(render="text")
    obs, _ = text.reset(1)
    assert obs.images == () and "Canvas 96 x 96" in obs.text
    shape = text.state()["shapes"][0]
    assert f"a {shape['colour']} ({shape['fill']}) {shape['object']}" in obs.text
    assert text.step(reply(text.config.format, text.optimal_actions()[0])).obs.images == ()


def test_targets_are_seeded_and_respect_the_config():
    env = _fast(min_shapes=3, max_shapes=5, shape_kinds=["circle", "line"], random_background=False)
    other = _fast(min_shapes=3, max_shapes=5, shape_kinds=["circle", "line"], random_background=False)
    seen = set()
    for seed in range(10):
        env.reset(seed)
        other.reset(seed)
        st = env.state()
        assert env.optimal_actions() == other.optimal_actions()
        assert 3 <= len(st["shapes"]) <= 5 and {s["object"] for s in st["shapes"]} <= {"circle", "line"}
        assert st["background"] == "white" and len({s["colour"] for s in st["shapes"]}) == len(st["shapes"])
        cells = [tuple(r["cell"]) for r in st["relations"]]
        assert len(set(cells)) == len(cells)  # one shape per grid cell
        for s in st["shapes"]:
            x0, y0, x1, y1 = s["bbox"]
            assert 0 <= x0 <= x1 <= 96 and 0 <= y0 <= y1 <= 96
        seen.add(env.optimal_actions()[0])
    assert len(seen) == 10


def test_config_errors_name_the_fix():
    for kwargs, needle in [({"max_actions_per_turn": 3}, "must be 1"), ({"grid_size": 4}, "odd"),
                           ({"shape_kinds": ["circel"]}, "Did you mean 'circle'"), ({"max_shapes": 11}, "max_shapes"),
                           ({"weight_pixel": 0, "weight_edge": 0}, "at least one"), ({"feedback_images": "grid"}, "pair"),
                           ({"similarity_reward": "delta"}, "improvement"), ({"success_threshold": 1.5}, "(0, 1]"),
                           ({"svg_dir": "/nonexistent/svgs"}, "not a directory"), ({"renderer": "skia"}, "valid")]:
        with pytest.raises(ConfigError, match=None) as exc:
            make("svg", **kwargs)
        assert needle in str(exc.value), (kwargs, str(exc.value))


@needs_cairo
def test_targets_from_an_svg_directory(tmp_path):
    (tmp_path / "a.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="90" height="90"><rect width="90" height="90" fill="#d0ebff"/>'
        '<circle cx="15" cy="15" r="10" fill="red"/><g transform="translate(5 5)"><rect width="9" height="9"/></g>'
        '<path d="M60 60 L80 80" stroke="black"/><polygon points="60,60 85,62 70,85" fill="#2f9e44"/></svg>')
    (tmp_path / "b.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 30 30">'
                                    '<ellipse cx="15" cy="15" rx="8" ry="4" fill="purple"/></svg>')
    (tmp_path / "notes.txt").write_text("not a target")
    env = make("svg", svg_dir=str(tmp_path), render_timeout_s=0)
    sources = set()
    for seed in range(12):
        obs, info = env.reset(seed)
        sources.add(info["target_source"].rsplit("/", 1)[-1])
        res = env.step(reply(env.config.format, env.optimal_actions()[0]))
        assert res.info["success"] and res.info["svg_score"] == pytest.approx(1.0)
    assert sources == {"a.svg", "b.svg"}
    for seed in range(12):
        env.reset(seed)
        st = env.state()
        if st["source"].endswith("a.svg"):
            assert st["background"] == "light blue"  # the first full-canvas rect is the background
            assert [(s["object"], s["colour"]) for s in st["shapes"]] == [("circle", "red"), ("polygon", "green")]
            assert [(r["vertical"], r["horizontal"]) for r in st["relations"]] == [("above", "left"), ("below", "right")]
            assert rule_score(describe_state(st, "natural"), st, SVGEnv.judge_spec, LEGEND).score == 1.0
            break
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no .svg files"):
        make("svg", svg_dir=str(tmp_path / "empty"))


# ---------------------------------------------------------------------------------------------
# Judges, solver, checker
# ---------------------------------------------------------------------------------------------

def test_positions_relative_to_the_centre():
    assert cell_of((10, 10), 96, 96, 3) == (0, 0) and cell_of((48, 90), 96, 96, 3) == (2, 1)
    assert cell_of((96, 96), 96, 96, 3) == (2, 2)  # clamped
    assert position_phrase("above", "left") == "above and to the left of the centre"
    assert position_phrase("same", "same").startswith("at the centre")


def test_describe_state_scores_one_with_the_rule_judge_and_wrong_descriptions_less():
    env = _fast(min_shapes=1, max_shapes=6)
    for seed in range(25):
        env.reset(seed)
        st = env.state()
        for style in ("natural", "structured", "symbolic"):
            text = describe_state(st, style)
            assert rule_score(text, st, SVGEnv.judge_spec, LEGEND).score == 1.0, (seed, style, text)
        # everything claimed at the centre: wrong for every shape that is not there
        wrong = " ".join(f"The {s['colour']} {s['object']} is {position_phrase('same', 'same')}." for s in st["shapes"])
        off_centre = [r for r in st["relations"] if (r["vertical"], r["horizontal"]) != ("same", "same")]
        score = rule_score(wrong, st, SVGEnv.judge_spec, LEGEND).score
        assert score < 1.0 if off_centre else score == 1.0


def test_solver_policy_reconstructs_every_target():
    cfg = {"format": "grounding_worldmodeling", "render_timeout_s": 0, "description_style": "structured"}
    eps = rollout([EnvSpec("svg", cfg, seed) for seed in range(4)], SolverPolicy(reasoning="I copy the shapes."),
                  SamplingConfig(max_new_tokens=32), max_turns=2)
    m = eps.metrics
    assert m["rollout/success_rate"] == 1.0 and m["rollout/action_valid_rate"] == 1.0 and m["rollout/errors"] == 0
    for e in eps:
        assert len(e.turns) == 1 and e.turns[0].info["svg_score"] == pytest.approx(1.0)
        t = e.turns[0]
        assert rule_score(t.parsed.observation, t.state_before, SVGEnv.judge_spec, LEGEND).score == 1.0
        assert rule_score(t.parsed.prediction, t.state_after, SVGEnv.judge_spec, LEGEND).score == 1.0


def test_checker_on_other_options():
    for kwargs in ({"format": "no_think", "feedback_images": "side_by_side", "rewards": "paper"},
                   {"format": "grounding", "description_style": "symbolic", "renderer": "pil", "max_turns": 1},
                   {"format": "worldmodeling", "render": "text", "render_timeout_s": 0, "canvas_size": 64,
                    "image_size": 128, "grid_size": 5, "max_shapes": 8}):
        report = check_env(env_factory("svg", **kwargs), check_subprocess=False)
        assert any("EpisodeOverError" in c for c in report.checks)


def test_system_prompt_explains_the_task_and_the_format():
    env = make("svg", format="grounding", description_style="symbolic", canvas_size=64)
    prompt = env.system_prompt()
    assert 'viewBox="0 0 64 64"' in prompt and LEGEND in prompt and "Example reply:" in prompt
    example = prompt.split("Example reply:\n", 1)[1]
    ps = parse_svg_response(example, "grounding")
    assert ps.parsed.format_ok and ps.svg is not None and check_svg(ps.svg, RenderLimits())[1] is None
    assert math.isclose(env.rewards["format"], 0.1)


def test_auto_falls_back_to_pil_when_cairosvg_cannot_import():
    """A fresh interpreter where `import cairosvg` fails (as without libcairo2): "auto" warns and
    uses the PIL renderer, the oracle still scores 1; "cairosvg" is a config error naming the fix."""
    code = (
        "import sys, warnings, json\n"
        "sys.modules['cairosvg'] = None  # import cairosvg -> ImportError\n"
        "from vagent.envs import make\n"
        "from vagent.envs.formats import render_response\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    env = make('svg', format='no_think')\n"
        "env.reset(0)\n"
        "res = env.step(render_response('no_think', {'answer': env.optimal_actions()[0]}))\n"
        "try:\n"
        "    make('svg', renderer='cairosvg')\n"
        "    err = ''\n"
        "except Exception as exc:\n"
        "    err = str(exc)\n"
        "print(json.dumps([env.renderer, [str(x.message) for x in w], err, res.info['svg_score'], res.info['svg_renderer']]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    renderer, warns, err, score, used = json.loads(out.stdout.strip().splitlines()[-1])
    assert renderer == used == "pil" and score == pytest.approx(1.0) and any("falls back to its own PIL renderer" in m for m in warns)
    assert "pip install cairosvg" in err and "libcairo2" in err
