"""A run directory is data, never code (issue 55, items 1-3).

A planted pickle (``exec`` of code that creates a marker file) in every file that a resume, an eval
of a run, ``vagent view`` and the hub upload read -- ``state.pt``, ``policy.pt`` / ``critic.pt``,
``inflight.pt``, ``rng_rank0.pt``, ``dcp/.metadata`` and a ``.distcp`` value, ``canary_probe.pt``, a
manifest-less folder's ``state.pt``, ``policy/pytorch_model.bin`` -- never runs: the marker never
appears and the refusal names the file and the global, with the manifest recomputed (a manifest
is no defence) or absent. Then the canary probe (recorded in each checkpoint's identity; a probe
of no prompt refused) and the identity gaps (a checkpoint without ``identity.json`` in a run with
``run.json``; another run's or another step's ``inflight.pt``).

The checkpoint-level tests build folders with ``save_checkpoint``; the ``real_run`` ones plant
the payload in a real tiny run's directory and go through ``vagent train --resume``,
``vagent eval``, the viewer's page and the hub upload.
"""

from __future__ import annotations

import enum
import json
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.distributed.conftest import SMALL, tiny_vlm_dir, train  # noqa: F401 (fixture)
from vagent.runs.checkpoint import (
    _VERIFIED, CheckpointError, capture_rng, check_checkpoint, list_checkpoints, load_checkpoint, load_object,
    save_checkpoint, select_checkpoint,
)
from vagent.runs.dcp_state import sharded_state
from vagent.runs.identity import RunIdentity
from vagent.runs.manifest import MANIFEST, write_manifest
from vagent.runs.rundir import write_atomic
from vagent.runs.safe_load import RECORDS, UnsafeFileError, data_problem, load_data

GLOBAL = "builtins.exec"  # what the payload names


class Payload:
    """Pickles as ``exec(<code that creates the marker file>)``: what a hostile file holds."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"import pathlib; pathlib.Path({self.marker!r}).touch()",))


def _plant(f: Path, marker: Path) -> None:
    """Replace torch file ``f`` with a plausible one holding the payload (a raw pickle for
    ``.metadata``, which DCP writes as one)."""
    if f.name == ".metadata":
        f.write_bytes(pickle.dumps(Payload(marker), protocol=4))
        return
    torch.save({"phase": "rl", "step": 1, "weight": torch.zeros(2), "payload": Payload(marker)}, f)


def _recompute_manifest(ckpt: Path) -> None:
    """What anyone who can write the folder can do: a manifest that lists the planted file."""
    (ckpt / MANIFEST).unlink(missing_ok=True)
    write_manifest(ckpt)
    _VERIFIED.clear()


def _run(root: Path, seed: int = 0) -> tuple[Path, RunIdentity]:
    root.mkdir(parents=True, exist_ok=True)
    identity = RunIdentity.new({"seed": seed, "recipe": "ppo", "steps": 4})
    write_atomic(root / "run.json", identity.to_json())
    return root / "checkpoints", identity


def _modules(seed: int = 0):
    torch.manual_seed(seed)
    policy, critic = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy(torch.randn(2, 3)).sum().backward()
    opt.step()
    return {"policy": policy, "critic": critic}, {"actor": opt}


def _in_flight(step: int, run_id: str | None):
    from vagent.rollout.driver import InFlight
    from vagent.rollout.finish import RolloutResult

    return InFlight(step=step, version=step - 1, episodes=RolloutResult([], {"rollout/x": 1.0}), run_id=run_id)


def _save(ckpts: Path, step: int, run_id: str | None = None, seed: int = 0) -> Path:
    modules, opts = _modules(seed)
    return save_checkpoint(ckpts, "rl", step, modules, opts, data_position={"rl_step": step}, keep_last=5,
                           objects={"inflight": _in_flight(step, run_id)})


def _save_sharded(ckpts: Path, step: int) -> Path:
    """A sharded checkpoint folder as a job writes it (dcp/, rng_rank0.pt, state.pt), made in one process."""
    import torch.distributed.checkpoint as dcp

    modules, opts = _modules()
    p = ckpts / f"step_{step:06d}"
    p.mkdir(parents=True)
    dcp.save(sharded_state(modules, opts), checkpoint_id=p / "dcp")
    torch.save(capture_rng(), p / "rng_rank0.pt")
    torch.save({"phase": "rl", "step": step, "data_position": None, "rng": capture_rng(), "optimizers": {},
                "schedulers": {}, "extra": {}, "world_size": 2, "format": "dcp"}, p / "state.pt")
    write_manifest(p)
    return p


def test_the_payload_runs_when_unpickled(tmp_path):
    """The planted files are live: ``torch.load(weights_only=False)``, what vagent did before, runs them."""
    marker = tmp_path / "RAN"
    _plant(tmp_path / "state.pt", marker)
    torch.load(tmp_path / "state.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    _plant(tmp_path / ".metadata", marker)
    pickle.loads((tmp_path / ".metadata").read_bytes())
    assert marker.exists()


# ----------------------------------------------------------------------------------------------
# every file of a checkpoint, manifest recomputed: the check names it, the resume skips it, the
# loader (with the check bypassed) refuses it; nothing runs
# ----------------------------------------------------------------------------------------------

ONE_PROCESS = ["state.pt", "policy.pt", "critic.pt", "inflight.pt"]
SHARDED = ["rng_rank0.pt", "dcp/.metadata", "state.pt"]


def _load_all(p: Path) -> None:
    modules, opts = _modules(1)
    load_checkpoint(p, modules, opts)
    load_object(p, "inflight")


@pytest.mark.parametrize("layout, rel", [("one", f) for f in ONE_PROCESS] + [("dcp", f) for f in SHARDED])
def test_a_payload_in_any_checkpoint_file_never_runs(tmp_path, monkeypatch, layout, rel):
    ckpts, identity = _run(tmp_path / "run")
    marker = tmp_path / "RAN"
    older = _save(ckpts, 1, identity.run_id)
    target = _save(ckpts, 2, identity.run_id) if layout == "one" else _save_sharded(ckpts, 2)
    _plant(target / rel, marker)
    _recompute_manifest(target)

    problem = check_checkpoint(target)
    assert problem == f"{rel} needs {GLOBAL}, which vagent does not load: a run directory is data, never code"
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append, run=identity).path == older  # falls back, says why
    assert f"{rel} needs {GLOBAL}" in said[0] and target.name in said[0]
    with pytest.raises(CheckpointError, match=f"{target.name} is damaged: {rel} needs {GLOBAL}"):
        _load_all(target)
    import vagent.runs.checkpoint as ck  # the loaders themselves, the check bypassed: still refused

    monkeypatch.setattr(ck, "check_checkpoint", lambda p, under="": None)
    with pytest.raises(CheckpointError, match=f"{target.name} is damaged: {rel} needs {GLOBAL}"):
        _load_all(target)
    assert not marker.exists()


def test_a_payload_in_a_sharded_value_never_runs(tmp_path):
    """A non-tensor value of a ``.distcp`` file (DCP reads it with torch.load(weights_only=False))."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "RAN"
    p = _save_sharded(tmp_path / "checkpoints", 2)
    modules, opts = _modules()
    state = sharded_state(modules, opts)
    state["optim.actor"]["param_groups"][0]["lr"] = Payload(marker)
    shutil.rmtree(p / "dcp")
    dcp.save(state, checkpoint_id=p / "dcp")
    _recompute_manifest(p)
    assert check_checkpoint(p) is None  # the metadata is DCP's own: the value is refused where it is read
    modules, opts = _modules(1)
    with pytest.raises(CheckpointError, match=f"dcp value optim.actor.param_groups.0.lr needs {GLOBAL}"):
        load_checkpoint(p, modules, opts)
    assert not marker.exists()


def test_a_manifestless_folder_is_checked_without_running_it(tmp_path):
    """The damage check of a folder an older vagent wrote (no manifest) used to unpickle its state.pt."""
    marker = tmp_path / "RAN"
    ckpts, identity = _run(tmp_path / "run")
    _save(ckpts, 1, identity.run_id)
    (ckpts / "step_000009").mkdir()
    _plant(ckpts / "step_000009" / "state.pt", marker)
    assert check_checkpoint(ckpts / "step_000009") == (
        f"state.pt needs {GLOBAL}, which vagent does not load: a run directory is data, never code")
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append, run=identity).step == 1
    assert "step_000009 is damaged (state.pt needs builtins.exec" in said[0]
    assert not marker.exists()


def test_an_object_a_resume_would_refuse_is_not_saved(tmp_path):
    """An env that puts another type in its info: the save says so, not the resume."""
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"checkpoint object 'inflight' cannot be saved .*needs pathlib\.PosixPath"):
        save_checkpoint(tmp_path, "rl", 1, {"policy": model}, objects={"inflight": {"info": {"where": Path("/x")}}})
    assert list_checkpoints(tmp_path) == [] and not any(tmp_path.iterdir())


def test_the_users_own_safe_globals_are_left_as_they_were():
    class Mine:
        pass

    import io

    users = list(torch.serialization.get_safe_globals())
    torch.serialization.add_safe_globals([Mine])
    try:
        before = list(torch.serialization.get_safe_globals())
        buf = io.BytesIO()
        torch.save([1, 2], buf)
        buf.seek(0)
        assert load_data(buf, RECORDS) == [1, 2]
        after = list(torch.serialization.get_safe_globals())
        # the user's stay and ours are gone (torch may register its own, e.g. NestedTensor, on first use: not ours)
        assert Mine in after and all(g in after for g in before)
        from vagent.runs.safe_load import _globals
        assert not [g for g in _globals(RECORDS) if g in after and g not in before]
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(users)


# ----------------------------------------------------------------------------------------------
# the canary's probe: recorded in each checkpoint's identity, and a probe of no prompt refused
# ----------------------------------------------------------------------------------------------

def _probe_run(tmp_path: Path):
    from vagent.rollout.canary import PROBE_FILE, ProbePrompt, save_probe

    ckpts, identity = _run(tmp_path / "run")
    probe = ckpts.parent / PROBE_FILE
    save_probe(probe, [ProbePrompt([1, 2, 3], None, None, ())])
    ck = _save(ckpts, 1, identity.run_id)
    return ckpts, identity, probe, ck


def test_each_checkpoint_records_the_probe_and_a_changed_or_removed_one_is_refused(tmp_path):
    from vagent.rollout.canary import load_probe, probe_for_run, save_probe
    from vagent.runs.manifest import file_sha256

    ckpts, identity, probe, ck = _probe_run(tmp_path)
    recorded = json.loads((ck / "identity.json").read_text())["run_files"]
    assert recorded == {"canary_probe.pt": file_sha256(probe)}
    assert select_checkpoint(ckpts, say=lambda _: None, run=identity).path == ck
    assert len(probe_for_run(ckpts.parent, [], None)[0]) == 1

    save_probe(probe, [])  # emptied: the canary would check nothing
    for resume in (lambda: select_checkpoint(ckpts, say=lambda _: None, run=identity),
                   lambda: probe_for_run(ckpts.parent, [], None)):
        with pytest.raises(CheckpointError) as err:
            resume()
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{probe} is not the file checkpoint step_000001 recorded")
        assert msg.endswith("restore it from a copy of the run directory")
    with pytest.raises(ValueError, match="holds no prompt, so the weight canary would check nothing"):
        load_probe(probe)
    probe.unlink()
    with pytest.raises(CheckpointError, match=f"{probe} is missing, but checkpoint step_000001 recorded it"):
        select_checkpoint(ckpts, say=lambda _: None, run=identity)
    with pytest.raises(CheckpointError, match="is missing, but checkpoint step_000001 recorded it"):
        probe_for_run(ckpts.parent, [], None)


def test_a_probe_with_a_payload_never_runs(tmp_path):
    from vagent.rollout.canary import load_probe

    marker = tmp_path / "RAN"
    probe = tmp_path / "canary_probe.pt"
    torch.save([{"input_ids": [1], "pixel_values": None, "image_grid_thw": None, "images": [Payload(marker)]}], probe)
    with pytest.raises(ValueError, match=f"canary_probe.pt: not a readable weight-canary probe .*needs {GLOBAL}"):
        load_probe(probe)
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------
# identity gaps
# ----------------------------------------------------------------------------------------------

def test_a_checkpoint_without_identity_is_refused_in_a_run_and_accepted_outside_one(tmp_path):
    ckpts, identity = _run(tmp_path / "run")
    _save(ckpts, 1, identity.run_id)
    other, _ = _run(tmp_path / "other", seed=1)
    _save(other, 2, seed=1)
    shutil.copytree(other / "step_000002", ckpts / "step_000002")  # another run's, its identity removed
    (ckpts / "step_000002" / "identity.json").unlink()
    (ckpts / "step_000002" / "inflight.pt").unlink()
    _recompute_manifest(ckpts / "step_000002")
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append, run=identity).step == 1
    assert "it has no identity.json, which every checkpoint of a run with run.json has" in said[0]
    shutil.rmtree(ckpts / "step_000001")
    with pytest.raises(CheckpointError, match="no intact checkpoint in .*step_000002: it has no identity.json"):
        select_checkpoint(ckpts, say=lambda _: None, run=identity)

    outside = tmp_path / "plain" / "checkpoints"  # no run.json: no identity.json, and none expected
    _save(outside, 3)
    assert not (outside / "step_000003" / "identity.json").exists()
    assert select_checkpoint(outside, say=lambda _: None).step == 3


def _session(root: Path, steps: int = 4):
    lines: list[str] = []
    return SimpleNamespace(run=SimpleNamespace(root=root), cfg=SimpleNamespace(steps=steps),
                           console=SimpleNamespace(print=lines.append))


def test_another_runs_in_flight_rollout_is_refused_before_anything_is_written(tmp_path):
    from vagent.recipes.step import resume_in_flight

    ckpts, identity = _run(tmp_path / "run")
    _save(ckpts, 1, identity.run_id)
    ck = _save(ckpts, 2, identity.run_id)
    torch.save(_in_flight(2, "f" * 32), ck / "inflight.pt")  # another run's, at the same step
    _recompute_manifest(ck)
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append, run=identity).step == 1  # at the choice: skipped
    assert "its inflight.pt belongs to another run (run id ffffffffffff" in said[0]
    driver = SimpleNamespace(resume_in_flight=lambda saved, step: pytest.fail("handed to the driver"))
    with pytest.raises(CheckpointError) as err:
        resume_in_flight(_session(ckpts.parent), driver, str(ck), 2)
    assert "\n" not in str(err.value) and "its inflight.pt belongs to another run" in str(err.value)

    torch.save(_in_flight(1, identity.run_id), ck / "inflight.pt")  # this run's, another step's
    _recompute_manifest(ck)
    said.clear()
    assert select_checkpoint(ckpts, say=said.append, run=identity).step == 1
    assert "its inflight.pt holds the rollout of RL step 2 sampled with weights 0, not the one" in said[0]
    with pytest.raises(CheckpointError, match="its inflight.pt holds the rollout of RL step 2"):
        resume_in_flight(_session(ckpts.parent), driver, str(ck), 2)

    taken = []
    torch.save(_in_flight(2, identity.run_id), ck / "inflight.pt")
    resume_in_flight(_session(ckpts.parent), SimpleNamespace(resume_in_flight=lambda s, k: taken.append((s, k))),
                     str(ck), 2)
    assert taken[0][0].run_id == identity.run_id and taken[0][0].episodes.metrics == {"rollout/x": 1.0}


# ----------------------------------------------------------------------------------------------
# a real run directory: vagent train --resume, vagent eval, the viewer, the hub upload
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_run(tmp_path_factory, tiny_vlm_dir) -> Path:
    """A finished one-step PPO run of the tiny VLM (checkpoint step_000001, rollouts, one val env)."""
    return train(tmp_path_factory.mktemp("trust"), tiny_vlm_dir, None, "base", "log.rollouts_every=1",
                 "envs.0.n_val=1", timeout=400)


def _interrupted(real_run: Path, dest: Path) -> Path:
    run = Path(shutil.copytree(real_run, dest, symlinks=True))
    (run / "summary.json").unlink()
    return run


def test_a_resume_skips_a_manifestless_folder_with_a_payload_and_goes_on(real_run, tmp_path):
    from vagent.cli import main

    run = _interrupted(real_run, tmp_path / "run")
    marker = tmp_path / "RAN"
    (run / "checkpoints" / "step_000009").mkdir()
    _plant(run / "checkpoints" / "step_000009" / "state.pt", marker)
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    log = (run / "train.log").read_text()
    assert f"step_000009 is damaged (state.pt needs {GLOBAL}" in log and "resuming from step_000001" in log
    assert (run / "summary.json").is_file() and not marker.exists()


def _foreign_in_flight(f: Path, marker: Path) -> None:
    torch.save(_in_flight(1, "f" * 32), f)


PLANTED = {"state.pt": _plant, "policy.pt": _plant, "critic.pt": _plant, "inflight.pt": _plant,
           "inflight.pt-of-another-run": _foreign_in_flight}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_a_resume_refuses_a_planted_file_in_one_line_before_writing(real_run, tmp_path, capsys, kind):
    from vagent.cli import main

    run = _interrupted(real_run, tmp_path / "run")
    marker = tmp_path / "RAN"
    ckpt = run / "checkpoints" / "step_000001"
    name = kind.split("-")[0]
    PLANTED[kind](ckpt / name, marker)
    _recompute_manifest(ckpt)
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(run), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no intact checkpoint" in err and name in err
    assert (f"{name} needs {GLOBAL}" in err) if kind == name else ("its inflight.pt belongs to another run" in err)
    assert not marker.exists() and (run / "metrics.jsonl").read_bytes() == metrics


def test_eval_view_and_hub_upload_of_a_planted_run_run_nothing(real_run, tmp_path, monkeypatch, capsys):
    """Every pickle in the run planted (the policy's weights as pytorch_model.bin, the safetensors
    gone, so that transformers has to read it): the viewer's page, the hub upload of the whole
    checkpoint and ``vagent eval RUN_DIR`` run none of them."""
    from huggingface_hub import HfApi, constants

    from tests.runs.hubserver import FakeHub
    from vagent.cli import main
    from vagent.runs.hub import HubUploader
    from vagent.viewer.data import open_source
    from vagent.viewer.server import static_html

    run = Path(shutil.copytree(real_run, tmp_path / "run", symlinks=True))
    marker = tmp_path / "RAN"
    ckpt = run / "checkpoints" / "step_000001"
    for f in [*ckpt.glob("*.pt"), run / "canary_probe.pt", ckpt / "policy" / "pytorch_model.bin"]:
        _plant(f, marker)
    for f in (ckpt / "policy").glob("*.safetensors"):
        f.unlink()
    _recompute_manifest(ckpt)

    assert "<html" in static_html(open_source(run)).lower()

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with FakeHub() as hub:
        up = HubUploader("me/run", tmp_path / "upload", what="checkpoint", say=lambda m: None, poll_s=0.02,
                         api=HfApi(endpoint=hub.url, token="hf_test")).start()
        shutil.copytree(ckpt, tmp_path / "upload" / ckpt.name)
        up.close()
    assert up.uploaded == [ckpt.name] and any(k.endswith("state.pt") for k in hub.commits[-1]["files"])

    capsys.readouterr()
    code = main(["eval", str(run)])  # refused in one line (vagent.models.loading.UnsafeWeightsError), not a traceback
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("[eval]")]
    assert code != 0 and not marker.exists()
    assert len(err) == 1 and "*.bin weights need code to load" in err[0], err


class _Py311Pickler(pickle.Pickler):
    """Pickles an enum member as Python 3.11.0-3.11.4 do (``getattr(cls, "NAME")``), whatever this
    Python does; ``getattr`` of anything else where ``instead`` says."""

    def __init__(self, f, instead: dict | None = None):
        super().__init__(f, protocol=4)
        self.instead = instead or {}

    def reducer_override(self, obj):
        if id(obj) in self.instead:
            return (getattr, self.instead[id(obj)])
        return (getattr, (type(obj), obj.name)) if isinstance(obj, enum.Enum) else NotImplemented


def test_dcp_metadata_pickled_by_python_3_11_2_loads_and_getattr_serves_only_enum_members(tmp_path):
    """A sharded checkpoint written on Debian 12's Python 3.11.2 names ``builtins.getattr`` in
    ``dcp/.metadata`` (its enum members); vagent reads its own checkpoint there, and ``getattr`` of
    anything but an admitted enum's member is still refused, running nothing."""
    import io

    import torch.distributed.checkpoint as dcp

    from vagent.runs.safe_load import load_pickle_data

    dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    meta = pickle.loads((tmp_path / "dcp" / ".metadata").read_bytes())  # written here: trusted
    old = io.BytesIO()
    _Py311Pickler(old).dump(meta)
    assert b"getattr" in old.getvalue()  # as 3.11.2 writes it
    (tmp_path / "old.metadata").write_bytes(old.getvalue())
    back = load_pickle_data(tmp_path / "old.metadata", "dcp/.metadata")
    assert back.state_dict_metadata["w"].properties == meta.state_dict_metadata["w"].properties
    assert back.state_dict_metadata["w"].size == torch.Size([2, 3])

    # getattr of an admitted class's method, then called: Path(marker).touch() were getattr allowed as such
    marker = tmp_path / "ran"
    touch = (b"cbuiltins\ngetattr\n(cpathlib\nPosixPath\nVtouch\ntR(cpathlib\nPosixPath\n(V"
             + str(marker).encode() + b"\ntRtR.")
    (tmp_path / "bad.metadata").write_bytes(touch)
    with pytest.raises(UnsafeFileError, match=r"^dcp/.metadata needs builtins\.getattr, which vagent does not load"):
        load_pickle_data(tmp_path / "bad.metadata", "dcp/.metadata")
    assert not marker.exists()
    pickle.loads(touch)  # what the bytes do when unpickled freely
    assert marker.exists()
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    for target in [(torch.Size, "__new__"), (_MEM_FORMAT_ENCODING, "__class__")]:  # not an enum; not a member
        box = SimpleNamespace()
        buf = io.BytesIO()
        _Py311Pickler(buf, {id(box): target}).dump(box)
        (tmp_path / "bad.metadata").write_bytes(buf.getvalue())
        with pytest.raises(UnsafeFileError, match=r"^dcp/.metadata needs builtins\.getattr"):
            load_pickle_data(tmp_path / "bad.metadata", "dcp/.metadata")
