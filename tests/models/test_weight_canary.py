"""The weight-push canary (``vagent.rollout.canary``) on real HF engine replicas (Ray actors on a local
cluster): a correct push passes, and a skipped push, a push with one tensor perturbed and a wrong
LoRA merge each stop the driver before the next rollout samples with the bad weights.

The faulty engines are ``RemoteEngine`` subclasses whose push does the wrong thing on purpose
(fault injection: a real push that goes wrong cannot be produced on demand).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("ray", reason="engine replicas need the ray extra: pip install 'vagent[ray]'")

from vagent.models.engine import SamplingParams  # noqa: E402
from vagent.models.remote import RemoteEngine  # noqa: E402
from vagent.rollout.canary import (  # noqa: E402
    WeightCanary, WeightSyncError, build_probe, default_tolerance, load_probe, save_probe, trainer_logprobs,
)
from vagent.rollout.driver import RolloutDriver  # noqa: E402
from vagent.rollout.finish import RolloutResult  # noqa: E402
from vagent.rollout.trajectory import EnvSpec  # noqa: E402
from tests.models.test_remote_engine import ray_cluster  # noqa: E402,F401 -- one local cluster per module

SPECS = [EnvSpec("frozenlake", {"format": "free_think", "image_size": 64}, seed) for seed in (3, 4)]


class SkippedPush(RemoteEngine):
    """Takes the version but not the weights (a push that never reached the model)."""

    def update_state(self, state, version=None):
        self.weights_version = int(version)
        return self.weights_version


class PerturbedPush(RemoteEngine):
    """Pushes the weights with one tensor changed (a corrupt or half-written tensor)."""

    def update_state(self, state, version=None):
        state = dict(state)
        name = next(k for k in state if k.endswith("o_proj.weight"))
        state[name] = state[name] + 0.5 * torch.randn_like(state[name])
        return super().update_state(state, version)


@pytest.fixture(scope="module")
def probe(tiny_vlm):
    prompts, note = build_probe(SPECS, tiny_vlm.encoder)
    return prompts


def no_rollout(policy, step, unshard):
    return RolloutResult([])


def trained(model, scale=0.05, seed=0):
    """A copy of ``model`` after a fake update (every parameter moved)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def test_probe_holds_images_and_survives_a_save(tiny_vlm, tmp_path):
    prompts, note = build_probe(SPECS, tiny_vlm.encoder)
    assert len(prompts) == 2 and "2 image(s)" in note
    assert all(p.pixel_values is not None and len(p.images) == 1 for p in prompts)
    save_probe(tmp_path / "probe.pt", prompts)
    again = load_probe(tmp_path / "probe.pt")
    for a, b in zip(prompts, again):
        assert a.input_ids == b.input_ids and torch.equal(a.pixel_values, b.pixel_values)
        assert a.images[0].tobytes() == b.images[0].tobytes()
    (tmp_path / "bad.pt").write_bytes(b"not a probe")
    with pytest.raises(ValueError, match="bad.pt: not a readable weight-canary probe"):
        load_probe(tmp_path / "bad.pt")


def test_text_only_envs_give_a_text_probe_and_say_so(tiny_vlm):
    prompts, note = build_probe([EnvSpec("frozenlake", {"format": "free_think", "render": "text"}, 0)],
                                tiny_vlm.encoder)
    assert prompts[0].pixel_values is None and "text-only" in note


def test_default_tolerance_by_dtype():
    assert default_tolerance("float32", "float32") == 0.01
    assert default_tolerance("bfloat16", "float32") == default_tolerance("float32", "bfloat16") == 1.0


def test_correct_pushes_pass_and_every_replica_is_checked(ray_cluster, tiny_vlm, probe):
    trainer = copy.deepcopy(tiny_vlm.model)
    engine = RemoteEngine(trainer, tiny_vlm.encoder, replicas=2)
    canary = WeightCanary(probe, trainer, tolerance=0.01)
    driver = RolloutDriver(no_rollout, None, engine=engine, model=trainer, steps=3, canary=canary)
    try:
        driver.start(push=False)
        assert driver._sync[0]["sync/canary_max_abs_diff"] < 1e-4
        with torch.no_grad():  # an update
            for p, q in zip(trainer.parameters(), trained(trainer).parameters()):
                p.copy_(q)
        result = driver.get(1)
        gap = result.metrics["sync/canary_max_abs_diff"]
        assert gap < 1e-4 and result.metrics["sync/canary_s"] > 0
        # the check read both replicas: each reproduces the trainer's log-probs of its greedy tokens
        for i in range(2):
            out = engine.generate_on(i, canary._requests()[:1], SamplingParams(do_sample=False, max_new_tokens=4))[0]
            ref = trainer_logprobs(trainer, probe[0], out.token_ids)
            assert max(abs(a - b) for a, b in zip(out.logprobs, ref)) < 1e-4
    finally:
        driver.close()
        engine.close()


@pytest.mark.parametrize("faulty", [SkippedPush, PerturbedPush])
def test_a_bad_push_stops_the_run_before_the_next_rollout(ray_cluster, tiny_vlm, probe, faulty):
    trainer = copy.deepcopy(tiny_vlm.model)
    engine = faulty(trainer, tiny_vlm.encoder, replicas=1)
    sampled = []
    driver = RolloutDriver(lambda pol, k, u: sampled.append(k) or RolloutResult([]), None, engine=engine,
                           model=trainer, steps=3, canary=WeightCanary(probe, trainer, 0.01, lambda: "ck/step_000001"))
    try:
        driver.start(push=False)
        driver.get(0)  # version 0: the replica copied the trainer, nothing pushed yet
        with torch.no_grad():
            for p, q in zip(trainer.parameters(), trained(trainer).parameters()):
                p.copy_(q)
        with pytest.raises(WeightSyncError) as err:
            driver.get(1)
        assert sampled == [0]  # step 1 never sampled with the bad weights
        msg = str(err.value)
        assert "weights version 1" in msg and "engine replica 0" in msg and "ck/step_000001" in msg
        gap = float(msg.split("up to ")[1].split(" ")[0])
        assert gap > 0.01 and math.isfinite(gap)
    finally:
        driver.close()
        engine.close()


def test_a_wrong_lora_merge_stops_the_run(ray_cluster, tiny_vlm, probe):
    """The merged-weights path (what vLLM takes): replicas hold the plain base model and each push
    sends the LoRA policy merged into base names (``merge_lora_into_state``). A merge with the wrong
    scale (alpha instead of alpha / r) is caught; the right one passes."""
    from peft import LoraConfig, get_peft_model

    from vagent.rollout.replicas import _base_model_keys, merge_lora_into_state

    base = copy.deepcopy(tiny_vlm.model)
    policy = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained adapter: B != 0
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))

    class MergedPush(RemoteEngine):
        scale_error = 1.0

        def update_weights(self, model, version=None):
            state = _base_model_keys({k: v.detach() for k, v in model.state_dict().items()})
            if self.scale_error != 1.0:  # the adapter's B scaled wrongly before the merge
                state = {k: v * self.scale_error if "lora_B" in k else v for k, v in state.items()}
            return self.update_state(merge_lora_into_state(state, model), version)

    engine = MergedPush(base, tiny_vlm.encoder, replicas=1)
    canary = WeightCanary(probe, policy, tolerance=0.01)
    try:
        engine.update_weights(policy, 1)
        assert canary.check(engine, 1)["sync/canary_max_abs_diff"] < 1e-4
        engine.scale_error = 4.0  # lora_alpha instead of lora_alpha / r
        engine.update_weights(policy, 2)
        with pytest.raises(WeightSyncError, match="weights version 2"):
            canary.check(engine, 2)
    finally:
        engine.close()


def test_lora_policy_pushes_only_its_adapter_to_hf_replicas(ray_cluster, tiny_vlm, probe):
    """A LoRA policy's push carries its adapter tensors only; the replica then computes what the
    trainer computes (canary), its greedy ids equal the merged model's, and an adapter of another
    shape is refused with the reason."""
    from peft import LoraConfig, get_peft_model

    from vagent.models.engine import HFEngine
    from vagent.models.remote import adapter_names, pushed_state
    from vagent.rollout.replicas import merge_lora_into_state, _base_model_keys

    policy = get_peft_model(copy.deepcopy(tiny_vlm.model), LoraConfig(r=4, lora_alpha=16,
                                                                      target_modules=["q_proj", "v_proj"]))
    engine = RemoteEngine(policy, tiny_vlm.encoder, replicas=1)
    try:
        with torch.no_grad():  # a trained adapter
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.add_(0.1 * torch.randn_like(p))
        sent = pushed_state(policy)
        full = {k: v for k, v in copy.deepcopy(policy).get_base_model().state_dict().items()}
        assert set(sent) == adapter_names(policy) and sent and all("lora_" in k for k in sent)
        ratio = sum(v.numel() for v in full.values()) / sum(v.numel() for v in sent.values())
        assert ratio > 20, ratio  # the tiny model: the adapter is a small share of the weights
        engine.update_weights(policy, 1)
        assert WeightCanary(probe, policy, 0.01).check(engine, 1)["sync/canary_max_abs_diff"] < 1e-4
        # greedy ids: the replica (base + pushed adapter) = the trainer's LoRA merged into the base
        merged = copy.deepcopy(tiny_vlm.model)
        merged.load_state_dict(merge_lora_into_state(_base_model_keys(
            {k: v.detach() for k, v in policy.state_dict().items()}), policy))
        params = SamplingParams(do_sample=False, max_new_tokens=8)
        requests = WeightCanary(probe, policy, 0.01)._requests()
        want = [o.token_ids for o in HFEngine(merged, tiny_vlm.encoder).generate(requests, params)]
        assert [o.token_ids for o in engine.generate_on(0, requests, params)] == want
        # an adapter of another shape (another rank) is refused, naming the tensor
        name = next(iter(sent))
        bad = dict(sent)
        bad[name] = torch.zeros(bad[name].shape[0] + 1, *bad[name].shape[1:])
        with pytest.raises(Exception, match="other shapes.*" + name.split(".")[0]):
            engine.update_state(bad, 2)
    finally:
        engine.close()
