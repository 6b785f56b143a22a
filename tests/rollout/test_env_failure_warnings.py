"""An env that fails the same way for every episode (a missing package, a dead server) is warned
about once per process, not once per episode; a different failure is warned about again."""

from __future__ import annotations

import logging

from vagent.rollout import trajectory


def test_the_same_env_failure_is_warned_once(caplog, monkeypatch):
    monkeypatch.setattr(trajectory, "_WARNED", set())
    missing = ImportError("backend='maniskill' needs ManiSkill 3")
    with caplog.at_level(logging.DEBUG, logger=trajectory.logger.name):
        for seed in range(5):
            trajectory._warn_env_failure("reset", "primitive_skill", seed, missing)
        trajectory._warn_env_failure("reset", "frozenlake", 0, missing)  # another env: said
        trajectory._warn_env_failure("step", "primitive_skill", 9, RuntimeError("server gone"))  # another error
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3, warned
    assert warned[0].startswith("env primitive_skill seed 0 failed at reset: backend='maniskill'")
    assert "said once" in warned[0]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 4  # the repeats, at debug level
