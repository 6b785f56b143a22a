"""A resume says exactly what it does (issue 55, items 4-6), on real runs of the tiny VLM: a run whose
run.json is lost resumes from its own checkpoints (their identities agree with each other and with
config.yaml); checkpoints that disagree, or have no identity, are said as such; a refused resume
writes nothing to the run directory; a finished run refuses overrides that ask it for work; a
one-process checkpoint is refused before a job starts; an error while resuming is printed once; and
config values that cannot work are one line before any model work."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from vagent.cli import main
from vagent.config import ConfigError
from vagent.recipes.common import check_lora_rank
from vagent.runconfig import load_config
from vagent.recipes.resume import check_resumable, resume_config
from vagent.recipes.run import train
from vagent.runs import read_metrics
from vagent.runs.checkpoint import CheckpointError, CheckpointInfo
from vagent.runs.manifest import write_manifest
from vagent.runs.rundir import RunDir

from .conftest import small_overrides


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_vlm) -> Path:
    """A finished run of 2 PPO steps, a checkpoint after each."""
    out = tmp_path_factory.mktemp("finished")
    return train(load_config(None, small_overrides(out, tiny_vlm, "log.keep_last=5", "log.rollouts_every=0")),
                 quiet=True)


def _copy(run: Path, tmp_path: Path, *, killed: bool = True) -> Path:
    """A copy of ``run``; ``killed``: without summary.json (killed after its last checkpoint)."""
    out = Path(shutil.copytree(run, tmp_path / "run"))
    if killed:
        (out / "summary.json").unlink()
    return out


def _digest(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name not in ("train.log", "run.lock")}


def _identity(ckpt: Path) -> dict:
    return json.loads((ckpt / "identity.json").read_text())


def test_a_run_without_run_json_resumes_from_its_own_checkpoints(finished, tmp_path):
    run = _copy(finished, tmp_path)
    (run / "run.json").unlink()
    own = _identity(run / "checkpoints" / "step_000002")["run_id"]

    assert main(["train", "--resume", str(run), "steps=3", "--quiet"]) == 0

    log = (run / "train.log").read_text()
    assert (f"note: {run / 'run.json'} is missing; the run's identity (run id {own[:12]}) is rebuilt from the "
            "identity.json of its checkpoints step_000001, step_000002, which agree with each other and with "
            "config.yaml") in log
    assert "resuming from" in log and "step_000002 (rl step 2)" in log and "skipped" not in log
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["run_id"] == own == _identity(run / "checkpoints" / "step_000003")["run_id"]
    assert [c["fields"] for c in recorded["changes"]] == [{"steps": [2, 3]}]  # the override is a change, not the start
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r.get("phase") == "rl"] == [1, 2, 3]
    assert resume_config(RunDir(run), ["steps=3"]).identity.run_id == own  # and it resumes again


def test_checkpoints_that_disagree_or_have_no_identity_are_said_and_nothing_is_written(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    (run / "run.json").unlink()
    first = run / "checkpoints" / "step_000001" / "identity.json"
    original = first.read_text()
    first.write_text(json.dumps({**json.loads(original), "run_id": "f" * 32}))
    before = _digest(run)

    assert main(["train", "--resume", str(run), "steps=3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.json is missing and the run's checkpoints disagree on whose they are: " in err[0]
    assert f"run id {'f' * 12} (state hash " in err[0] and "delete" not in err[0]
    assert _digest(run) == before  # no run.json made, config.yaml as it was

    for ckpt in (run / "checkpoints").iterdir():  # an older vagent's checkpoints: none has an identity
        (ckpt / "identity.json").unlink()
    plan = resume_config(RunDir(run), ["steps=3"])
    assert plan.checks_identity and not (run / "run.json").exists()
    assert "is missing and none of its 2 checkpoint(s) has a readable identity.json" in plan.said[0]
    assert plan.identity.adopted == ("step_000001", "step_000002")  # recorded by name in the new run.json

    # that resume killed before its first checkpoint: the next one (run.json there now) still accepts them,
    # and a checkpoint that loses its identity.json afterwards is refused
    from vagent.runs.checkpoint import select_checkpoint
    from vagent.runs.identity import read_run_identity
    from vagent.runs.manifest import write_manifest

    for ckpt in (run / "checkpoints").iterdir():
        (ckpt / "manifest.json").unlink()
        write_manifest(ckpt)  # intact apart from the identity an older vagent never wrote
    plan.accept()
    again = read_run_identity(run)
    assert again is not None and again.adopted == plan.identity.adopted
    assert select_checkpoint(run / "checkpoints", run=again, say=lambda m: None).path.name == "step_000002"
    later = again.__class__(again.run_id, again.state_hash, again.config, again.changes, ("step_000001",))
    said: list[str] = []
    assert select_checkpoint(run / "checkpoints", run=later, say=said.append).path.name == "step_000001"
    assert "step_000002 is skipped: it has no identity.json" in said[0]

    (run / "run.json").unlink()
    first.write_text(original)  # one identity again, and config.yaml edited after run.json was lost
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("seed: 0", "seed: 1"))
    with pytest.raises(ConfigError, match="is not the config the run's checkpoints were trained under"):
        resume_config(RunDir(run))


def test_a_refused_resume_writes_nothing(finished, tmp_path, capsys):
    """steps below the checkpoint's step: refused after the checkpoint is chosen, before any model
    work, and config.yaml, run.json and metrics.jsonl stay as they were."""
    run = _copy(finished, tmp_path)
    before = _digest(run)
    assert main(["train", "--resume", str(run), "steps=1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: steps=1 is below the 2 RL steps that checkpoint step_000002 holds; config.yaml would then "
                   f"disagree with what was trained. Set steps >= 2: vagent train --resume {run} steps=2 finishes the "
                   "run where it is."]
    assert _digest(run) == before


def test_a_finished_run_refuses_overrides_that_ask_it_for_work(finished, tmp_path, capsys):
    before = _digest(finished)
    assert main(["train", "--resume", str(finished), "steps=60"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {finished} is finished (it has summary.json: all 2 steps trained); it was not resumed and "
                   "nothing changed, so steps=60 trained nothing. To train it further, move "
                   f"{finished / 'summary.json'} out of the run directory: then vagent train --resume {finished} "
                   "steps=60 continues from its last checkpoint."]
    assert main(["train", "--resume", str(finished), "log.nonexistent=1"]) == 1
    assert "unknown key 'nonexistent' in LogConfig" in capsys.readouterr().err
    assert main(["train", "--resume", str(finished), "steps=2"]) == 0  # its own value: nothing asked
    assert "nothing changed" in capsys.readouterr().out
    assert _digest(finished) == before

    run = _copy(finished, tmp_path, killed=False)  # the advice, followed
    (run / "summary.json").rename(tmp_path / "summary.json")
    assert main(["train", "--resume", str(run), "steps=3", "--quiet"]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r.get("phase") == "rl"] == [1, 2, 3]


def test_a_one_process_checkpoint_is_refused_before_a_job_starts(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    before = _digest(run)
    assert main(["train", "--nproc", "2", "--resume", str(run), "steps=3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: checkpoint {run / 'checkpoints' / 'step_000002'} was written by one process (it has no "
                   "dcp/ folder), and a job of 2 processes cannot load it: resume it with one process, vagent train "
                   f"--resume {run} steps=3 (without --nproc/--nnodes)."]
    assert _digest(run) == before
    # rank 0 of a job checks the checkpoint it chose again, before anything is written
    ckpt = CheckpointInfo(run / "checkpoints" / "step_000002", "rl", 2)
    plan = resume_config(RunDir(run), ["steps=3"])
    with pytest.raises(CheckpointError, match="written by one process .* a job of 2 processes cannot load it"):
        check_resumable(RunDir(run), ckpt, plan, 2)
    check_resumable(RunDir(run), ckpt, plan, 1)


def test_an_error_while_resuming_is_printed_once(finished, tmp_path, capsys):
    """A CheckpointError raised while the RL recipe loads the checkpoint (its policy.pt lacks a
    tensor; the manifest was rewritten to match): one line on stderr, none on stdout, once in
    train.log."""
    run = _copy(finished, tmp_path)
    ckpt = run / "checkpoints" / "step_000002"
    weights = torch.load(ckpt / "policy.pt", weights_only=True)
    weights.pop(sorted(weights)[0])
    torch.save(weights, ckpt / "policy.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)

    assert main(["train", "--resume", str(run)]) == 1
    out, err = capsys.readouterr()
    assert (out + err).count("cannot be loaded into this run's model") == 1, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint {ckpt} is damaged: policy.pt cannot be loaded")
    assert (run / "train.log").read_text().count(lines[0]) == 1


@pytest.mark.parametrize("band, low", [(["rollout_correction.rs_high=0.5"], "2"),
                                       (["rollout_correction.rs_low=0.5", "rollout_correction.rs_high=0.9"], "0.5")])
def test_a_rejection_band_without_ratio_1_is_refused_at_load(band, low):
    with pytest.raises(ConfigError, match=rf"accepts ratios pi_trainer / pi_engine in \[{low}, .*which excludes 1"):
        load_config(None, ["rollout_correction.rs_level=token", *band])
    load_config(None, band)  # no rejection: the bounds are not used
    load_config(None, ["rollout_correction.rs_level=token", "rollout_correction.rs_high=1.5"])


def test_a_canary_tolerance_without_a_canary_is_refused_at_load():
    with pytest.raises(ConfigError, match="rollout.canary_tolerance 0.5 .* and rollout.canary is false"):
        load_config(None, ["rollout.canary=false", "rollout.canary_tolerance=0.5"])
    with pytest.raises(ConfigError, match="this run generates with the trainer's own model"):
        load_config(None, ["rollout.canary_tolerance=0.5"])


def test_a_lora_rank_above_the_hidden_size_is_refused_before_the_model_loads(tiny_vlm, tmp_path):
    cfg = load_config(None, small_overrides(tmp_path, tiny_vlm, "model.lora_rank=4096"))
    with pytest.raises(ConfigError, match=r"^model.lora_rank 4096 is above the hidden size of the model \(64, .*"
                                          r"Set model.lora_rank <= 64"):
        train(cfg, quiet=True)
    assert not (tmp_path / "runs").exists()  # before a run directory
    check_lora_rank(64, tiny_vlm)
