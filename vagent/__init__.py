"""vagent: train vision-language-model agents with multi-turn reinforcement learning.

Subpackages (the folder tree is the architecture):

- ``vagent.envs``     environment contract, registry, reasoning formats, checker, the envs
- ``vagent.rollout``  the multi-turn loop, Turn/Episode records, token batches with masks
- ``vagent.rl``       advantage estimators, losses and filters as pure tensor functions
- ``vagent.rewards``  reasoning judges (grounding / world-modeling rewards)
- ``vagent.models``   model loading, the tiny VLM builder, critic, generation engines
- ``vagent.runconfig`` the declared run config (``RunConfig``), its ranges, presets and loading
- ``vagent.recipes``  PPO, GRPO and SFT as readable loops
- ``vagent.service``  HTTP environment server and its client
- ``vagent.eval``     evaluation harness for local and API models
"""

__version__ = "0.1.0"

# the OpenMP wait settings of the processes vagent starts (``import vagent`` changes no environment)
from vagent.omp import machine_load, omp_wait_settings  # noqa: E402,F401
