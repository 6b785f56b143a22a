"""One writer per run directory: the live job holds ``<run>/run.lock``.

A run directory has one writer: a plain ``vagent train`` process, or rank 0 of a job (the other
ranks write only their checkpoint shards, when rank 0's collectives let them). That writer holds an
exclusive ``flock`` on ``run.lock`` from the moment the directory is created, or opened for
``--resume``, until it returns; the file says who holds it (PID, host, start time, command). A
second ``vagent train --resume RUN`` on a directory whose writer is alive is refused with that
PID, before it loads anything.

The kernel drops a ``flock`` when its holder dies, SIGKILL included, so a lock is never stale in
the way: a lock left by a dead process is free, and the next job takes it over and says whose it
was (a writer that returns normally empties the file, so a non-empty free lock means its writer
died). The lock is per open file, not per process; its descriptor is not inherited by children
(Python's default), so a Ray cluster that rank 0 starts does not keep it after rank 0 is gone.
``flock`` on a network filesystem (NFS, Lustre) is shared between hosts where the filesystem
supports it (Linux NFS since 2.6.12 maps it to NFS locks).

The same exclusive ``flock`` is also taken on the run directory itself (a descriptor of the
directory), which a user cannot delete by accident while the run lives: deleting ``run.lock`` does
not let a second writer in (it is refused all the same; ``run.lock`` only names the holder). Where
a filesystem cannot lock a directory, the file's lock is the one that holds.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vagent.runs.errors import TrainingError

LOCK_NAME = "run.lock"


class RunDirLocked(TrainingError):
    """Another live process writes this run directory."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or last held) a run directory's lock, as written in ``run.lock``."""

    pid: int
    host: str
    started: float
    command: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"PID {self.pid} on host {self.host} (since {when}: {self.command})"


def _read_holder(f) -> LockHolder | None:
    f.seek(0)
    text = f.read().strip()
    if not text:
        return None
    try:
        d = json.loads(text)
        return LockHolder(int(d["pid"]), str(d["host"]), float(d["started"]), str(d.get("command", "")))
    except (ValueError, KeyError, TypeError):
        return LockHolder(-1, "unknown", 0.0, f"unreadable {LOCK_NAME}: {text[:80]!r}")


def _try_flock(f) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EBADF, errno.EINVAL)


def _lock_dir(root: Path) -> tuple[int, bool]:
    """(descriptor of directory ``root``, whether its exclusive flock was taken); the descriptor is
    -1 where the directory cannot be locked (the lock file then holds alone)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return -1, True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, True
    except BlockingIOError:
        os.close(fd)
        return -1, False
    except OSError as exc:
        os.close(fd)
        if exc.errno in _NO_LOCKS:
            return -1, True
        raise


def _refusal(root: Path, holder: LockHolder | None) -> str:
    who = holder.describe() if holder is not None else "another process (it has not written its PID yet)"
    pid = f"kill {holder.pid}" if holder is not None and holder.pid > 0 else "stop it"
    return (f"{root} is being written by a live job: {who} holds {root / LOCK_NAME}. Two jobs in one run "
            f"directory would write the same steps twice. Wait until it ends, or {pid} and then "
            f"`vagent train --resume {root}` continues from its last checkpoint.")


class RunLock:
    """The held lock of one run directory (a context manager; :meth:`release` is idempotent)."""

    def __init__(self, root: Path, f, dir_fd: int = -1) -> None:
        self.root, self._f, self._dir_fd = root, f, dir_fd

    def release(self) -> None:
        if self._f is None:
            return
        f, self._f = self._f, None
        try:
            f.seek(0)
            f.truncate()  # empty: the writer ended normally, nothing to take over
            f.flush()
        except OSError:
            pass  # run.lock was deleted or its disk is full: the locks are released all the same
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()
            if self._dir_fd >= 0:
                os.close(self._dir_fd)  # closing drops the directory's lock
                self._dir_fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(root: str | Path, say: Callable[[str], None] = print) -> RunLock:
    """Take ``root``'s lock for this process, or raise :class:`RunDirLocked` naming the live
    holder. A free lock that still names a holder (its writer died) is taken over with a message."""
    root = Path(root)
    path = root / LOCK_NAME
    dir_fd, free = _lock_dir(root)
    f = open(path, "a+")  # a+: create, never truncate before the lock is ours
    if not free or not _try_flock(f):
        holder = _read_holder(f)
        f.close()
        if dir_fd >= 0:
            os.close(dir_fd)
        raise RunDirLocked(_refusal(root, holder))
    previous = _read_holder(f)
    if previous is not None:
        say(f"taking over {path}: its holder, {previous.describe()}, ended without releasing it "
            "(killed?); the lock was free.")
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    prog = "vagent" if prog == "__main__.py" else prog  # python -m vagent
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
          "command": " ".join([prog, *sys.argv[1:]])[:300]}
    f.seek(0)
    f.truncate()
    f.write(json.dumps(me) + "\n")
    f.flush()
    return RunLock(root, f, dir_fd)


def check_unlocked(root: str | Path) -> None:
    """Raise :class:`RunDirLocked` when a live process holds ``root``'s lock; otherwise change
    nothing (a launcher's check before it starts the job's processes)."""
    root = Path(root)
    path = root / LOCK_NAME
    dir_fd, free = _lock_dir(root)
    if dir_fd >= 0:
        os.close(dir_fd)  # closing drops it
    if not free:
        holder = None
        if path.is_file():
            with open(path) as f:
                holder = _read_holder(f)
        raise RunDirLocked(_refusal(root, holder))
    if not path.is_file():
        return
    with open(path, "a+") as f:
        if not _try_flock(f):
            raise RunDirLocked(_refusal(root, _read_holder(f)))
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
