"""What a run prints: the console and train.log, progress lines with ETA, library output kept
off the console, the config summary."""

from __future__ import annotations

import logging
import re
import warnings

from vagent.runs.progress import Console, StepProgress, config_summary, format_duration, library_output_to_log


def test_console_keeps_lines_until_the_log_exists(tmp_path, capsys):
    console = Console()
    console.print("building tiny model ...")
    console.log("only in the log")
    assert capsys.readouterr().out == "building tiny model ...\n"
    log = tmp_path / "train.log"
    console.attach(log)
    console("after")  # a Console is a say(text) callable
    assert log.read_text() == "building tiny model ...\nonly in the log\nafter\n"


def test_progress_lines_have_eta_and_are_rationed(tmp_path, capsys):
    console = Console(tmp_path / "train.log")
    bar = StepProgress(100, "caption pretraining (grid)", console, interval_s=1e9)
    for k in range(1, 101):
        bar.update(k, {"sft/loss": 1.0 / k})
    bar.close()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 10  # every 10 steps (total / 10), the last included
    assert out[-1].startswith("caption pretraining (grid) 100/100 [") and "ETA 0s] loss=0.01" in out[-1]
    assert re.match(r"caption pretraining \(grid\) 10/100 \[\d+s, ETA \d+s\] loss=0\.1$", out[0])
    assert (tmp_path / "train.log").read_text().splitlines() == out


def test_progress_off_a_terminal_prints_a_line_per_few_updates_not_per_update(capsys):
    """The default run's 20 PPO updates, printed to a pipe (capsys is not a terminal), with the
    default interval: 10 lines (every 2nd update), not 20."""
    bar = StepProgress(20, "PPO", Console())
    for k in range(1, 21):
        bar.update(k, {"reward/mean": 0.5})
    bar.close()
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(" [")[0] for ln in out] == [f"PPO {k}/20" for k in range(2, 21, 2)]


def test_progress_to_a_say_callable_and_after_a_resume():
    said: list[str] = []
    bar = StepProgress(4, "PPO", said.append, start=2)
    bar.update(3)
    bar.update(4)
    assert [s.split(" [")[0] for s in said] == ["PPO 3/4", "PPO 4/4"]


def test_format_duration():
    assert [format_duration(s) for s in (0.4, 42, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]


def test_library_warnings_and_transformers_messages_go_to_the_log_only(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    console = Console(tmp_path / "train.log")
    with library_output_to_log(console):
        assert not hf_logging.is_progress_bar_enabled()
        warnings.warn("`foo` is deprecated", FutureWarning)
        hf_logging.get_logger("transformers.modeling_utils").warning("some weights were not initialized")
        logging.getLogger("huggingface_hub.file_download").warning("hub says")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    log = (tmp_path / "train.log").read_text()
    assert "FutureWarning: `foo` is deprecated" in log
    assert "transformers.modeling_utils warning: some weights were not initialized" in log
    assert "huggingface_hub.file_download warning: hub says" in log
    # restored afterwards
    assert hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("after", FutureWarning)
    assert [str(w.message) for w in caught] == ["after"]


def test_vagents_own_warnings_reach_the_terminal_and_the_log_even_when_quiet(tmp_path, capfd):
    """A replica that died is said by vagent.models.remote's logger: train.log keeps it (``--quiet``
    promises the log still gets everything), the terminal shows it unless quiet, once."""
    for quiet in (False, True):
        log_path = tmp_path / f"train-{quiet}.log"
        console = Console(log_path, quiet=quiet)
        with library_output_to_log(console):
            logging.getLogger("vagent.models.remote").warning("engine replica %d (pid %s) died", 1, 42)
            logging.getLogger("vagent.models.remote").info("not a warning")
        out, err = capfd.readouterr()
        said = "warning: engine replica 1 (pid 42) died"
        assert said in log_path.read_text() and "not a warning" not in log_path.read_text()
        assert (out + err).count(said) == (0 if quiet else 1), (out, err)
    logging.getLogger("vagent.models.remote").warning("after the run")  # the handler is gone again
    assert "after the run" not in (tmp_path / "train-False.log").read_text()


def test_config_summary_is_a_few_lines_naming_the_changes(tmp_path):
    from vagent.runconfig import load_config

    default = load_config()
    same = config_summary(default, default, tmp_path / "config.yaml")
    assert same[0].startswith(f"config: {tmp_path / 'config.yaml'}") and "unchanged" in same[1]
    cfg = load_config(None, ["steps=3", "envs.0.n_train=2", "log.progress=false", "update.actor_lr=0.001"])
    lines = config_summary(cfg, default, tmp_path / "config.yaml")
    assert len(lines) == 2 and "4 changed from the default preset" in lines[1]
    for item in ("steps=3", "envs.0.n_train=2", "log.progress=false", "update.actor_lr=0.001"):
        assert item in lines[1]
    many = load_config(None, [
        "steps=3", "seed=5", "sft.steps=1", "sft.lr=0.1", "sft.batch_size=3", "val.every=2", "update.epochs=3",
        "update.mini_batches=3", "update.micro_batch_tokens=77", "ppo.lam=0.5", "ppo.critic_lr=0.1",
        "log.keep_last=5", "log.plot_every=3", "log.rollouts_n=2", "rollout.max_turns=3", "rollout.max_new_tokens=9"])
    short = config_summary(many, default, "c.yaml", width=60, max_lines=3)
    assert len(short) == 4 and short[-1].startswith("  ... and ") and short[-1].endswith("more (see config.yaml)")


def test_config_summary_of_a_config_file_lists_what_the_file_and_overrides_set(tmp_path):
    """A --config file that sets a few fields: its summary lists those and the overrides, not the
    fields it left to their defaults (tiny_* and the rest differ from the default preset's)."""
    from vagent.runconfig import load_config
    from vagent.runs.progress import ConfigSource

    path = tmp_path / "my_run.yaml"
    path.write_text("steps: 3\nenvs:\n  - name: frozenlake\n    n_train: 2\nupdate:\n  actor_lr: 0.001\n")
    source = ConfigSource(str(path), ("seed=7",))
    cfg = load_config(path, list(source.overrides))
    lines = config_summary(cfg, load_config(), tmp_path / "config.yaml", source=source)
    assert f"5 set by {path} and 1 override(s):" in lines[1], lines
    text = " ".join(lines[1:])
    for item in ("steps=3", "envs.0.name=frozenlake", "envs.0.n_train=2", "update.actor_lr=0.001", "seed=7"):
        assert item in text, (item, lines)
    assert "tiny_" not in text and "sft." not in text, lines


def test_startup_says_ranks_and_warns_when_the_actor_never_updates(tmp_path):
    from vagent.runconfig import load_config
    from vagent.runs.progress import startup_arithmetic

    never = startup_arithmetic(load_config(None, ["steps=2", "ppo.critic_warmup_steps=2"]), tmp_path)
    assert "ranks: 1 (one process)" in never
    assert any(ln.startswith("warning: ppo.critic_warmup_steps=2 >= steps=2: the actor") for ln in never), never
    later = startup_arithmetic(load_config(None, ["steps=3", "ppo.critic_warmup_steps=2"]), tmp_path, ranks=4, nodes=2)
    assert not any(ln.startswith("warning") for ln in later)
    assert "critic warm-up: RL steps 1-2 train the critic only; the actor updates from step 3 on" in later
    assert "ranks: 4 (2 nodes x 2, torchrun); rank 0 writes the run directory" in later
    grpo = startup_arithmetic(load_config(None, ["recipe=grpo", "rollout.group_size=2", "steps=1", "ppo.critic_warmup_steps=2"]), tmp_path)
    assert not any("warm-up" in ln or "warm_up" in ln for ln in grpo)  # no critic, nothing to warm up
