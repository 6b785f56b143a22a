"""Training recipes as loops you can read top to bottom, and the run around them.

- :mod:`vagent.recipes.ppo`    PPO with a critic (masked / bi-level / turn / no-concat GAE)
- :mod:`vagent.recipes.grpo`   GRPO, RLOO, REINFORCE++ (no critic), optional variance filter
- :mod:`vagent.recipes.stages` the typed records a step hands from stage to stage (``Scores`` ...) and the stages
  both recipes run alike on them (token batch, variance filter, KL to the reference, engine/trainer gap)
- :mod:`vagent.recipes.step`   what PPO and GRPO share around a step: their set-up (``rl_models``), the loop's frame
  (``StepLoop``: the rollout driver, which runs ``vagent.rollout.loop.TrainRollout``, progress, the step's
  tail), the step's metrics
- :mod:`vagent.recipes.sft`    SFT on JSONL chat data with images (the warm start before RL)
- :mod:`vagent.recipes.demos`  solver demonstrations in the SFT chat format (``vagent demos``)
- :mod:`vagent.recipes.update` the PPO-clip actor update and the critic update they share
- :mod:`vagent.recipes.common` the remote envs' check, devices, model set-up (env seeds and sampling settings:
  :mod:`vagent.rollout.specs`, re-exported)
- :mod:`vagent.recipes.optim`  seeds, optimizers, learning-rate schedules, gradient clipping
- :mod:`vagent.recipes.scoring` forward passes on a token batch and the scoring passes
- :mod:`vagent.recipes.batching` mini-/micro-batches and the weights that make accumulation exact
- :mod:`vagent.recipes.validation` validation rollouts, the reward and validation metrics
- :mod:`vagent.recipes.session` the run record the recipes share (``Session``)
- :mod:`vagent.recipes.sharding` which models are sharded how in a torchrun job, export of a sharded policy
- :mod:`vagent.runconfig` (a package below the recipes: the rollout drivers, replicas, tokens and
  progress read it without importing a recipe) the declared run config (``RunConfig``) and the
  default preset; ``vagent.recipes.config`` is its old name, still importable
- :mod:`vagent.recipes.run`    ``train(cfg)``: run dir, model, SFT, RL, plots (``vagent train``)
"""

from vagent.runconfig import RunConfig, load_config

__all__ = ["RunConfig", "load_config", "train"]


def train(cfg=None, resume=None, quiet: bool = False):
    """Run or resume a training run (see :func:`vagent.recipes.run.train`); returns the run dir."""
    from vagent.startup import heavy_imports

    with heavy_imports():  # out of the garbage collector's walks (vagent/startup.py)
        from vagent.recipes.run import train as _train  # heavy (torch, the recipes): `import vagent.recipes` stays light

    return _train(cfg, resume=resume, quiet=quiet)
