"""Checkpoints that cannot lie (issue 35, findings 1-4), on a real run of the tiny VLM: a damaged
checkpoint (64 flipped bytes, a truncated, emptied or replaced file) is named and skipped, and the
resume from the newest intact one logs exactly the metrics of the uninterrupted run; with every
checkpoint damaged the resume refuses in one line; a save killed with SIGKILL leaves a temporary
folder that the next resume deletes (a live writer's is kept); a full disk (a real tmpfs) is one
line naming the checkpoint and the free space, and the run resumes once space is freed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vagent.cli import main
from vagent.runconfig import load_config
from vagent.recipes.run import train
from vagent.runs import read_metrics
from vagent.runs.checkpoint import CheckpointError, check_checkpoint, load_checkpoint, select_checkpoint

from .conftest import small_overrides

ARGS = ["log.keep_last=2", "log.checkpoint_every=1", "log.rollouts_every=1", "log.plots=true"]  # plots: the disk-full test


def _comparable(run: Path) -> list[dict]:
    """Every record with timing fields removed."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k not in ("time", "val/time_s")}
            for r in read_metrics(run / "metrics.jsonl")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_vlm) -> Path:
    """One finished 2-step PPO run with checkpoints step_000001 and step_000002."""
    root = tmp_path_factory.mktemp("integrity")
    return train(load_config(None, small_overrides(root, tiny_vlm, *ARGS)), quiet=True)


def _interrupted_copy(finished: Path, dest: Path) -> Path:
    """A copy of the finished run as a run killed after its last checkpoint (no summary.json)."""
    run = Path(shutil.copytree(finished, dest, symlinks=True))
    (run / "summary.json").unlink()
    return run


def _flip_middle(f: Path, n: int = 64) -> None:
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    f.write_bytes(bytes(data))


def _truncate_half(f: Path) -> None:
    os.truncate(f, f.stat().st_size // 2)


def _empty(f: Path) -> None:
    f.write_bytes(b"")


def _other_schema(f: Path) -> None:
    torch.save({"weights": torch.zeros(3), "note": "not a vagent state"}, f)


DAMAGE = {
    "policy.pt-64-flipped-bytes": ("policy.pt", _flip_middle),
    "policy.pt-truncated": ("policy.pt", _truncate_half),
    "state.pt-truncated": ("state.pt", _truncate_half),
    "state.pt-empty": ("state.pt", _empty),
    "state.pt-other-schema": ("state.pt", _other_schema),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_file_is_named_and_the_intact_checkpoint_chosen(finished, tmp_path, kind):
    """What --resume chooses (select_checkpoint), and what loading the damaged one says."""
    name, damage = DAMAGE[kind]
    ckpts = Path(shutil.copytree(finished / "checkpoints", tmp_path / "checkpoints"))
    damage(ckpts / "step_000002" / name)
    said: list[str] = []
    chosen = select_checkpoint(ckpts, say=said.append)
    assert chosen is not None and chosen.path.name == "step_000001"
    assert said[0].startswith(f"warning: checkpoint {ckpts / 'step_000002'} is damaged ({name} ")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match=f"step_000002 is damaged: {name} .*checkpoints beside it that pass their checks: "
                                              "step_000001"):
        load_checkpoint(ckpts / "step_000002", {"policy": model})


@pytest.mark.parametrize("kind", ["policy.pt-64-flipped-bytes", "state.pt-empty"])
def test_damaged_checkpoint_is_named_and_the_run_resumes_from_the_intact_one(finished, tmp_path, kind):
    name, damage = DAMAGE[kind]
    run = _interrupted_copy(finished, tmp_path / "run")
    damage(run / "checkpoints" / "step_000002" / name)

    train(resume=run, quiet=True)

    log = (run / "train.log").read_text()
    assert f"step_000002 is damaged ({name}" in log
    assert "resuming from step_000001, the newest intact checkpoint" in log
    # step 2 ran again from step 1's intact state: the same records as the uninterrupted run, and
    # the rewritten checkpoint is intact and holds the same weights
    assert _comparable(run) == _comparable(finished)
    assert check_checkpoint(run / "checkpoints" / "step_000002") is None
    for module in ("policy.pt", "critic.pt"):
        a = torch.load(finished / "checkpoints" / "step_000002" / module, weights_only=True)
        b = torch.load(run / "checkpoints" / "step_000002" / module, weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_every_checkpoint_damaged_refuses_in_one_line(finished, tmp_path, capsys):
    run = _interrupted_copy(finished, tmp_path / "run")
    _flip_middle(run / "checkpoints" / "step_000002" / "policy.pt")
    _empty(run / "checkpoints" / "step_000001" / "state.pt")
    before = (run / "metrics.jsonl").read_bytes()

    assert main(["train", "--resume", str(run), "--quiet"]) == 1

    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"error: no intact checkpoint in {run / 'checkpoints'}")
    assert "step_000002: policy.pt does not match" in err and "step_000001: state.pt has 0 bytes" in err
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing trained, nothing cut


_WRITER = textwrap.dedent("""
    import sys, time
    import torch
    from vagent.runs.checkpoint import save_checkpoint

    def export(path):  # the policy export: the temporary folder exists and is being written
        path.mkdir()
        print("saving", flush=True)
        time.sleep(600)

    save_checkpoint(sys.argv[1], "rl", int(sys.argv[2]), {"policy": torch.nn.Linear(4, 4)}, export=export)
""")


def _start_writer(ckpt_dir: Path, step: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(ckpt_dir), str(step)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "saving"
    return proc


def test_sigkill_while_saving_leaves_a_folder_the_next_resume_removes(finished, tmp_path):
    run = _interrupted_copy(finished, tmp_path / "run")
    ckpts = run / "checkpoints"
    live = _start_writer(ckpts, 4)  # a save in progress in another process: its folder must stay
    try:
        killed = _start_writer(ckpts, 3)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        stale = ckpts / f".tmp-step_000003-{killed.pid}"
        assert (stale / "policy.pt").is_file()  # what the killed save left
        train(resume=run, quiet=True)
        assert not stale.exists()
        assert (ckpts / f".tmp-step_000004-{live.pid}" / "policy.pt").is_file()
        assert f"removed {stale}" in (run / "train.log").read_text()
    finally:
        live.kill()
        live.wait()


# ----------------------------------------------------------------------------------------------
# a full disk: a real tmpfs of a few MB
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); the full-disk test runs where they are")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({r.stderr.strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """A file that leaves ``leave`` bytes free on ``disk``."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_full_disk_is_one_line_and_the_run_resumes_once_space_is_freed(finished, small_disk, capsys):
    run = _interrupted_copy(finished, small_disk / "run")
    ckpt2 = run / "checkpoints" / "step_000002"
    size2 = sum(p.stat().st_size for p in ckpt2.rglob("*") if p.is_file())
    shutil.rmtree(ckpt2)  # killed before checkpoint 2: the resume trains step 2 and saves it
    filler = _fill(small_disk, size2 // 2)  # room for step 2's records, not for its checkpoint
    curves = run / "plots" / "curves.png"
    curves.unlink()
    curves.mkdir()  # the plots redrawn while the run stops fail too: that must not hide the disk's error

    for _ in range(2):  # the first try fills the disk; a second on the still-full disk fails the same way
        assert main(["train", "--resume", str(run), "--quiet"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(f"error: out of disk space writing checkpoint {ckpt2} (")
        assert " free); earlier checkpoints are intact" in err and f"vagent train --resume {run}" in err
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
        assert check_checkpoint(run / "checkpoints" / "step_000001") is None
        assert not ckpt2.exists()

    assert "while stopping, plotting failed too: IsADirectoryError" in (run / "train.log").read_text()
    filler.unlink()
    curves.rmdir()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert _comparable(run) == _comparable(finished)
    assert check_checkpoint(ckpt2) is None
