"""The viewer's documents (vagent.viewer.data) for validation points and judge reasons, on the
two-step judged run of tests/viewer/_run.py (no browser)."""

from __future__ import annotations

import json

import pytest

from tests.viewer._run import VAL_SEEDS, make_run
from vagent.viewer.data import ViewerError, open_source
from vagent.viewer.turns import turn_view


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer_data") / "run"
    return root, make_run(root, steps=2, n_episodes=4)


def test_validation_points_are_groups_with_their_rates(run):
    root, _ = run
    ix = open_source(root).index()
    assert [(g["id"], g["split"]) for g in ix["groups"]] == [
        ("step_000000", "train"), ("step_000001", "train"), ("val_000000", "val"), ("val_000001", "val")]
    val1 = ix["groups"][3]
    assert val1["label"] == "validation @ step 1" and val1["success"] == 0.25 and val1["return"] == 0.3
    assert val1["tokens"] == "no (not trained)"


def test_validation_episodes_replay_the_same_seeds_without_tokens(run):
    root, out = run
    src = open_source(root)
    assert [e["seed"] for e in src.episodes("val_000000")] == [e["seed"] for e in src.episodes("val_000001")] \
        == list(VAL_SEEDS)
    ep = src.episode("val_000001", 1)
    assert ep["token_data"] is None and "not trained" in ep["no_tokens_reason"]
    assert [t["reply"] for t in ep["turns"]] == [t.reply for t in out[1][3][1].turns]
    assert all((root / im).is_file() for t in ep["turns"] for im in t["images"])


def test_turn_shows_the_recorded_judge_reason(run):
    root, out = run
    src = open_source(root)
    eps = out[0][0]
    e, t = next((e, t) for e in range(len(eps)) for t in eps[e].turns if t.judge_reasons)
    view = src.episode("step_000000", e)["turns"][t.index]
    assert {j["kind"]: j["reason"] for j in view["judge"]} == t.judge_reasons
    # a record from before the reasons were written: the reason worked out from the numbers
    rec = json.loads((root / "rollouts" / "step_000000.jsonl").read_text().splitlines()[e])["turns"][t.index]
    rec.pop("judge_reasons")
    old = turn_view(rec, "frozenlake", {}, [], "")["judge"]
    assert all(j["reason"].startswith(("weight x score", "anti-hacking penalty", "rule checks failed")) for j in old)


def test_bad_group_ids_say_what_is_expected(run):
    src = open_source(run[0])
    with pytest.raises(ViewerError, match="expected step_ or val_ and a 6-digit step"):
        src.episodes("train_000001")
    with pytest.raises(ViewerError, match=r"no validation episodes saved at step 7 \(saved: \[0, 1\]\)"):
        src.episodes("val_000007")


def test_a_turn_shows_the_weights_version_that_sampled_it(tmp_path):
    """A streaming run's trajectory spans weights versions: the saved record keeps each turn's, the
    viewer's turn shows it (and a turn without one, an in-process run's, shows none)."""
    import torch

    from tests.viewer._run import episode
    from vagent.runs.samples import episode_record, save_rollouts

    ep = next(e for seed in range(50) if len((e := episode(seed, 0, 0, torch.Generator().manual_seed(0))).turns) >= 2)
    for i, t in enumerate(ep.turns):
        t.weights_version = 3 + min(i, 1)
    assert [t["weights_version"] for t in episode_record(ep)["turns"]] == [3] + [4] * (len(ep.turns) - 1)
    folder = tmp_path / "rollouts"
    folder.mkdir()
    path = save_rollouts(folder, 0, [ep], 1, 50.0)
    rec = json.loads(path.read_text().splitlines()[0])
    views = [turn_view(t, "frozenlake", {}, [], "") for t in rec["turns"]]
    assert [v["weights_version"] for v in views] == [3] + [4] * (len(ep.turns) - 1)
    rec["turns"][0].pop("weights_version")
    assert turn_view(rec["turns"][0], "frozenlake", {}, [], "")["weights_version"] is None
    assert all(v["token_versions"] is None for v in views)  # no reply was split by a push


def test_a_reply_split_by_a_push_keeps_each_tokens_version_in_the_record_and_the_view(tmp_path):
    """``rollout.interrupt``: a push stopped the reply and it continued on the next weights; the
    saved record and the viewer's turn carry the version of each sampled token."""
    import torch

    from tests.viewer._run import episode
    from vagent.runs.samples import save_rollouts

    ep = episode(0, 0, 0, torch.Generator().manual_seed(0))
    turn = ep.turns[0]
    n = len(turn.sampled_token_ids)
    assert n >= 2
    turn.weights_version, turn.token_versions = 2, [2] * (n // 2) + [3] * (n - n // 2)
    folder = tmp_path / "rollouts"
    folder.mkdir()
    rec = json.loads(save_rollouts(folder, 0, [ep], 1, 50.0).read_text().splitlines()[0])
    assert rec["turns"][0]["token_versions"] == turn.token_versions
    view = turn_view(rec["turns"][0], "frozenlake", {}, [], "")
    assert view["weights_version"] == 2 and view["token_versions"] == turn.token_versions
    from vagent.viewer.files import TURN_TYPES, BadFile, _check_types

    rec["turns"][0]["token_versions"] = "v2"  # a damaged record: refused, naming the field
    with pytest.raises(BadFile, match="token_versions"):
        _check_types(rec["turns"][0], TURN_TYPES, "turn 0")
