"""Rollout overheads for engines that take raw images (vLLM): HFPolicy hands them the images and
their grids but builds no pixel tensor for the request (the HF engine still gets its pixels)."""

from __future__ import annotations

from vagent.models.engine import HFEngine
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout


class RawImageEngine(HFEngine):
    """The HF engine declaring itself an engine that takes raw images (as VLLMEngine does), recording
    the requests it is given; it then generates from the ids alone (the replies do not matter here,
    only the requests' fields)."""

    needs_images = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    def generate(self, requests, params):
        self.seen.extend(requests)
        return super().generate([type(r)(r.input_ids, None, None, seed=r.seed) for r in requests], params)


def run(policy):
    specs = [EnvSpec("frozenlake", {"format": "free_think", "image_size": 64}, s) for s in range(2)]
    return rollout(specs, policy, SamplingConfig(temperature=0, max_new_tokens=6, seed=1), max_turns=2)


def test_raw_image_engine_gets_no_pixels(tiny_vlm):
    engine = RawImageEngine(tiny_vlm.model, tiny_vlm.encoder, prefix_cache=False)
    run(HFPolicy(engine))
    with_images = [r for r in engine.seen if r.image_grid_thw is not None]
    assert with_images, "the prompts had images"
    for r in with_images:
        assert r.pixel_values is None
        assert len(r.images) == r.image_grid_thw.shape[0]


def test_hf_engine_still_gets_pixels(tiny_vlm):
    seen = []
    engine = HFEngine(tiny_vlm.model, tiny_vlm.encoder, prefix_cache=False)
    generate = engine.generate
    engine.generate = lambda requests, params: seen.extend(requests) or generate(requests, params)
    run(HFPolicy(engine))
    assert seen and all(r.pixel_values is not None and not r.images for r in seen if r.image_grid_thw is not None)
