"""Upload a run's checkpoints to the Hugging Face Hub in the background (the ``hub:`` config).

    hub:
      repo_id: me/frozenlake-ppo   # created (private by default) if missing
      every: 2                     # every 2nd checkpoint, and the last one
      private: true
      what: policy                 # the exported model directory; "checkpoint" = the whole folder

A :class:`HubUploader` thread watches ``<run>/checkpoints`` for complete checkpoints (the ones
``list_checkpoints`` returns: written atomically) and uploads every ``every``-th one with
``huggingface_hub`` (``HfApi.create_repo`` once, then ``upload_folder``): ``what: policy``
uploads ``<checkpoint>/policy`` to the repo's root, so ``from_pretrained("me/frozenlake-ppo")``
and ``model.path: me/frozenlake-ppo`` load the newest policy, and each commit says which phase
and step it holds; ``what: checkpoint`` uploads the whole folder under ``checkpoints/<name>/``.

Training never waits for the hub and never fails because of it: the upload runs in its own
thread from hard links of the checkpoint's files (so ``log.keep_last`` can prune the checkpoint
meanwhile), and an upload that fails is logged (``hub: upload of ... failed: ...``) and retried
with the next checkpoint. At the end of the run :meth:`HubUploader.close` uploads the last
checkpoint if it is not up yet and waits at most ``wait_s`` for it. The endpoint and token are
huggingface_hub's own (``HF_ENDPOINT``, ``HF_TOKEN`` or ``hf auth login``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vagent.runs.checkpoint import list_checkpoints

if TYPE_CHECKING:
    from huggingface_hub import HfApi

    from vagent.runconfig import HubConfig
    from vagent.runs.checkpoint_check import CheckpointInfo


class HubUploader:
    """Background uploads of new checkpoints in ``ckpt_dir`` (see the module docstring)."""

    def __init__(self, repo_id: str, ckpt_dir: str | Path, *, every: int = 1, private: bool = True,
                 what: str = "policy", say: Callable[[str], Any] = print, poll_s: float = 2.0, api: HfApi | None = None):
        if what not in ("policy", "checkpoint"):
            raise ValueError(f"hub.what must be policy or checkpoint, got {what!r}")
        if api is None:
            from huggingface_hub import HfApi

            api = HfApi()
        self.api, self.repo_id, self.ckpt_dir = api, repo_id, Path(ckpt_dir)
        self.every, self.private, self.what, self.say, self.poll_s = max(1, every), private, what, say, poll_s
        self.seen: set[str] = {c.path.name for c in list_checkpoints(self.ckpt_dir)}  # a resume's old ones
        self.n_new = 0
        self.pending: CheckpointInfo | None = None  # the newest checkpoint due for upload (the failed one is replaced by a newer)
        self.uploaded: list[str] = []
        self.failures = 0
        self._repo_ready = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hub-upload", daemon=True)

    def start(self) -> "HubUploader":
        self._thread.start()
        return self

    def close(self, wait_s: float = 120.0) -> None:
        """Upload the last checkpoint if it is not up yet; wait at most ``wait_s`` seconds."""
        self._stop.set()
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.say(f"hub: the upload to {self.repo_id} is still running after {wait_s:.0f}s; not waiting for it")

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.poll_s)
            self._scan(final=stopping)
            if self.pending is not None:
                self._upload(self.pending)
            if stopping:
                if self.pending is not None:  # the run's last upload failed: one more try (bounded by close)
                    self._upload(self.pending)
                return

    def _scan(self, final: bool) -> None:
        checkpoints = list_checkpoints(self.ckpt_dir)
        for c in checkpoints:
            if c.path.name in self.seen:
                continue
            self.seen.add(c.path.name)
            self.n_new += 1
            if self.n_new % self.every == 0:
                self.pending = c
        if final and checkpoints and checkpoints[-1].path.name not in self.uploaded:
            self.pending = checkpoints[-1]  # the last checkpoint always goes up

    def _upload(self, ckpt: CheckpointInfo) -> None:
        name = ckpt.path.name
        try:
            with tempfile.TemporaryDirectory(prefix="vagent-hub-") as tmp:
                source = ckpt.path / "policy" if self.what == "policy" else ckpt.path
                if not source.is_dir():
                    raise FileNotFoundError(f"{source} does not exist (is the checkpoint exported?)")
                folder = Path(tmp) / name
                shutil.copytree(source, folder, copy_function=_link_or_copy)  # safe from keep_last pruning
                if not self._repo_ready:
                    self.api.create_repo(self.repo_id, private=self.private, exist_ok=True)
                    self._repo_ready = True
                self.api.upload_folder(
                    repo_id=self.repo_id, folder_path=str(folder),
                    path_in_repo="" if self.what == "policy" else f"checkpoints/{name}",
                    commit_message=f"vagent: {ckpt.phase} step {ckpt.step} ({self.what})",
                )
        except Exception as exc:  # noqa: BLE001 -- logged and retried, never raised into training
            self.failures += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.say(f"hub: upload of {name} to {self.repo_id} failed ({type(exc).__name__}: {first}); "
                     "retrying with the next checkpoint")
            return
        self.uploaded.append(name)
        if self.pending is ckpt:
            self.pending = None
        self.say(f"hub: uploaded {name} to {self.repo_id}")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def start_hub_upload(settings: HubConfig, ckpt_dir: str | Path, say: Callable[[str], Any] = print) -> HubUploader | None:
    """A started :class:`HubUploader` for the run's ``hub`` settings, or None when ``repo_id`` is empty."""
    if not settings.repo_id:
        return None
    try:
        import huggingface_hub  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("hub.repo_id is set but huggingface_hub is not installed: pip install 'vagent[hub]' "
                           "(or pip install huggingface_hub), or set hub.repo_id ''.") from exc
    say(f"hub: uploading every {settings.every} checkpoint(s) ({settings.what}) to {settings.repo_id} in the background")
    return HubUploader(settings.repo_id, ckpt_dir, every=settings.every, private=settings.private,
                       what=settings.what, say=say).start()
