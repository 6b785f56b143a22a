"""The viewer against what a hostile page or an odd file can throw at it (no browser).

- The real server on loopback answers only requests addressed to its own names: a ``Host`` of
  another name (a web page that re-pointed its domain at 127.0.0.1: DNS rebinding) gets 403, for
  the API and for ``/files/`` alike; 127.0.0.1, localhost and [::1] (any port) and names passed
  with ``--allow-host`` are served. The real ``vagent view`` process is checked once, with a stray
  ``rollouts/step_latest.jsonl`` beside the run's dumps (skipped, not a crash at start-up).
- Every malformed file is a JSON 4xx naming the file and line (a record without ``turns``, a field
  of the wrong type, a line that is not JSON, an over-long token mask, a deeply nested line in
  ``metrics.jsonl``, a bad evaluation record), never a closed connection.
- A token dump above ``--max-token-mb`` is not read; its episodes say why.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vagent.viewer.data import RunSource, open_source
from vagent.viewer.server import serve_in_thread

TURN = {"index": 0, "observation": "P_\n_G", "frames": [], "reply": "<answer>Right</answer>",
        "parsed": {"actions": ["Right"], "error": None}, "format_ok": True, "reward": 0.0, "env_reward": 0.0}
RECORD = {"env_name": "frozenlake", "env_config": {"render": "text"}, "seed": 1, "success": False,
          "total_reward": 0.0, "env_return": 0.0, "turns": [TURN], "final_frames": []}
ROW = {"row": 0, "episode": 0, "truncated": False, "bootstrap_index": 0, "input_ids": [65, 66, 67],
       "loss_mask": [0, 1, 1], "turn_index": [-1, 0, 0], "sample_logprobs": [None, -1.0, -0.5], "advantages": [0, 1, 1]}
TOKENS = {"schema": 1, "step": 1, "image_token_id": None, "pad_token_id": 0, "eos_token_ids": [2],
          "pieces": {"65": "A", "66": "B", "67": "C"}, "fields": ["advantages"], "rows": [ROW]}


def write_run(root: Path, records: list | None = None, tokens: dict | None = None,
              metrics: list[str] | None = None) -> Path:
    """A small run directory: rollouts/step_000001.jsonl (+ .tokens.json) and metrics.jsonl, written
    as given (records and metrics lines may be raw strings, to be malformed)."""
    (root / "rollouts").mkdir(parents=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in (records or [RECORD, RECORD])]
    (root / "rollouts" / "step_000001.jsonl").write_text("\n".join(lines) + "\n")
    (root / "rollouts" / "step_000001.tokens.json").write_text(json.dumps(tokens or TOKENS))
    (root / "config.yaml").write_text("seed: 0\n")
    rows = metrics or [json.dumps({"step": 1, "phase": "rl", "rollout/success_rate": 0.5, "reward/mean": 0.1})]
    (root / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return root


def get(port: int, path: str, host: str | None) -> tuple[int, dict | bytes]:
    """GET ``path`` from 127.0.0.1:``port`` with this Host header (None: none sent)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("GET", path, skip_host=True)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, json.loads(body) if resp.getheader("Content-Type") == "application/json" else body


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = write_run(tmp_path_factory.mktemp("safety") / "run")
    server, _ = serve_in_thread(open_source(root), port=0, allow_hosts=("viewer.lan",))
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("host", ["attacker.example:{port}", "attacker.example", "127.0.0.1.attacker.example:{port}",
                                  "localhost.attacker.example", "evil.lan:{port}", None,
                                  # not an RFC 3986 authority (vagent.authority): a name after the brackets, two ports,
                                  # userinfo, a port that is not digits
                                  "[::1]evil.com", "[::1]evil.com:{port}", "localhost:80:80", "evil.com@localhost",
                                  "[::1]:80x", ""])
def test_other_host_names_are_refused(served, host):
    for path in ("/files/config.yaml", "/api/index", "/"):
        status, body = get(served, path, host and host.format(port=served))
        assert status == 403, (host, path, status)
        assert "DNS rebinding" in body["error"] and "--allow-host" in body["error"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LocalHost", "127.0.0.1",
                                  "localhost:9000", "viewer.lan:8080", "viewer.lan"])
def test_the_viewers_own_names_are_served(served, host):
    status, body = get(served, "/files/config.yaml", host.format(port=served))
    assert status == 200 and body == b"seed: 0\n"
    status, index = get(served, "/api/index", host.format(port=served))
    assert status == 200 and [g["id"] for g in index["groups"]] == ["step_000001"]


def test_vagent_view_skips_stray_files_and_checks_the_host(tmp_path):
    root = write_run(tmp_path / "run")
    for stray in ("step_latest.jsonl", "val_latest.jsonl", "step_00001x.jsonl", "notes.txt"):
        (root / "rollouts" / stray).write_text("{}\n")
    proc = subprocess.Popen([sys.executable, "-m", "vagent.cli", "view", str(root), "--port", "0",
                             "--allow-host", "viewer.lan"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line + proc.stderr.read()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        status, index = get(port, "/api/index", f"127.0.0.1:{port}")
        assert status == 200 and [g["id"] for g in index["groups"]] == ["step_000001"]
        assert get(port, "/files/config.yaml", "viewer.lan:443")[0] == 200
        assert get(port, "/files/config.yaml", f"attacker.example:{port}")[0] == 403
    finally:
        proc.terminate()
        proc.wait(timeout=30)


DEEP = "[" * 100_000 + "]" * 100_000
NO_TURNS = {k: v for k, v in RECORD.items() if k != "turns"}


@pytest.mark.parametrize("case,path,where,what", [
    ("no turns", "/api/episodes?group=step_000001", "rollouts/step_000001.jsonl line 2", "no 'turns'"),
    ("reply is a number", "/api/episode?group=step_000001&i=0", "rollouts/step_000001.jsonl line 1", "'reply' is 5"),
    ("success is a string", "/api/episodes?group=step_000001", "rollouts/step_000001.jsonl line 2", "'success'"),
    ("turns is a dict", "/api/episodes?group=step_000001", "rollouts/step_000001.jsonl line 1", "'turns'"),
    ("actions is a string", "/api/episode?group=step_000001&i=1", "rollouts/step_000001.jsonl line 2",
     "parsed: 'actions'"),
    ("not JSON", "/api/episodes?group=step_000001", "rollouts/step_000001.jsonl line 2", "not valid JSON"),
    ("nested line", "/api/episodes?group=step_000001", "rollouts/step_000001.jsonl line 1", "nested deeper"),
    ("over-long mask", "/api/episode?group=step_000001&i=0", "rollouts/step_000001.tokens.json: rows[0]",
     "loss_mask has 5 entries, input_ids 3"),
    ("turn index not a number", "/api/episode?group=step_000001&i=0", "rollouts/step_000001.tokens.json: rows[0]",
     "turn_index"),
    ("nested metrics line", "/api/index", "metrics.jsonl line 2", "nested deeper"),
    ("metrics line without a step", "/api/index", "metrics.jsonl line 1", "integer 'step'"),
])
def test_each_odd_file_is_a_json_4xx_naming_the_file_and_line(tmp_path, case, path, where, what):
    records, tokens, metrics = None, None, None
    if case == "no turns":
        records = [RECORD, NO_TURNS]
    elif case == "reply is a number":
        records = [{**RECORD, "turns": [{**TURN, "reply": 5}]}, RECORD]
    elif case == "success is a string":
        records = [RECORD, {**RECORD, "success": "yes"}]
    elif case == "turns is a dict":
        records = [{**RECORD, "turns": {"0": TURN}}]
    elif case == "actions is a string":
        records = [RECORD, {**RECORD, "turns": [{**TURN, "parsed": {"actions": "Right"}}]}]
    elif case == "not JSON":
        records = [RECORD, '{"env_name": "frozenlake", "turns": [']
    elif case == "nested line":
        records = ['{"turns": ' + DEEP + "}"]
    elif case == "over-long mask":
        tokens = {**TOKENS, "rows": [{**ROW, "loss_mask": [0, 1, 1, 1, 1]}]}
    elif case == "turn index not a number":
        tokens = {**TOKENS, "rows": [{**ROW, "turn_index": [-1, "0", 0]}]}
    elif case == "nested metrics line":
        metrics = [json.dumps({"step": 1, "rollout/success_rate": 0.5}), '{"step": 2, "x": ' + DEEP + "}"]
    elif case == "metrics line without a step":
        metrics = [json.dumps({"rollout/success_rate": 0.5})]
    root = write_run(tmp_path / "run", records, tokens, metrics)
    server, _ = serve_in_thread(open_source(root), port=0)
    try:
        status, body = get(server.server_address[1], path, "127.0.0.1")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 422, (status, body)
    assert where in body["error"] and what in body["error"], body["error"]


def test_a_bad_evaluation_record_names_its_file(tmp_path):
    cell = tmp_path / "ev" / "episodes" / "m" / "frozenlake" / "free"
    cell.mkdir(parents=True)
    good = {**RECORD, "key": {"seed": 0, "sample": 0},
            "turns": [{**TURN, "observation": {"text": "P_\n_G", "images": []}}]}
    (cell / "a.json").write_text(json.dumps(good))
    (cell / "b.json").write_text(json.dumps({**good, "key": {"seed": "one", "sample": 0}}))
    (tmp_path / "ev" / "summary.json").write_text(json.dumps({"cells": []}))
    server, _ = serve_in_thread(open_source(tmp_path / "ev"), port=0)
    try:
        status, body = get(server.server_address[1], "/api/episodes?group=m/frozenlake/free", "localhost")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 422 and "episodes/m/frozenlake/free/b.json: key: 'seed'" in body["error"], body


def test_a_token_dump_over_the_cap_is_not_read_and_says_so(tmp_path):
    root = write_run(tmp_path / "run", tokens={**TOKENS, "rows": [ROW] * 200})  # ~30 kB
    capped = RunSource(root, max_token_mb=0.01)
    assert capped.index()["groups"][0]["tokens"].startswith("not read")
    ep = capped.episode("step_000001", 0)
    assert ep["token_data"] is None and "--max-token-mb 1" in ep["no_tokens_reason"], ep["no_tokens_reason"]
    assert ep["turns"][0]["reply"] == "<answer>Right</answer>"  # text, images and rewards still shown
    assert RunSource(root).episode("step_000001", 0)["token_data"]["n_loss"] == 2 * 200  # under the default cap
