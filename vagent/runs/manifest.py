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
from typing import Callable, Mapping

MANIFEST = "manifest.json"
WRITER_LOCK = ".writer.lock"
#: ``.tmp-<name>-<pid>`` (a save being written) and ``.old-<name>-<pid>`` (a checkpoint moved aside
#: while a new copy of the same step replaces it; see vagent.runs.checkpoint._publish)
_TMP = re.compile(r"^\.(tmp|old)-((?:sft|step)_\d{6,})-(\d+|dcp)$")
_CHUNK = 1 << 20


def _hash_file(path: Path, sync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
        if sync:
            os.fsync(f.fileno())  # the data reaches the disk before the manifest names it
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file's content."""
    return _hash_file(path)


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


MAX_MANIFEST_BYTES = 16 << 20  # a checkpoint of 10^5 files needs about 10 MB
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: a checkpoint's manifest must list its state and its policy (one process: policy.pt; a job: dcp/.metadata)
REQUIRED = ("state.pt", ("policy.pt", "dcp/.metadata"))


def read_manifest(folder: Path) -> tuple[dict[str, tuple[int, str]], str | None]:
    """``folder/manifest.json`` as ``{relative path: (size, sha256)}``, or ``({}, problem)``.

    The schema is checked, never assumed: a top-level object with ``"version": 1`` and a non-empty
    ``"files"`` object whose keys are relative paths inside the folder (no ``..``, not absolute)
    and whose values are ``{"size": int >= 0, "sha256": 64 hex digits}``; the file is at most
    :data:`MAX_MANIFEST_BYTES`. Any other shape (``"policy.pt": 5``, ``null``, a list, deep
    nesting) is a problem naming what is wrong, as a damaged file would be."""
    path = folder / MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return {}, f"{MANIFEST} is larger than {MAX_MANIFEST_BYTES >> 20} MB (not one vagent writes)"
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # deep nesting: RecursionError
        return {}, f"{MANIFEST} is unreadable ({type(exc).__name__}: {str(exc)[:120]})"
    if not isinstance(manifest, dict) or manifest.get("version") != 1 or not isinstance(manifest.get("files"), dict):
        return {}, f'{MANIFEST} does not have the shape {{"version": 1, "files": {{...}}}}'
    files: dict[str, tuple[int, str]] = {}
    for rel, want in manifest["files"].items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or ".." in parts or "" in parts or "\\" in rel:
            return {}, f"{MANIFEST} lists {rel[:80]!r}, which is not a path inside the checkpoint"
        size = want.get("size") if isinstance(want, dict) else None
        digest = want.get("sha256") if isinstance(want, dict) else None
        if type(size) is not int or size < 0 or not isinstance(digest, str) or not _SHA256.match(digest):
            return {}, (f'{MANIFEST}: the entry of {rel[:80]!r} is not {{"size": bytes, "sha256": 64 hex digits}} '
                        f"(got {str(want)[:60]})")
        files[rel] = (size, digest)
    return files, None


def _missing_required(files: Mapping[str, object]) -> str | None:
    for need in REQUIRED:
        options = (need,) if isinstance(need, str) else need
        if not any(o in files for o in options):
            return f"{MANIFEST} does not list {' or '.join(options)} (every checkpoint has it)"
    return None


def verify_manifest(folder: Path, under: str = "") -> str | None:
    """None when ``folder/manifest.json`` has the right shape, lists the checkpoint's state and
    policy, and every file under ``under`` (e.g. ``policy/``; all when empty) is listed with its
    size and hash; else what is wrong, naming the file. A file in the folder that the manifest does
    not list is a problem too (a manifest that omits a file would leave it unchecked). A folder
    without a manifest is not checked here (see the module doc)."""
    listed, problem = read_manifest(folder)
    if problem is None and not under:
        problem = _missing_required(listed)
    if problem is not None:
        return problem
    files = {rel: want for rel, want in listed.items() if rel.startswith(under)}
    present = {rel for rel in (p.relative_to(folder).as_posix() for p in _files(folder)) if rel.startswith(under)}
    unlisted = sorted(present - set(files))
    if unlisted:
        return f"{unlisted[0]} is not listed in {MANIFEST} (added after the checkpoint was written, or the manifest was replaced)"
    for rel, (want_size, _) in files.items():  # sizes first: a missing or truncated file needs no hashing
        try:
            size = (folder / rel).stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != want_size:
            return f"{rel} has {size} bytes, its manifest says {want_size} (truncated or replaced)"
    digests = _hash_all([folder / rel for rel in files])
    for (rel, (_, want_digest)), digest in zip(files.items(), digests):
        if digest != want_digest:
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
    pid = m.group(3) if m else None
    if pid is None or not pid.isdigit():
        return True  # a job's folder (-dcp) without its lock: its writer ended or never locked
    return int(pid) == os.getpid() or not _pid_alive(int(pid))


def remove_stale_temporaries(ckpt_dir: str | Path, say: Callable[[str], None] | None = None) -> list[Path]:
    """Settle what writers that died (killed while saving) left in ``ckpt_dir``; keep what a live
    process is writing. Returns the folders removed.

    - ``.tmp-<name>-<pid>`` with a manifest that verifies is a complete checkpoint that was not
      renamed into place yet: it becomes ``<name>`` when that is missing or damaged (the damaged
      one moved aside first), else it is removed. Without a verified manifest it is half-written:
      removed.
    - ``.old-<name>-<pid>`` is a checkpoint moved aside while a new copy replaced it: removed when
      ``<name>`` is in place, else renamed back (the replacement never arrived).
    """
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    removed = []
    found = [(m, p) for p in d.iterdir() if (m := _TMP.match(p.name)) and p.is_dir()]
    for m, p in sorted(found, key=lambda mp: (mp[0].group(1) != "tmp", mp[1].name)):  # new copies first
        if not writer_gone(p):
            continue
        final = d / m.group(2)
        if m.group(1) == "tmp" and (p / MANIFEST).is_file() and verify_manifest(p) is None \
                and (not final.exists() or not (final / MANIFEST).is_file() or verify_manifest(final) is not None):
            replace_folder(p, final)
            if say is not None:
                say(f"completed {final}: its writer was stopped after the checkpoint was whole, before it was renamed "
                    "into place")
            continue
        if m.group(1) == "old" and not final.exists():
            os.replace(p, final)
            if say is not None:
                say(f"restored {final}: it was moved aside for a new copy that was never written")
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p)
            if say is not None and m.group(1) == "tmp":
                say(f"removed {p}: a checkpoint left half-written by a process that was stopped while saving")
    return removed


def replace_folder(new: Path, final: Path) -> None:
    """Put the complete folder ``new`` at ``final``; a folder already there is replaced atomically:
    moved aside to ``.old-<name>-<pid>``, ``new`` renamed in, the directory synced, the old one
    removed. A process killed at any point leaves one complete ``final`` or a state that
    :func:`remove_stale_temporaries` completes (the new copy, else the old one put back)."""
    d = final.parent
    aside = d / f".old-{final.name}-{os.getpid()}"
    if aside.exists():
        shutil.rmtree(aside)
    if final.exists():
        os.replace(final, aside)
    os.replace(new, final)
    fsync_dir(d)
    if aside.exists():
        shutil.rmtree(aside, ignore_errors=True)


def fsync_dir(d: Path) -> None:
    """Make the renames in directory ``d`` durable (a no-op where a directory cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
