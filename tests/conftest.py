"""Suite-wide settings: one torch thread per process (2-core CI machines are oversubscribed by
torch's default thread pool; measured 20-40x slower generation with 2 threads under load)."""

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import vagent  # noqa: E402
from vagent.omp import apply_wait_settings  # noqa: E402

apply_wait_settings()  # before torch loads: the OpenMP wait policy by load, as the vagent command's (vagent/omp.py)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """``vllm``-marked tests need vLLM: skipped where it is not installed (the main .venv), failed
    instead when VAGENT_REQUIRE_VLLM=1 (CI runs them in .venv-vllm, built by scripts/vllm-env)."""
    if item.get_closest_marker("vllm") is None:
        return
    if importlib.util.find_spec("vllm") is None:
        why = ("vLLM is not installed in this environment: build .venv-vllm with scripts/vllm-env, then run "
               ".venv-vllm/bin/python -m pytest -m vllm")
        if os.environ.get("VAGENT_REQUIRE_VLLM") == "1":
            pytest.fail(f"VAGENT_REQUIRE_VLLM=1 but {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture()
def own_ray_temp(monkeypatch) -> Iterator[Path]:
    """Ray's temp folder for this test alone (``RAY_TMPDIR``; Ray and the reaper's scan both read
    it): the sessions it watches are marked there, where the start of another run on the host
    (which reaps the dead drivers' marked sessions of its own folder, /tmp/ray by default) never
    looks."""
    root = tempfile.mkdtemp(prefix="vr-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", root)
    yield Path(root) / "ray"
    shutil.rmtree(root, ignore_errors=True)


def pytest_ignore_collect(collection_path, config):
    """The vLLM venv's run (``-m vllm``) imports only the test modules that mention vllm: a module
    that does not cannot hold a ``vllm``-marked test (the marker is only ever written in the
    module), and importing the other ~150 costs ~12 s of CPU for nothing. Any other run: no change."""
    if config.getoption("markexpr", "") != "vllm" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    return True if "vllm" not in collection_path.read_text(errors="replace") else None


def pytest_configure(config):
    _precompile_vagent()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(1)


def pytest_collection_finish(session):
    """Every test module is imported (torch, transformers, vagent): freeze what the imports made, as
    a vagent command does (vagent/startup.py), so that this process's full collections skip them."""
    import gc

    gc.freeze()


def _precompile_vagent() -> None:
    """Write vagent's bytecode once, before the suite starts its ~200 Python processes (``vagent
    train`` runs, torchrun ranks, Ray actors, servers). Where PYTHONDONTWRITEBYTECODE is set (as on
    this project's CI machines) an editable install is never compiled to disk, so each of those
    processes compiled the ~0.3 s of vagent's source it imports again; installed packages are
    compiled by pip. Only sources newer than their ``__pycache__`` entry are compiled (git ignores
    ``__pycache__``), and Python checks each one against its source's mtime and size on import."""
    import sys

    if not sys.dont_write_bytecode:
        return
    import compileall

    compileall.compile_dir(os.path.dirname(vagent.__file__), quiet=1, workers=1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``VAGENT_TEST_CPU=FILE``: one JSON line per test appended to FILE, its CPU seconds
    (this process plus the child processes it waited for: subprocess runs, torchrun jobs) and
    wall seconds, set-up and tear-down included. The suite's cost is CPU time, which
    ``--durations`` (wall time) does not show: a test that waits on a timeout costs little."""
    path = os.environ.get("VAGENT_TEST_CPU")
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    yield
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - c0, 2),
                            "wall_s": round(time.perf_counter() - t0, 2)}) + "\n")
