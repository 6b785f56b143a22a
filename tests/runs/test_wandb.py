"""log.wandb: metrics mirrored to Weights & Biases in offline mode (no account, no network):
pip install 'vagent[wandb]', WANDB_MODE=offline; `wandb sync` uploads the folder later."""

from __future__ import annotations

import pytest

from vagent.runs.metrics import MetricsLogger

wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'vagent[wandb]')")


def test_offline_run_records_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = MetricsLogger(tmp_path, tensorboard=False, wandb=True, wandb_project="vagent-test", run_name="r1",
                           config={"seed": 0})
    logger.log(0, {"reward/mean": 0.5, "loss/policy": 1.25})
    logger.log(1, {"reward/mean": 0.75})
    summary = dict(logger._wandb.summary)
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    events = list(runs[0].glob("*.wandb"))
    assert events and events[0].stat().st_size > 0, "the offline run's event file is missing"
    assert summary["reward/mean"] == 0.75 and summary["loss/policy"] == 1.25
