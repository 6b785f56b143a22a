"""The default pipeline gives the same numbers in any process, and runs can share a model cache.

- A ``vagent train`` process of the default preset scaled down (caption pretraining in two stages,
  solver demos, SFT, PPO, validation) with ``OMP_NUM_THREADS=1``, building its own tiny model, gives
  ``golden/<cpu>/scaled_default_metrics.jsonl`` (recorded in another process without that
  variable) apart from timing fields, in the environment the golden file was recorded in (same
  packages, CPU kernels and threads): that pins the default run's numerics across commits, so the
  README's main-job figures keep reproducing. Where no golden file applies, a second run without
  the variable, started beside the first as its competing load, gives identical ``metrics.jsonl``.
- Two processes building the same tiny model at once: one builds, the other waits and reuses it;
  neither reads a half-written directory and no temporary directory is left.
- A build killed with SIGKILL leaves its temporary directory; the next build removes it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vagent.runconfig.presets import SCALED_DEFAULT_OVERRIDES
from vagent.runs.metrics import without_timing

REPO = Path(__file__).resolve().parents[2]
#: one folder per CPU the golden run was recorded on: its metrics and its environment.json
GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN_METRICS, GOLDEN_ENV = "scaled_default_metrics.jsonl", "scaled_default_environment.json"

#: the default preset, every phase kept, a few steps each (pinned to the golden files' settings)
SCALED = list(SCALED_DEFAULT_OVERRIDES)


def _strip_timing(path: Path) -> list[dict]:
    return [without_timing(json.loads(line)) for line in path.read_text().splitlines()]


def cpu_slug(env: dict) -> str:
    """The golden folder's name for a CPU: its model, lower case (``AMD EPYC`` -> ``amd-epyc``)."""
    model = re.sub(r"\((r|tm)\)", "", env["cpu_model"].lower())
    return re.sub(r"[^a-z0-9]+", "-", model).strip("-")


def golden_for(env: dict) -> tuple[Path | None, str]:
    """The golden folder recorded on this CPU (same vendor and model, and the same kernel flags where
    the golden environment lists them) in this environment (threads, CPU kernels, packages), or None
    and the reason: a CPU with no golden file gets the list of those that have one."""
    from vagent.runs.environment import CPU_FIELDS, RESULT_FIELDS, environment_differences

    known = {d: json.loads((d / GOLDEN_ENV).read_text()) for d in sorted(GOLDEN_DIR.iterdir())
             if (d / GOLDEN_ENV).is_file()}
    for folder, golden_env in known.items():
        if not environment_differences(golden_env, env, CPU_FIELDS):
            diffs = environment_differences(golden_env, env, RESULT_FIELDS)
            if diffs:
                return None, (f"the golden metrics for this CPU ({folder.name}) were recorded in another "
                              "environment: " + "; ".join(diffs))
            return folder, ""
    cpus = "; ".join(f"{g.get('cpu_vendor', '?')} {g['cpu_model']!r}"
                     + (f" with {' '.join(g['cpu_flags'])}" if "cpu_flags" in g else "") + f" ({d.name}/)"
                     for d, g in known.items())
    return None, (f"no golden metrics for this CPU ({env.get('cpu_vendor')} {env['cpu_model']!r} with "
                  f"{' '.join(env.get('cpu_flags', []))}): the same run gives other last bits on another CPU "
                  f"(docs/results.md, 'Results on other CPUs'); golden metrics exist for {cpus}. "
                  "VAGENT_WRITE_GOLDEN=1 records this CPU's")


def _train(tmp: Path, name: str, env_extra: dict[str, str]) -> subprocess.Popen:
    """``vagent train`` of the scaled default run, its output in ``tmp/<name>.log`` (a file, not a
    pipe: two runs at once must not block on a full pipe that is not being read)."""
    from vagent.numerics import PINNED_CPU_KERNELS

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and k not in PINNED_CPU_KERNELS}
    env.update(env_extra)
    cmd = [sys.executable, "-m", "vagent.cli", "train", *SCALED, f"out_dir={tmp / 'runs'}", f"name={name}",
           f"model.cache_dir={tmp / ('cache-' + name)}"]
    with open(tmp / f"{name}.log", "w") as log:
        return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)


def _run_dir(tmp: Path, name: str) -> Path:
    dirs = sorted((tmp / "runs").glob(name + "*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def _environment(tmp: Path, name: str, proc: subprocess.Popen) -> dict | None:
    """The run's ``environment.json`` once written (early in the run), or None when the run ended first."""
    while True:
        found = sorted((tmp / "runs").glob(name + "*/environment.json"))
        if found:
            try:
                return json.loads(found[0].read_text())
            except json.JSONDecodeError:  # being written
                pass
        if proc.poll() is not None:
            return None
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # one or two short runs: ~1 min alone, far longer on a shared machine
def test_scaled_default_pipeline_identical_across_processes_load_and_omp_threads(tmp_path):
    """One run with ``OMP_NUM_THREADS=1`` equals the golden run of its CPU (recorded in another process,
    without that variable): the run's numbers depend on neither. On a CPU or an environment without
    golden metrics (or with ``VAGENT_WRITE_GOLDEN=1``), a second run without the variable starts once
    the first has written its environment, each the other's competing load on the cores (it sees the
    first as load when it chooses its OpenMP wait policy: vagent.machine_load), and the two are
    compared record by record."""
    a = _train(tmp_path, "omp1", {"OMP_NUM_THREADS": "1"})
    b = None
    try:
        env_a = _environment(tmp_path, "omp1", a)
        if env_a is None or golden_for(env_a)[0] is None or os.environ.get("VAGENT_WRITE_GOLDEN") == "1":
            b = _train(tmp_path, "loaded", {})
        a.wait()
        if b is not None:
            b.wait()
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert a.returncode == 0, (tmp_path / "omp1.log").read_text()[-3000:]
    run_a = _run_dir(tmp_path, "omp1")
    ma = _strip_timing(run_a / "metrics.jsonl")
    assert any("val/success_rate" in r for r in ma) and any("sft/loss" in r for r in ma)
    # the config's threads (2) decided the thread count, not OMP_NUM_THREADS
    env_a = json.loads((run_a / "environment.json").read_text())
    assert env_a["threads"] == 2 and env_a["omp_num_threads_env"] == "1"
    if b is not None:
        assert b.returncode == 0, (tmp_path / "loaded.log").read_text()[-3000:]
        run_b = _run_dir(tmp_path, "loaded")
        mb = _strip_timing(run_b / "metrics.jsonl")
        assert len(ma) == len(mb)
        for i, (ra, rb) in enumerate(zip(ma, mb)):
            assert ra == rb, f"record {i} differs: {sorted(set(ra.items()) ^ set(rb.items()))[:6]}"
        env_b = json.loads((run_b / "environment.json").read_text())
        assert env_b["threads"] == 2 and env_b["omp_num_threads_env"] is None

    # the numbers the default run's code gave on this CPU when its golden file was recorded
    # (VAGENT_WRITE_GOLDEN=1 records them, from the run without OMP_NUM_THREADS, e.g. after a
    # deliberate change of the default run or on a new CPU)
    if os.environ.get("VAGENT_WRITE_GOLDEN") == "1":
        folder = GOLDEN_DIR / cpu_slug(env_b)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / GOLDEN_METRICS).write_text("".join(json.dumps(r) + "\n" for r in mb))
        (folder / GOLDEN_ENV).write_text(json.dumps(env_b, indent=2) + "\n")
    folder, why = golden_for(env_a)
    if folder is None:
        pytest.skip(why)
    golden = [json.loads(line) for line in (folder / GOLDEN_METRICS).read_text().splitlines()]
    assert len(golden) == len(ma)
    for i, (g, r) in enumerate(zip(golden, ma)):
        # every recorded value unchanged; metric keys added since the recording are allowed
        kept = {k: r.get(k, "<missing>") for k in g}
        assert kept == g, f"record {i} differs from the golden run: {sorted(set(g.items()) ^ set(kept.items()))[:6]}"


def test_golden_metrics_are_chosen_by_cpu_and_an_unknown_cpu_is_told_the_known_ones():
    """Each golden folder's environment names its CPU; a run is compared only with the folder of
    its own CPU (vendor and model), in its own environment."""
    from vagent.runs.environment import describe_environment

    folders = sorted(d for d in GOLDEN_DIR.iterdir() if (d / GOLDEN_ENV).is_file())
    assert {d.name for d in folders} >= {"amd-epyc", "intel-xeon-processor"}
    for d in folders:
        recorded = json.loads((d / GOLDEN_ENV).read_text())
        assert recorded["cpu_vendor"] and cpu_slug(recorded) == d.name
        assert golden_for(recorded) == (d, "")
        assert len((d / GOLDEN_METRICS).read_text().splitlines()) == 9
        same_cpu_other_threads = dict(recorded, threads=1)
        assert golden_for(same_cpu_other_threads)[0] is None
        assert "threads: 2 -> 1" in golden_for(same_cpu_other_threads)[1]
    unknown = dict(describe_environment(), cpu_vendor="HygonGenuine", cpu_model="Hygon C86 7285")
    folder, why = golden_for(unknown)
    assert folder is None and "no golden metrics for this CPU" in why and "Hygon C86 7285" in why
    assert "AuthenticAMD 'AMD EPYC' (amd-epyc/)" in why and "GenuineIntel 'Intel(R) Xeon(R) Processor'" in why


_BUILD = """
import sys
from vagent.runconfig import ModelConfig, load_config
from vagent.recipes.tiny_cache import prepare_model
cfg = load_config()
m = cfg.model
m.cache_dir = sys.argv[1]
m.tiny_pretrain_steps = int(sys.argv[2])
m.tiny_pretrain_relation_steps = 0
out = prepare_model(m, cfg.envs, say=lambda s: print(s, flush=True))
print("MODEL", out, flush=True)
"""


def _build(cache: Path, steps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUILD, str(cache), str(steps)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _model_line(out: str) -> Path:
    return Path([ln for ln in out.splitlines() if ln.startswith("MODEL ")][-1].split(" ", 1)[1])


def test_two_processes_building_one_tiny_model_share_it(tmp_path):
    cache = tmp_path / "cache"
    procs = [_build(cache, 6), _build(cache, 6)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = {_model_line(o) for o in outs}
    assert len(dirs) == 1
    built = [o for o in outs if "building tiny model" in o]
    waited = [o for o in outs if "built by another process" in o or "waiting for another process" in o]
    assert len(built) == 1 and len(waited) == 1, outs
    model = dirs.pop()
    assert (model / "config.json").is_file() and (model / "vagent_pretrain.json").is_file()
    assert not list(cache.glob("*.tmp-*"))
    from vagent.models.loading import load_policy

    load_policy(model)  # whole and loadable


def test_killed_build_is_cleaned_up_by_the_next(tmp_path):
    cache = tmp_path / "cache"
    p = _build(cache, 4)
    deadline = time.time() + 300
    while time.time() < deadline and not list(cache.glob("*.tmp-*")) and p.poll() is None:
        time.sleep(0.02)
    assert list(cache.glob("*.tmp-*")), "the build never started"
    p.send_signal(signal.SIGKILL)  # mid-build: the model directory is renamed into place only when whole
    p.wait()
    stale = list(cache.glob("*.tmp-*"))
    assert stale  # what a killed build leaves
    q = _build(cache, 4)
    out, _ = q.communicate(timeout=600)
    assert q.returncode == 0, out
    assert "left by an interrupted build" in out
    assert not list(cache.glob("*.tmp-*"))
    assert (_model_line(out) / "config.json").is_file()


def test_build_that_raises_leaves_nothing(tmp_path, monkeypatch):
    """The model is built into its temporary folder, then caption pretraining raises: the folder
    is removed and no model directory appears."""
    import vagent.recipes.tiny_cache
    from vagent.runconfig import load_config
    from vagent.recipes.tiny_cache import prepare_model

    def fail(*args, **kwargs):
        raise RuntimeError("caption pretraining failed")

    monkeypatch.setattr(vagent.recipes.tiny_cache, "pretrain_captions", fail)  # the name the build calls
    cfg = load_config()
    m = cfg.model
    m.cache_dir = str(tmp_path / "cache")
    m.tiny_pretrain_steps = 2
    with pytest.raises(RuntimeError, match="caption pretraining failed"):
        prepare_model(m, cfg.envs, say=lambda s: None)
    assert (tmp_path / "cache").is_dir()  # the build had started
    assert not list((tmp_path / "cache").glob("*.tmp-*"))
    assert not [d for d in (tmp_path / "cache").iterdir() if d.is_dir()]


def test_resume_in_another_environment_warns(tmp_path):
    from vagent.runs.environment import describe_environment, record_environment

    said: list[str] = []
    now = record_environment(tmp_path, say=said.append)
    assert json.loads((tmp_path / "environment.json").read_text()) == now and not said
    record_environment(tmp_path, say=said.append)  # same process: nothing to say
    assert not said
    changed = dict(describe_environment(), threads=now["threads"] + 1)
    (tmp_path / "environment.json").write_text(json.dumps(changed))
    record_environment(tmp_path, say=said.append)
    assert len(said) == 1 and "threads" in said[0] and "not bit-exact" in said[0]


def test_resume_on_another_cpu_warns_and_an_older_record_without_cpu_fields_does_not(tmp_path):
    from vagent.runs.environment import describe_environment, record_environment

    now = describe_environment()
    assert now["cpu_vendor"] and now["cpu_model"] and isinstance(now["cpu_flags"], list)
    other = dict(now, cpu_vendor="GenuineIntel" if now["cpu_vendor"] != "GenuineIntel" else "AuthenticAMD",
                 cpu_model="Another CPU", cpu_flags=[*now["cpu_flags"], "amx_tile"])
    (tmp_path / "environment.json").write_text(json.dumps(other))
    said: list[str] = []
    record_environment(tmp_path, say=said.append)
    assert len(said) == 1 and "not bit-exact" in said[0]
    assert "cpu_vendor" in said[0] and "cpu_model: 'Another CPU'" in said[0] and "amx_tile" in said[0]
    # environment.json of a run started before vendor and flags were recorded: the model alone is compared
    older = {k: v for k, v in now.items() if k not in ("cpu_vendor", "cpu_flags")}
    (tmp_path / "environment.json").write_text(json.dumps(older))
    said.clear()
    record_environment(tmp_path, say=said.append)
    assert not said


def test_pin_cpu_kernels_respects_the_user():
    from vagent.numerics import PINNED_CPU_KERNELS, pin_cpu_kernels

    env = {"ATEN_CPU_CAPABILITY": "avx512"}
    done = pin_cpu_kernels(env)
    assert env["ATEN_CPU_CAPABILITY"] == "avx512" and "ATEN_CPU_CAPABILITY" not in done
    if done:  # an x86 CPU with AVX2
        assert all(env[k] == v for k, v in PINNED_CPU_KERNELS.items() if k != "ATEN_CPU_CAPABILITY")
