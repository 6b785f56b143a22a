"""What makes a checkpoint folder trustworthy: its manifest, and the lock of the process writing it.

``manifest.json`` lists every file of a checkpoint with its size and SHA-256::

    {"version": 1, "files": {"state.pt": {"size": 5065591, "sha256": "9f2c..."}, "policy/config.json": ...}}

It is the last file written into the temporary folder (after every file is flushed to disk), so
a checkpoint folder with a manifest is complete; :func:`verify_manifest` re-reads every file and
names the first one whose size or hash differs (a truncated, emptied, replaced or bit-flipped
file). A checkpoint written before manifests existed has none: it is resumed with a warning that
it is unverified, after a structural check of its ``.pt`` files (:func:`check_zip_files`: every
torch file is a zip archive whose members carry a CRC-32, so truncation and flipped bytes show
there too).

While a process writes ``.tmp-<step>-<pid>`` it holds an exclusive ``flock`` on
``.tmp-<step>-<pid>/.writer.lock``; the kernel releases it when the process dies, SIGKILL
included. :func:`remove_stale_temporaries` deletes the temporary folders whose writer is gone
(lock free; or, without a lock file or on a filesystem without ``flock``, a dead PID) and keeps
those of a live writer.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
WRITER_LOCK = ".writer.lock"
_TMP = re.compile(r"^\.tmp-(?:sft|step)_\d{6,}-(\d+|dcp)$")
_CHUNK = 1 << 20


def _hash_file(path: Path, sync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
        if sync:
            os.fsync(f.fileno())  # the data reaches the disk before the manifest names it
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, WRITER_LOCK))


def _hash_all(paths: list[Path], sync: bool = False) -> list[str]:
    """SHA-256 of each path, several files at once (hashlib releases the GIL on large blocks)."""
    if len(paths) <= 1:
        return [_hash_file(p, sync) for p in paths]
    with ThreadPoolExecutor(max_workers=min(8, len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda p: _hash_file(p, sync), paths))


def write_manifest(folder: Path) -> dict:
    """Hash every file under ``folder`` (flushing each to disk) and write ``manifest.json`` last."""
    paths = _files(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": digest}
             for p, digest in zip(paths, _hash_all(paths, sync=True))}
    manifest = {"version": 1, "files": files}
    with open(folder / MANIFEST, "w") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return manifest


def verify_manifest(folder: Path, under: str = "") -> str | None:
    """None when every file listed in ``folder/manifest.json`` (those whose path starts with
    ``under``, e.g. ``policy/``) has its size and hash; else what is wrong, naming the file. A
    folder without a manifest is not checked here (see the module doc)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})"
    files = {rel: want for rel, want in files.items() if rel.startswith(under)}
    for rel, want in files.items():  # sizes first: a missing or truncated file needs no hashing
        try:
            size = (folder / rel).stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != want.get("size"):
            return f"{rel} has {size} bytes, its manifest says {want.get('size')} (truncated or replaced)"
    digests = _hash_all([folder / rel for rel in files])
    for (rel, want), digest in zip(files.items(), digests):
        if digest != want.get("sha256"):
            return f"{rel} does not match its manifest's SHA-256 (its content changed: corrupted or replaced)"
    return None


def check_zip_files(folder: Path) -> str | None:
    """For a checkpoint without a manifest: every ``*.pt`` file must be a whole zip archive whose
    members match their CRC-32 (torch.save's format). None when they are; else what is wrong."""
    for p in sorted(folder.rglob("*.pt")):
        rel = p.relative_to(folder).as_posix()
        try:
            with zipfile.ZipFile(p) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            return f"{rel} is not a whole torch file ({type(exc).__name__}: {exc})"
        if bad is not None:
            return f"{rel}: member {bad} fails its CRC-32 check (corrupted)"
    return None


# ----------------------------------------------------------------------------------------------
# the writer's lock and stale temporary folders
# ----------------------------------------------------------------------------------------------


class WriterLock:
    """An exclusive ``flock`` on ``folder/.writer.lock`` for as long as the writer lives."""

    def __init__(self, folder: Path):
        self.path = folder / WRITER_LOCK
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:  # a filesystem without flock: the folder's PID tells instead
            if exc.errno not in _NO_LOCKS:
                raise

    def unlink(self) -> None:
        """Remove the lock file (before the folder is renamed into place); the lock stays held."""
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def writer_gone(tmp: Path) -> bool:
    """Whether the process that wrote temporary folder ``tmp`` is gone (the folder is stale)."""
    try:
        fd = os.open(tmp / WRITER_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return _writer_pid_gone(tmp)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            return _writer_pid_gone(tmp)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False  # a live writer holds it
        raise
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True


def _writer_pid_gone(tmp: Path) -> bool:
    """Without a lock to test: the writer is gone if the PID in the folder's name is dead, or is
    this process (which is not writing it now: it is cleaning up before a save or a resume)."""
    m = _TMP.match(tmp.name)
    pid = m.group(1) if m else None
    if pid is None or not pid.isdigit():
        return True  # a job's folder (-dcp) without its lock: its writer ended or never locked
    return int(pid) == os.getpid() or not _pid_alive(int(pid))


def remove_stale_temporaries(ckpt_dir: str | Path, say: Callable[[str], None] | None = None) -> list[Path]:
    """Delete the ``.tmp-*`` folders in ``ckpt_dir`` left by writers that died (killed while
    saving); keep those a live process is writing. Returns the removed folders."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    removed = []
    for p in sorted(d.iterdir()):
        if _TMP.match(p.name) and p.is_dir() and writer_gone(p):
            shutil.rmtree(p, ignore_errors=True)
            if not p.exists():
                removed.append(p)
                if say is not None:
                    say(f"removed {p}: a checkpoint left half-written by a process that was stopped while saving")
    return removed
