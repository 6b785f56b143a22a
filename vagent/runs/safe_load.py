"""A run directory is data, never code: how vagent reads the pickled files in it.

``torch.save`` writes a pickle, and ``torch.load(weights_only=False)`` runs whatever a planted file
names (``os.system``, any importable function) before the caller sees a byte of it. Every ``.pt``
file vagent reads from a run directory (a checkpoint's ``state.pt``, module files, ``rng_rank<r>.pt``
and ``inflight.pt``; the run's ``canary_probe.pt``) goes through :func:`load_data`:
``torch.load(weights_only=True)`` (tensors, numbers, strings, lists, tuples, dicts), with the few
globals a kind of file needs allowed for that one read (``torch.serialization.safe_globals``; the
globals a user's program allowed itself stay as they were):

- :data:`LEGACY_RNG` (``state.pt``, ``rng_rank<r>.pt``): numpy's array, dtype and scalar
  rebuilders, for the numpy RNG state that vagent saved as an array before it saved plain numbers;
- :data:`RECORDS` (an object saved beside a checkpoint's modules: ``inflight.pt``): vagent's own
  rollout records (``InFlight``, ``Episode``, ``Turn``, ``Observation``, ``ParsedResponse``,
  ``Conversation``, ``Message``, ``Segment``), PIL images, and numpy arrays and scalars (an env's
  ``info`` or ``state`` may hold them).

None of these runs code of the file's choosing: vagent's dataclasses are rebuilt with
``cls.__new__`` and their ``__dict__`` filled (``InFlight`` turns its plain episode list back into a
``RolloutResult``); a PIL image decodes raw pixels (``Image.__setstate__``); numpy makes an empty
array, a dtype from its type string or a scalar from bytes, and fills an array from bytes or from
objects that were themselves read under these rules. (A PIL image or numpy array can still be as
large as the file says: a planted file can exhaust memory, not run code.)

A file that names any other global is refused before it is unpickled: :func:`data_problem` reads
the pickle's opcodes without running them and names the global; torch's weights-only unpickler is
the second guard. The refusal, :class:`UnsafeFileError`, reads ``<file> needs <global>, which vagent
does not load: a run directory is data, never code``.

A sharded checkpoint's ``dcp/.metadata`` is a plain pickle (protocol 4) that torch's DCP reads
with ``pickle.load``, and DCP reads the non-tensor values of its ``.distcp`` files with
``torch.load(weights_only=False)``; :func:`load_dcp` replaces both readers: the metadata through an
unpickler whose ``find_class`` admits DCP's metadata classes, ``torch.Size``, torch dtypes and
layouts and ``pathlib`` paths only, and ``getattr`` only for an enum's member by name (how Python
3.11.0-3.11.4 pickle enums) (:func:`load_pickle_data`), each value through
``torch.load(weights_only=True)``.

What this cannot catch: a file of allowed types with forged content (another run's weights or
episodes). The manifests and identities catch a partial forgery, not one that rewrites every file
of a run consistently.
"""

from __future__ import annotations

import enum
import functools
import importlib
import io
import pickle
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from vagent.runs.errors import TrainingError

#: numpy's array, dtype and scalar rebuilders, as ``module:qualname`` (numpy 1 wrote
#: ``numpy.core.multiarray``, numpy 2 ``numpy._core.multiarray``: both names are allowed), and the
#: classes of dtype instances (``numpy.dtypes:*``: ``UInt32DType``, ..., whose state a pickle sets)
NUMPY = ("numpy._core.multiarray:_reconstruct", "numpy._core.multiarray:scalar", "numpy:ndarray", "numpy:dtype",
         "numpy.dtypes:*")
#: what ``state.pt`` and ``rng_rank<r>.pt`` may name: numpy, for the RNG state older checkpoints hold
LEGACY_RNG = NUMPY
#: what an object saved beside a checkpoint's modules (``inflight.pt``) may name
RECORDS = NUMPY + (
    "vagent.rollout.driver:InFlight", "vagent.rollout.records:Episode", "vagent.rollout.records:Turn",
    "vagent.envs.base:Observation", "vagent.envs.formats:ParsedResponse", "vagent.rollout.policy:Conversation",
    "vagent.rollout.policy:Message", "vagent.rollout.policy:Segment", "PIL.Image:Image",
)
_ALIASES = {"numpy._core.multiarray": "numpy.core.multiarray"}


class UnsafeFileError(TrainingError):
    """A file in a run directory that needs code to load (a global vagent does not allow)."""


def _expand(entry: str) -> list[str]:
    """``module:*`` -> every class of that module whose name ends in ``DType`` (numpy.dtypes)."""
    mod, qual = entry.split(":")
    if qual != "*":
        return [entry]
    try:
        found = vars(importlib.import_module(mod))
    except ImportError:  # numpy < 1.25 has no numpy.dtypes: dtype instances are numpy.dtype itself
        return []
    return [f"{mod}:{k}" for k, v in sorted(found.items()) if isinstance(v, type) and k.endswith("DType")]


def _names(allow: Sequence[str]) -> set[str]:
    """The dotted names (``numpy.ndarray``) that ``allow`` (``module:qualname`` entries) admits."""
    out = set()
    for entry in (e for a in allow for e in _expand(a)):
        mod, qual = entry.split(":")
        out.add(f"{mod}.{qual}")
        if mod in _ALIASES:
            out.add(f"{_ALIASES[mod]}.{qual}")
    return out


def _resolve(entry: str) -> Any:
    mod, qual = entry.split(":")
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError:  # numpy 1: numpy.core.multiarray
        obj = importlib.import_module(_ALIASES[mod])
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _globals(allow: Sequence[str]) -> list[Any]:
    """``(object, dotted name)`` for torch's ``safe_globals``: each entry under every name it is pickled as."""
    return [(_resolve(entry), name) for a in allow for entry in _expand(a) for name in sorted(_names([entry]))]


@contextmanager
def _allowing(allow: Sequence[str]) -> Iterator[None]:
    """torch's weights-only unpickler admits ``allow`` too, for the duration of the block; entries
    the process had allowed itself are left alone (and are not removed afterwards)."""
    have = set(map(repr, torch.serialization.get_safe_globals()))
    new = [g for g in _globals(allow) if repr(g) not in have]
    with torch.serialization.safe_globals(new):
        yield


def refusal(name: str, needed: str) -> str:
    """The one-line reason a file is refused: ``<name> needs <global>, which vagent does not load...``."""
    return f"{name} needs {needed}, which vagent does not load: a run directory is data, never code"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def _needed_global(path: str | Path | io.BytesIO, allow: Sequence[str]) -> str | None:
    """The first global torch file ``path`` names beyond torch's defaults and ``allow``, or None;
    raises what torch raises for a file it cannot read (not a zip, an opcode it refuses, truncated).
    The pickle's opcodes are read, not executed."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    finally:
        if isinstance(path, io.BytesIO):
            path.seek(0)
    extra = sorted(set(found) - _names(allow))
    return extra[0] if extra else None


def _name_of(path: str | Path | io.BytesIO, name: str | None) -> str:
    return name or (Path(path).name if not isinstance(path, io.BytesIO) else "the value")


def data_problem(path: str | Path | io.BytesIO, allow: Sequence[str] = (), name: str | None = None) -> str | None:
    """None when torch file ``path`` (or bytes) names no global beyond torch's defaults and
    ``allow``; else why not, naming the file (as ``name``, default its file name) and the global.
    Nothing in the file runs."""
    name = _name_of(path, name)
    try:
        needed = _needed_global(path, allow)
    except Exception as exc:  # noqa: BLE001 -- whatever torch raises for a file it cannot read
        return f"{name} cannot be read as data ({_first_line(exc)})"
    return refusal(name, needed) if needed else None


def load_data(path: str | Path | io.BytesIO, allow: Sequence[str] = (), *, mmap: bool = False,
              name: str | None = None) -> Any:
    """``torch.load`` of ``path`` as data (see the module doc): weights only, on the CPU, with the
    globals in ``allow`` (``module:qualname``) admitted for this read. :class:`UnsafeFileError`
    names the file and the global when it needs another one; a damaged file raises what torch
    raises (RuntimeError, EOFError, ...)."""
    name = _name_of(path, name)
    try:
        needed = _needed_global(path, allow)
    except Exception:  # noqa: BLE001 -- damaged: torch.load below says how
        needed = None
    if needed is not None:
        raise UnsafeFileError(refusal(name, needed))
    try:
        with _allowing(allow):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:  # the weights-only unpickler refused it
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(exc))
        raise UnsafeFileError(refusal(name, found.group(1)) if found else
                              f"{name} cannot be read as data ({detail.group(1)[:160] if detail else _first_line(exc)})"
                              ) from None


# ----------------------------------------------------------------------------------------------
# torch.distributed.checkpoint (a sharded checkpoint's dcp/ folder)
# ----------------------------------------------------------------------------------------------

#: the classes in ``dcp/.metadata`` (torch.distributed.checkpoint's Metadata and what it holds)
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """What ``builtins.getattr`` may do in a data pickle: name a member of an enum class the
    unpickler already admitted. Python 3.11.0-3.11.4 (Debian 12's 3.11.2) pickle an enum member as
    ``getattr(cls, "NAME")`` where other versions write ``cls(value)``; DCP's metadata holds one
    (``_MEM_FORMAT_ENCODING``). Any other use is refused."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError("GLOBAL builtins.getattr was not an allowed global (it may only name a member of "
                                 f"an allowed enum, not {getattr(cls, '__name__', type(cls).__name__)}.{name})")


class _DataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that finds only DCP's metadata classes, ``torch.Size`` and torch dtypes,
    layouts and memory formats (every global a pickle names goes through ``find_class``), and
    ``builtins.getattr`` as :func:`_enum_member` (an enum's member by name)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None),
                                                                (torch.dtype, torch.layout, torch.memory_format))):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} was not an allowed global")


def load_pickle_data(path: str | Path, name: str | None = None) -> Any:
    """A plain pickle (``dcp/.metadata``) read with :class:`_DataUnpickler`; :class:`UnsafeFileError`
    names the file and the global it needs beyond those."""
    path = Path(path)
    name = name or path.name
    try:
        return _DataUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        raise UnsafeFileError(refusal(name, found.group(1)) if found else
                              f"{name} cannot be read as data ({_first_line(exc)})") from None


@functools.cache
def _dcp_readers() -> tuple[type, type]:
    """(storage reader, load planner) classes of :func:`load_dcp` (torch.distributed.checkpoint is
    imported on first use)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class DataReader(FileSystemReader):
        """Reads ``.metadata`` with :func:`load_pickle_data` instead of ``pickle.load`` (and no
        per-rank metadata: the signature takes no ``rank``, vagent writes one ``.metadata``)."""

        def read_metadata(self, *args: Any) -> Metadata:
            metadata = load_pickle_data(Path(self.path) / ".metadata", "dcp/.metadata")
            if not isinstance(metadata, Metadata):
                raise UnsafeFileError(f"dcp/.metadata holds a {type(metadata).__name__}, not DCP's Metadata")
            storage_meta = metadata.storage_meta or StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            return metadata

    class DataPlanner(DefaultLoadPlanner):
        """Reads each non-tensor value (``torch.save`` bytes in a ``.distcp`` file) weights-only
        first; DCP's own ``torch.load(weights_only=False)`` then reads the same bytes, checked."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            data = value.read()
            load_data(io.BytesIO(data), name=f"dcp value {read_item.dest_index.fqn}")
            super().load_bytes(read_item, io.BytesIO(data))

    return DataReader, DataPlanner


def load_dcp(state_dicts: dict, folder: str | Path) -> None:
    """``torch.distributed.checkpoint.load`` of ``folder`` into ``state_dicts`` (in place), with
    the metadata and every non-tensor value read as data (the module doc); a refused file raises
    :class:`UnsafeFileError` on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader, planner = _dcp_readers()
    load_pickle_data(Path(folder) / ".metadata", "dcp/.metadata")  # refused here as itself, not in DCP's wrapping
    try:
        dcp.load(state_dicts, storage_reader=reader(folder), planner=planner())
    except CheckpointException as exc:  # DCP gathers each rank's failure: a refusal is said as itself
        refused = [e for e, _ in exc.failures.values() if isinstance(e, UnsafeFileError)]
        if refused:
            raise refused[0] from None
        raise


__all__ = ["LEGACY_RNG", "NUMPY", "RECORDS", "UnsafeFileError", "data_problem", "load_data", "load_dcp",
           "load_pickle_data", "refusal"]
