"""The tiny model of ``model.path: tiny``: built (and caption-pretrained) once per configuration,
then reused from ``model.cache_dir`` by every run and process.

The cache directory's name is its key (:func:`tiny_model_dir`: the model's own fields, the
tokenizer corpus, the pretraining settings). A build runs under a file lock in a private temporary
folder that is renamed into place when complete, so concurrent runs wait and reuse it; a killed
build's folder is removed by the next builder, and Ctrl-C / SIGTERM remove their own. In a job of
several ranks (:func:`prepare_model_once`), a tiny model still to be caption-pretrained is built by
every rank together (:func:`build_tiny_spmd`); anything else rank 0 prepares while the others wait.
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import hashlib
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Sequence

from filelock import FileLock, Timeout

from vagent.distributed import barrier, broadcast_object, single_process
from vagent.distributed import world as current_world
from vagent.models.loading import resolve_model_path
from vagent.models.tiny import build_tiny_vlm, tokenizer_corpus
from vagent.runconfig import EnvEntry, ModelConfig, RunConfig, pretrain_env_entries
from vagent.recipes.pretrain import CaptionStage, Pace, pretrain_captions
from vagent.runs.progress import format_duration


def tiny_model_dir(m: ModelConfig, envs: Sequence[EnvEntry] = ()) -> Path:
    """Where ``model.path: tiny`` lives: keyed by what changes the model: its sizes, the tokenizer
    corpus and (when caption pretrained) the pretraining settings and the envs whose boards it
    saw (:func:`pretrain_env_entries`: their names and the model's pretraining env settings, never
    the run's env config)."""
    corpus = hashlib.sha256("\n".join(tokenizer_corpus()).encode()).hexdigest()[:8]
    name = f"tiny-{m.tiny_family}-h{m.tiny_hidden}-l{m.tiny_layers}-i{m.tiny_image_size}-s{m.tiny_seed}-{corpus}"
    if m.tiny_heads != 4:  # 4 heads: the name the tiny models had before the knob
        name += f"-heads{m.tiny_heads}"
    if m.tiny_rope_theta:
        name += f"-rope{m.tiny_rope_theta:g}"
    if m.tiny_pretrain_steps > 0:
        # the captions depend on what the envs show, not on how they reward (reward_* keys)
        key = (repr([(e.name, sorted((k, v) for k, v in e.config.items() if not k.startswith("reward")))
                     for e in pretrain_env_entries(m, envs)])
               + f"{m.tiny_pretrain_lr}/{m.tiny_pretrain_batch}/{sorted(m.tiny_pretrain_relations)}"
               + (f"/{m.tiny_pretrain_relation_steps}" if m.tiny_pretrain_relation_steps else ""))
        name += f"-cap{m.tiny_pretrain_steps}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return Path(m.cache_dir).expanduser() / name


# the relation stage's caption boards start here, after the grid stage's (2048 by default)
_RELATION_BOARDS_FROM = 10_000


def prepare_model(m: ModelConfig, envs: Sequence[EnvEntry] = (),
                  say: Callable[[str], None] = print) -> Path:
    """The model directory to load: ``path``, or the tiny model (built, and caption-pretrained when
    ``tiny_pretrain_steps > 0``, once; then reused from ``cache_dir``).

    Safe for runs sharing one cache: the build runs under an exclusive file lock
    (``<name>.lock`` beside the model) in a private temporary directory that is renamed into place
    when complete, so a model directory with ``config.json`` is always whole and never changes
    afterwards. A run that finds the lock taken waits for the other build and reuses it; a build
    that raises, or is interrupted by Ctrl-C or SIGTERM, removes its temporary directory; one
    killed with SIGKILL leaves it for the next builder (who holds the lock, so no one else is
    writing it) to delete."""
    if m.path != "tiny":  # a local directory, or a hub id's snapshot in the Hugging Face cache
        return resolve_model_path(m.path)
    out = tiny_model_dir(m, envs)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(f"waiting for another process that is building {out.name} (lock {lock.lock_file}) ...")
        lock.acquire()
    try:
        if (out / "config.json").is_file():
            say(f"reusing {out.name}, built by another process")
            return out
        _build_into_place(m, envs, out, say)
    finally:
        lock.release()
    return out


def _build_into_place(m: ModelConfig, envs: Sequence[EnvEntry], out: Path, say: Callable[[str], None]) -> None:
    """Under the cache's lock: delete killed builds' folders, build into a temporary folder of our
    own and rename it to ``out`` (the folder is removed if the build raises or is interrupted)."""
    for stale in out.parent.glob(glob.escape(out.name) + ".tmp-*"):  # left by a killed build
        say(f"removing {stale.name}, left by an interrupted build")
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        with _sigterm_interrupts():
            build_tiny(m, envs, tmp, out.name, say)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


#: seconds a build stopped by SIGTERM has to end before it is ended for it (see _sigterm_interrupts)
STOP_GRACE_S = 60.0


@contextlib.contextmanager
def _sigterm_interrupts():
    """Within the block, SIGTERM (``kill``, ``timeout``, a scheduler) raises KeyboardInterrupt in
    the main thread like Ctrl-C does, so a build's ``finally`` removes its temporary folder;
    outside it, and in other threads, SIGTERM keeps its handler.

    SIGTERM means stop: an exception raised at an arbitrary point can leave a library's lock or
    thread in a state that blocks the interpreter's exit, so the handler also arms faulthandler's
    watchdog (a C thread that needs no GIL). A process still alive ``STOP_GRACE_S`` seconds later
    prints every thread's stack to stderr (where it was stuck) and exits with status 1."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        stream = sys.__stderr__
        if stream is not None:
            with contextlib.suppress(ValueError, OSError, AttributeError):  # no file descriptor
                faulthandler.dump_traceback_later(STOP_GRACE_S, exit=True, file=stream)
        raise KeyboardInterrupt(f"signal {signum} while building the tiny model")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def build_tiny(m: ModelConfig, envs: Sequence[EnvEntry], tmp: Path, name: str,
                say: Callable[[str], None]) -> None:
    """Build the tiny model into ``tmp`` and caption-pretrain it (one or two stages); once the
    first stage's pace is measured, say once how long the whole build will take (:func:`say_estimate`)."""
    t_build = time.perf_counter()
    say(f"building tiny model {name} (first run only) ...")
    build_tiny_vlm(tmp, family=m.tiny_family, hidden=m.tiny_hidden, layers=m.tiny_layers, heads=m.tiny_heads,
                   kv_heads=max(1, m.tiny_heads // 2), image_size=m.tiny_image_size, seed=m.tiny_seed,
                   rope_theta=m.tiny_rope_theta or None)
    if m.tiny_pretrain_steps > 0:
        envs = pretrain_env_entries(m, envs)
        two_stage = m.tiny_pretrain_relation_steps > 0 and bool(m.tiny_pretrain_relations)
        steps = m.tiny_pretrain_steps + (m.tiny_pretrain_relation_steps if two_stage else 0)
        say(f"caption-pretraining it for {m.tiny_pretrain_steps} steps (image -> board description) ...")
        grid = CaptionStage(steps=m.tiny_pretrain_steps, batch_size=m.tiny_pretrain_batch, lr=m.tiny_pretrain_lr,
                            seed=m.tiny_seed, relations=() if two_stage else tuple(m.tiny_pretrain_relations))
        pretrain_captions(tmp, envs, grid, say=say,
                          on_pace=lambda pace: say_estimate(pace, t_build, steps, 2 if two_stage else 1, say))
        if two_stage:
            say(f"then {m.tiny_pretrain_relation_steps} steps on captions that add where the "
                f"{', '.join(m.tiny_pretrain_relations)} is (on fresh boards) ...")
            relations = CaptionStage(steps=m.tiny_pretrain_relation_steps, stage="relations",
                                     relations=tuple(m.tiny_pretrain_relations),
                                     n_per_env=m.tiny_pretrain_relation_steps * m.tiny_pretrain_batch,
                                     first_board=_RELATION_BOARDS_FROM, batch_size=m.tiny_pretrain_batch,
                                     lr=m.tiny_pretrain_lr, seed=m.tiny_seed + 1)
            pretrain_captions(tmp, envs, relations, say=say)


def say_estimate(pace: Pace, t_build: float, steps: int, stages: int, say: Callable[[str], None]) -> None:
    """Say how long a build that started at ``t_build`` (``time.perf_counter``) will take in all:
    the time so far, plus its ``steps`` pretraining steps (every stage's) not done yet at the first
    stage's ``pace``, plus each later stage's set-up as long as the first's."""
    so_far = time.perf_counter() - t_build
    total = so_far + (steps - pace.steps_done) * pace.step_s + (stages - 1) * pace.setup_s
    say(f"the model build will take {about(total)} in all at this machine's pace now ({pace.step_s:.2f} s a step "
        f"over the first steps; {format_duration(so_far)} so far); the pace changes with the machine's load")


def about(seconds: float) -> str:
    """``about 40 seconds`` under a minute (to 10 s), else ``about N minutes`` (``about 1 minute``)."""
    if seconds < 60:
        return f"about {max(10, int(round(seconds, -1)))} seconds"
    minutes = int(round(seconds / 60))
    return f"about {minutes} minute{'s' if minutes != 1 else ''}"


def prepare_model_once(cfg: RunConfig, console: Callable[[str], None]) -> Path:
    """``prepare_model``; in a job, a tiny model that still has to be caption-pretrained is built
    by every rank together (:func:`build_tiny_spmd`); anything else rank 0 prepares alone while the
    other ranks wait for the model directory to appear. Every rank must see cache_dir."""
    world = current_world()
    if not world.distributed:
        return prepare_model(cfg.model, cfg.envs, say=console)  # a Console: progress bars on a terminal
    model_cfg = cfg.model
    if (model_cfg.path == "tiny" and model_cfg.tiny_pretrain_steps > 0
            and not (tiny_model_dir(model_cfg, cfg.envs) / "config.json").is_file()):
        build_tiny_spmd(cfg, console)
    if world.is_main:
        with single_process():
            path = prepare_model(model_cfg, cfg.envs, say=console)
    else:
        wait_for_file(tiny_model_dir(model_cfg, cfg.envs) / "config.json" if model_cfg.path == "tiny" else None)
        path = prepare_model(model_cfg, cfg.envs, say=console)
    barrier("model ready")
    return path


def build_tiny_spmd(cfg: RunConfig, console: Callable[[str], None]) -> None:
    """Build and caption-pretrain the tiny model with every rank of the job, in one folder (Hugging
    Face's ``save_pretrained`` writes from rank 0 only); the caption pretraining is sharded
    (``pretrain.py``); rank 0 puts the folder in place under the cache's lock (``prepare_model``'s
    protocol: a folder with config.json is whole; another process that built it first wins)."""
    world, out = current_world(), tiny_model_dir(cfg.model, cfg.envs)
    # not "<name>.tmp-*": prepare_model deletes those as left by killed builds, and ours is running
    made: str | None = None
    if world.is_main:
        out.parent.mkdir(parents=True, exist_ok=True)
        made = tempfile.mkdtemp(prefix=f"{out.name}.spmd-", dir=out.parent)
    tmp = Path(_sent(broadcast_object(made, "tiny model folder"), "the tiny model's build folder"))
    try:
        build_tiny(cfg.model, cfg.envs, tmp, out.name, console)
        barrier("tiny model built")
        if world.is_main:
            with FileLock(str(out) + ".lock"):
                if not (out / "config.json").is_file():
                    tmp.rename(out)
    finally:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
    barrier("tiny model in place")


def _sent(value: str | None, what: str) -> str:
    """``value`` as rank 0 broadcast it (None only if rank 0 did not make it: a bug)."""
    if value is None:
        raise RuntimeError(f"rank 0 broadcast no {what}")
    return value


def wait_for_file(path: Path | None, timeout_s: float = 6 * 3600.0) -> None:
    """Poll for ``path`` (a model rank 0 is building can take longer than a collective's timeout)."""
    t0 = time.time()
    while path is not None and not path.is_file():
        if time.time() - t0 > timeout_s:
            raise TimeoutError(f"waited {timeout_s:.0f}s for rank 0 to build {path.parent}; is cache_dir on a "
                               "filesystem every rank sees?")
        time.sleep(1.0)
