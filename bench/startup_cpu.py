"""CPU of short ``vagent train`` commands with their heavy imports kept out of Python's garbage
collector (vagent/startup.py) against the same commands without (the baseline, measured in the
same run, interleaved).

    python bench/startup_cpu.py [--repeats 5] [--nproc 2]

The baseline runs with a ``sitecustomize`` (on ``PYTHONPATH``, so torchrun's ranks get it too) that
turns :func:`vagent.startup.heavy_imports` and :func:`vagent.startup.freeze_set_up` into no-ops
before vagent loads. Then an engine replica's start as a Ray actor runs it (a fresh process: the
class's module, the arguments unpickled, ``__init__``), its model and encoder unpickled before
``__init__`` (the baseline) or ``Deferred`` (vagent.models.replica_actors). Each command's CPU is its own plus its waited-for children's (``os.wait4``):
one process, or the launcher, torchrun and the ranks of a job. Prints the medians, their ratio, the
CPU and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402

# a 2-step PPO run on the tiny VLM: the tests' SMALL settings
TINY = ["steps=2", "sft.steps=0", "val.every=0", "threads=1", "model.cache_dir=UNUSED", "envs.0.n_train=2",
        "envs.0.n_val=2", "envs.0.config.image_size=64", "rollout.max_turns=2", "rollout.max_new_tokens=12",
        "update.epochs=1", "update.mini_batches=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0",
        "log.tensorboard=false", "log.progress=false", "log.plot_every=0", "log.plots=false"]

# an engine replica actor's start as Ray runs it, in a fresh process: the class's module, the
# arguments unpickled, then __init__ (ARGS: plain model and encoder, or Deferred ones)
REPLICA = """
import pickle, sys
from vagent.models.replica_actors import EngineReplica
with open(sys.argv[1], "rb") as f:
    model, encoder = pickle.load(f)
EngineReplica(model, encoder)
"""

BASELINE = '''
import contextlib
import vagent.startup as s
s.heavy_imports = contextlib.nullcontext
s.freeze_set_up = lambda: None
'''


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    """User + system seconds of ``cmd`` and the children it waited for; fails loudly if it failed."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def replica_start(root: Path, model_dir: Path, repeats: int) -> None:
    """A replica actor's start with its model and encoder unpickled by Ray before ``__init__`` (the
    baseline) against ``Deferred`` ones, unpickled inside ``heavy_imports``."""
    from ray import cloudpickle

    from vagent.models.loading import load_policy
    from vagent.models.replica_actors import Deferred

    loaded = load_policy(model_dir)
    files = {"baseline": root / "plain.pkl", "vagent": root / "deferred.pkl"}
    files["baseline"].write_bytes(cloudpickle.dumps((loaded.model, loaded.encoder)))
    files["vagent"].write_bytes(cloudpickle.dumps((Deferred(loaded.model), Deferred(loaded.encoder))))
    cpu: dict[str, list[float]] = {"baseline": [], "vagent": []}
    for _ in range(repeats):
        for kind, path in files.items():
            cpu[kind].append(cpu_of([sys.executable, "-c", REPLICA, str(path)], dict(os.environ)))
    base, new = statistics.median(cpu["baseline"]), statistics.median(cpu["vagent"])
    print(f"replica start: {new:.2f} s of CPU, baseline {base:.2f} s: {new / base:.2f}x (medians of {repeats}; "
          f"vagent {min(cpu['vagent']):.2f}-{max(cpu['vagent']):.2f}, "
          f"baseline {min(cpu['baseline']):.2f}-{max(cpu['baseline']):.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=0, help="also a job of this many ranks (0: one process only)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    from vagent.models.tiny import build_tiny_vlm

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_vlm(root / "tiny-vlm", hidden=64, layers=2, image_size=64)
        (root / "baseline").mkdir()
        (root / "baseline" / "sitecustomize.py").write_text(BASELINE)
        env = dict(os.environ)
        base_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "baseline"), env.get("PYTHONPATH")]))}
        commands = {"1 process": [sys.executable, "-m", "vagent", "train", *TINY, f"model.path={model}"]}
        if args.nproc > 1:
            commands[f"{args.nproc} ranks"] = [*commands["1 process"][:4], "--nproc", str(args.nproc),
                                               *commands["1 process"][4:]]
        load0 = os.getloadavg()[0]
        print(f"{cpu_name()}, {os.cpu_count()} cores; load average at start {load0:.2f}")
        for label, cmd in commands.items():
            cpu: dict[str, list[float]] = {"baseline": [], "vagent": []}
            for i in range(args.repeats):
                for kind, e in (("baseline", base_env), ("vagent", env)):
                    cpu[kind].append(cpu_of([*cmd, f"out_dir={root / 'runs' / kind / str(i)}"], e))
            base, new = statistics.median(cpu["baseline"]), statistics.median(cpu["vagent"])
            print(f"{label}: {new:.2f} s of CPU, baseline {base:.2f} s: {new / base:.2f}x "
                  f"(medians of {args.repeats}; vagent {min(cpu['vagent']):.2f}-{max(cpu['vagent']):.2f}, "
                  f"baseline {min(cpu['baseline']):.2f}-{max(cpu['baseline']):.2f})")
        replica_start(root, model, args.repeats)
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
