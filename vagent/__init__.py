"""vagent: train vision-language-model agents with multi-turn reinforcement learning.

Subpackages (the folder tree is the architecture):

- ``vagent.envs``     environment contract, registry, reasoning formats, checker, the envs
- ``vagent.rollout``  the multi-turn loop, Turn/Episode records, token batches with masks
- ``vagent.rl``       advantage estimators, losses and filters as pure tensor functions
- ``vagent.rewards``  reasoning judges (grounding / world-modeling rewards)
- ``vagent.models``   model loading, the tiny VLM builder, critic, generation engines
- ``vagent.recipes``  PPO, GRPO and SFT as readable loops
- ``vagent.service``  HTTP environment server and its client
- ``vagent.eval``     evaluation harness for local and API models
"""

__version__ = "0.1.0"

import os as _os

# OpenMP workers sleep when idle instead of spinning (libgomp's default spins for a while): on a
# machine whose cores other processes hold, spinning workers steal the time the working thread
# needs, and a tiny model's many small ops wait on them (bench/busy_cpu.py: one forward + backward
# of the default run's model took 11x longer with the default policy than with PASSIVE at load
# average 4.4 on 2 cores). It takes effect when vagent is imported before torch (the vagent
# command, and every process it starts, which inherit it); results are unchanged (scheduling only).
# A user's own OMP_WAIT_POLICY wins; VAGENT_OMP_WAIT=keep leaves the runtime's default.
if _os.environ.get("VAGENT_OMP_WAIT") != "keep":
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
