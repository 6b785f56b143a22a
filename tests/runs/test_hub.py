"""hub: uploads of checkpoints with huggingface_hub, against a loopback HTTP server set as the
endpoint (tests/runs/hubserver.py): every N-th checkpoint and the last, a failed upload retried
with the next checkpoint, an upload that hangs never holds training, and a two-step run."""

from __future__ import annotations

import threading

import pytest

from tests.runs.hubserver import FakeHub
from vagent.runs.hub import HubUploader


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """tests/conftest.py sets HF_HUB_OFFLINE=1; the loopback hub is the one place we go online."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")


def fake_checkpoint(ckpt_dir, step: int) -> None:
    d = ckpt_dir / f"step_{step:06d}"
    (d / "policy").mkdir(parents=True)
    (d / "policy" / "config.json").write_text(f'{{"step": {step}}}')
    (d / "policy" / "model.safetensors").write_bytes(bytes([step]) * 64)
    (d / "state.pt").write_bytes(b"state")  # what makes a checkpoint complete


def api_for(hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token="hf_test")


def wait_until(cond, up: HubUploader):
    """Poll ``cond`` while the uploader's thread lives. No clock of its own, so a loaded machine
    only makes it slower: a thread that died fails here at once, a hang ends at pyproject's
    per-test timeout."""
    import time

    while not cond():
        assert up._thread.is_alive(), "the upload thread ended before the condition held"
        time.sleep(0.02)


def test_every_second_checkpoint_and_the_last(tmp_path):
    with FakeHub() as hub:
        up = HubUploader("me/run", tmp_path, every=2, say=lambda m: None, poll_s=0.02, api=api_for(hub)).start()
        for step in (1, 2, 3):
            fake_checkpoint(tmp_path, step)
            wait_until(lambda: up.n_new == step, up)
        up.close()
    assert up.uploaded == ["step_000002", "step_000003"]
    assert [c["message"] for c in hub.commits] == ["vagent: rl step 2 (policy)", "vagent: rl step 3 (policy)"]
    assert hub.commits[-1]["files"] == {"config.json": b'{"step": 3}', "model.safetensors": bytes([3]) * 64}
    assert hub.repos == {"me/run": {"private": True}}


def test_a_failed_upload_is_logged_and_retried_with_the_next_checkpoint(tmp_path):
    said = []
    with FakeHub(fail_commits=1) as hub:
        up = HubUploader("me/run", tmp_path, say=said.append, poll_s=0.02, api=api_for(hub)).start()
        fake_checkpoint(tmp_path, 1)
        wait_until(lambda: up.failures == 1, up)
        fake_checkpoint(tmp_path, 2)
        wait_until(lambda: up.uploaded == ["step_000002"], up)
        up.close()
    assert any("upload of step_000001 to me/run failed" in m and "retrying with the next checkpoint" in m for m in said)
    assert [sorted(c["files"]) for c in hub.commits] == [["config.json", "model.safetensors"]]


def test_a_hanging_upload_never_holds_training(tmp_path):
    release = threading.Event()

    class HangingApi:
        def create_repo(self, *a, **k):
            pass

        def upload_folder(self, **k):
            release.wait(30)

    said = []
    fake_checkpoint(tmp_path, 1)
    up = HubUploader("me/run", tmp_path, say=said.append, poll_s=0.02, api=HangingApi()).start()
    up.seen.clear()  # treat the existing checkpoint as new
    up.close(wait_s=0.3)  # returns although the upload hangs
    assert any("still running" in m for m in said)
    release.set()


def test_two_step_run_uploads_its_checkpoints(small_cfg, monkeypatch):
    """hub.repo_id from the run config: the run's checkpoints reach the loopback hub (HF_ENDPOINT);
    the hub refuses the first commit, which neither fails nor stops the run and is retried."""
    from huggingface_hub import constants

    from vagent.recipes.run import train

    with FakeHub(fail_commits=1) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        run = train(small_cfg("hub.repo_id=me/tiny-run", "hub.every=1"), quiet=True)
    assert (run / "summary.json").is_file()
    assert "hub: upload of step_00000" in (run / "train.log").read_text()  # the refused one, logged
    assert hub.commits[-1]["message"] == "vagent: rl step 2 (policy)"  # the last checkpoint made it
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(hub.commits[-1]["files"])


@pytest.fixture
def small_cfg(tmp_path, tiny_vlm):
    from tests.recipes.conftest import small_overrides
    from vagent.runconfig import load_config

    return lambda *extra: load_config(None, small_overrides(tmp_path, tiny_vlm, *extra))


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    from vagent.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", hidden=64, layers=2, image_size=64)
