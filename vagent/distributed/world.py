"""Who am I in the job: rank, world size, device; starting and ending the process group.

A process started by ``torchrun`` finds ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in its environment;
:func:`init_world` then joins the process group (gloo on CPU, nccl on CUDA) with a timeout, so a
collective that waits for a dead or stuck rank fails after ``timeout_s`` instead of hanging. A
plain ``vagent train`` (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) gets the single-process world:
rank 0 of 1, no process group, no collective anywhere (every helper in this package returns at
once when ``world().size == 1``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

from vagent.exit_codes import LAUNCHER_PID_ENV  # set by vagent.distributed.launch: the ranks' parent


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    #: seconds a collective may wait before it fails (the process group's timeout)
    timeout_s: float = 0.0
    #: each rank's address towards the job's store (index: rank; ``own_address``), so that a failed
    #: collective can name the rank behind an address in the backend's error; () in one process
    addresses: tuple[str, ...] = ()

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that logs, draws the progress bar and writes the run directory."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def tag(self) -> str:
        """``"rank 1/2"`` for messages ('' in a single process)."""
        return f"rank {self.rank}/{self.size}" if self.distributed else ""

    def ranks_at(self, text: str) -> dict[str, list[int]]:
        """The other hosts' ranks whose address ``text`` names (a backend's error: ``Connection
        closed by peer [10.0.0.2]:53934``), by address (:meth:`other_hosts`: ranks on this host
        share its address, which names none of them)."""
        return {a: ranks for a, ranks in self.other_hosts().items() if f"[{a}]" in text}

    def other_hosts(self) -> dict[str, list[int]]:
        """The ranks on other hosts than this rank's, by address (empty in a job of one host)."""
        own = self.addresses[self.rank] if self.rank < len(self.addresses) else None
        found: dict[str, list[int]] = {}
        for r, address in enumerate(self.addresses):
            if address != own:
                found.setdefault(address, []).append(r)
        return found


_WORLD = World()


def world() -> World:
    """The current world (rank 0 of 1 until :func:`init_world` joins a process group)."""
    return _WORLD


def launched_by_torchrun() -> bool:
    """True in a process that torchrun started with more than one rank in the job."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def init_world(device: str = "auto", timeout_s: float = 600.0) -> World:
    """Join the job's process group when torchrun started this process with WORLD_SIZE > 1, and
    end this process when its torchrun agent dies (:func:`vagent.lifetime.exit_with_parent`).

    Backend: nccl when this rank runs on CUDA (``device`` auto/cuda and a GPU is visible; rank r
    takes ``cuda:LOCAL_RANK``), else gloo. Returns the world; single process: ``World()`` and no
    process group.
    """
    global _WORLD
    if not launched_by_torchrun():
        _WORLD = World()
        return _WORLD
    import torch.distributed as dist

    from vagent.lifetime import exit_with_parent

    # a rank ends with its torchrun agent (the launcher), however the agent ends: SIGKILL of
    # `vagent train --nproc N` would otherwise leave the ranks training on, reparented to PID 1
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if launcher and launcher != os.getppid() and not _alive(launcher):
        os._exit(1)  # the launcher died while this rank was starting
    exit_with_parent()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                                device_id=torch.device("cuda", local) if cuda else None)
    addresses: list[str | None] = [None] * size
    dist.all_gather_object(addresses, own_address())
    _WORLD = World(rank=rank, size=size, local_rank=local, timeout_s=timeout_s,
                   addresses=tuple(str(a) for a in addresses))
    return _WORLD


def own_address() -> str:
    """This host's address towards the job's store (``MASTER_ADDR``, which torchrun sets): the
    local address the kernel routes to it, found without sending a packet (a UDP socket's
    ``connect``); the hostname when that fails."""
    master, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT") or 29400)
    try:
        family = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as probe:
            probe.connect(family[4])
            return str(probe.getsockname()[0])
    except (OSError, IndexError, UnicodeError):
        return socket.gethostname()


def rank_device(device: str) -> str:
    """The device string of this rank: ``cuda:LOCAL_RANK`` for auto/cuda with a GPU, else as given."""
    w = world()
    if w.distributed and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{w.local_rank}"
    return device


def shutdown_world() -> None:
    """Destroy the process group (every exit path calls this: without it, about 1 exit in 3 of a
    gloo job aborted on this machine). Safe to call twice or in a single process."""
    global _WORLD
    if _WORLD.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _WORLD = World()


class single_process:
    """``with single_process():`` -- this rank works alone (rank 0 building the tiny model's
    cache while the others wait for the file): the helpers see a world of one and make no
    collective."""

    def __enter__(self) -> World:
        global _WORLD
        self._saved = _WORLD
        _WORLD = World()
        return _WORLD

    def __exit__(self, *exc: object) -> None:
        global _WORLD
        _WORLD = self._saved
