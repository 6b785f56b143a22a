"""A child process that ends with its parent.

``vagent train --nproc N`` is torchrun's agent, and the ranks are its children; a Ray worker is a
child of the raylet. When the parent dies without stopping its children (SIGKILL, the OOM killer),
the kernel reparents them (to PID 1 or a subreaper) and they would go on training and writing
checkpoints behind the back of a job that is started again. :func:`exit_with_parent` makes such a
child end within ``poll_s`` of its parent's death.
"""

from __future__ import annotations

import os
import threading
import time

_watching = False


def exit_with_parent(poll_s: float = 0.2) -> None:
    """End this process (``os._exit(1)``) when its parent dies, checked every ``poll_s`` in a
    daemon thread. Once per process (Ray reuses workers; a second call changes nothing).

    A poll, not ``prctl(PR_SET_PDEATHSIG)``: the kernel sends that signal when the parent *thread*
    that started the child ends, which is not the parent process ending when a parent starts its
    children from a worker thread, and it exists on Linux only."""
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)  # the parent is gone; a checkpoint written so far is what a rerun resumes from

    threading.Thread(target=watch, name="vagent-exit-with-parent", daemon=True).start()
