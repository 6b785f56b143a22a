"""What a new user trips over in ``vagent train``: env-config typos fail before anything is built,
changing how the run's envs render reuses the cached tiny model, ``--describe`` shows the values
the default run uses, and a bad flag prints train's own usage."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vagent.cli import main
from vagent.config import ConfigError
from vagent.runconfig import pretrain_env_entries
from vagent.recipes.tiny_cache import prepare_model, tiny_model_dir
from vagent.runconfig import EnvEntry, ModelConfig, load_config


def test_env_config_typo_fails_before_any_model_is_built(tmp_path):
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "vagent.cli", "train", "envs.0.config.rendr=text",
                          f"model.cache_dir={cache}", f"out_dir={runs}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr  # one line
    assert "envs.0.config" in out.stderr and "unknown key 'rendr'" in out.stderr
    assert "Did you mean 'render'?" in out.stderr
    assert not cache.exists() and not runs.exists()  # no model build, no temp dir, no run directory
    assert "building tiny model" not in out.stdout


@pytest.mark.parametrize("override, expected", [
    ("envs.0.name=frozenlak", "envs.0.name: Unknown env 'frozenlak'. Did you mean 'frozenlake'?"),
    ("envs.0.config.image_size=big", "envs.0.config: env 'frozenlake' config.image_size: expected an integer"),
])
def test_env_entries_are_checked_against_the_env_config(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert expected in str(err.value)


def test_run_env_render_knobs_keep_the_tiny_model_key():
    default = load_config(None)
    other = load_config(None, ["envs.0.config.render=text", "envs.0.config.image_size=96",
                               "envs.0.config.description_style=natural", "envs.0.config.format=no_think",
                               "envs.0.config.reward_progress=0"])
    assert tiny_model_dir(other.model, other.envs) == tiny_model_dir(default.model, default.envs)
    # the captions render with the model's own settings: the default run's env settings, as before
    (entry,) = pretrain_env_entries(default.model, other.envs)
    assert entry.config == {"format": "grounding_worldmodeling", "render": "vision", "description_style": "symbolic",
                            "image_size": 128}
    # what changes the captions changes the key: the model's pretraining env settings, the env kinds
    own = load_config(None, ["model.tiny_pretrain_env_config={description_style: natural}"])
    assert tiny_model_dir(own.model, own.envs) != tiny_model_dir(default.model, default.envs)
    sokoban = load_config(None, ["envs.0.name=sokoban", "envs.0.config={}"])
    assert tiny_model_dir(sokoban.model, sokoban.envs) != tiny_model_dir(default.model, default.envs)


def test_a_render_change_reuses_the_built_tiny_model(tmp_path):
    m = ModelConfig(cache_dir=str(tmp_path), tiny_family="qwen2_5_vl", tiny_hidden=32, tiny_layers=1,
                    tiny_image_size=56, tiny_pretrain_steps=1, tiny_pretrain_batch=2)
    said: list[str] = []
    text = prepare_model(m, [EnvEntry("frozenlake", {"render": "text"})],
                         say=said.append)
    assert any("building tiny model" in s for s in said)
    said.clear()
    vision = prepare_model(m, [EnvEntry("frozenlake", {"render": "vision", "image_size": 96,
                                                       "description_style": "natural"})], say=said.append)
    assert vision == text and said == []  # reused, nothing built
    # it was pretrained on images at its own size, though the first run's env rendered text
    captions = (text / "pretrain" / "grid" / "captions.jsonl").read_text()
    assert '"images": ["images/frozenlake_' in captions
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_describe_shows_the_default_run_values(capsys):
    assert main(["train", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "\nsteps (int) = 20 (class default 30)  #" in out
    assert "\nmodel.tiny_layers (int) = 3 (class default 2)  #" in out
    assert "\nmodel.tiny_family (str) = 'qwen3_vl' (class default 'qwen2_5_vl')  #" in out
    assert "\nmodel.tiny_image_size (int) = 128 (class default 96)  #" in out
    assert "\nseed (int) = 0  #" in out  # equal values: no class default


def test_unknown_train_flag_prints_trains_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--foo"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vagent train ") and "error: unrecognized arguments: --foo" in err


def test_pretraining_env_config_typo_fails_at_load():
    with pytest.raises(ConfigError, match=r"model.tiny_pretrain_env_config \(frozenlake caption boards\): .*"
                                          r"unknown key 'rendr'. Did you mean 'render'\?"):
        load_config(None, ["model.tiny_pretrain_env_config={rendr: text}"])


def test_a_build_stopped_with_sigterm_leaves_no_temporary_folder(tmp_path):
    import signal
    import time

    script = ("from vagent.recipes.tiny_cache import prepare_model\n"
              "from vagent.runconfig import EnvEntry, ModelConfig\n"
              f"m = ModelConfig(cache_dir={str(tmp_path)!r}, tiny_hidden=32, tiny_layers=1, tiny_image_size=56,\n"
              "                tiny_pretrain_steps=100000, tiny_pretrain_batch=2)\n"
              "prepare_model(m, [EnvEntry()])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not list(tmp_path.glob("*/pretrain/grid/captions.jsonl")) and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name], "the build never started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt: signal 15 while building the tiny model" in out, out[-2000:]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_build_that_cannot_exit_after_sigterm_is_ended_with_its_stacks():
    """The interrupt leaves the process unable to exit (here a thread that never ends blocks the
    interpreter's shutdown): faulthandler's watchdog, armed by the SIGTERM, prints where every
    thread is and ends the process."""
    import signal
    import time

    script = ("import threading, time\n"
              "from vagent.recipes import tiny_cache\n"
              "tiny_cache.STOP_GRACE_S = 3.0\n"
              "def never_ends():\n"
              "    threading.Event().wait()\n"
              "with tiny_cache._sigterm_interrupts():\n"
              "    threading.Thread(target=never_ends, name='stuck').start()\n"
              "    print('ready', flush=True)\n"
              "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "KeyboardInterrupt: signal 15 while building the tiny model" in err
    assert "Timeout (0:00:03)!" in err and "in never_ends" in err, err[-2000:]
    assert waited >= 3.0
