"""``vagent eval``'s library output (issue 56: transformers' loading bar and deprecation warnings on
its console): :func:`library_output_to_file` keeps them in a file, as ``vagent train`` keeps them in
train.log."""

from __future__ import annotations

import warnings

from transformers.utils import logging as hf_logging

from vagent.models.loading import load_policy
from vagent.models.tiny import build_tiny_vlm
from vagent.runs.progress import library_output_to_file


def test_the_loading_bar_and_warnings_go_to_the_file_not_the_console(tmp_path, capfd):
    model = build_tiny_vlm(tmp_path / "model", hidden=32, layers=1, image_size=56)
    load_policy(model)
    assert "Loading weights" in capfd.readouterr().err  # without it: the bar on the console
    log = tmp_path / "out" / "eval.log"
    with library_output_to_file(log):
        load_policy(model)
        warnings.warn("`foo` is deprecated", FutureWarning)
        hf_logging.get_logger("transformers.modeling_utils").warning("some weights were not initialized")
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    text = log.read_text()
    assert "FutureWarning: `foo` is deprecated" in text
    assert "transformers.modeling_utils warning: some weights were not initialized" in text
    assert hf_logging.is_progress_bar_enabled()  # restored


def test_no_output_no_file(tmp_path):
    with library_output_to_file(tmp_path / "out" / "eval.log"):
        pass
    assert not (tmp_path / "out").exists()
