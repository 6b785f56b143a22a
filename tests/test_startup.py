"""A vagent process's heavy imports are kept out of Python's garbage collector (vagent/startup.py):
the collector is off while they run, what they made is frozen, and a ``vagent train`` run makes
no full collection over torch's and transformers' objects."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from vagent.startup import heavy_imports, lazy_exports

# a ``vagent train`` whose full collections (generation 2) are recorded with whether torch was
# loaded and how many objects were frozen then; printed at exit with the final freeze count
PROBE = """
import atexit, gc, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2
                    and full.append(("torch" in sys.modules, gc.get_freeze_count())))
atexit.register(lambda: print("GCPROBE", gc.get_freeze_count(), full, file=sys.stderr))
from vagent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_collector_is_off_inside_and_what_an_import_made_is_frozen(tmp_path: Path, monkeypatch):
    (tmp_path / "startup_probe_module.py").write_text("TABLE = [[i] for i in range(1000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with heavy_imports():
        assert not gc.isenabled()
        import startup_probe_module  # noqa: F401
        assert gc.get_freeze_count() == frozen, "nothing is frozen before the block ends"
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + 1000, "the module's 1,000 rows are frozen"
    monkeypatch.delitem(sys.modules, "startup_probe_module")


def test_a_block_that_imports_nothing_new_freezes_nothing_and_a_disabled_collector_stays_off():
    import json  # noqa: F401 -- loaded already: the block below imports nothing new

    frozen = gc.get_freeze_count()
    with heavy_imports():
        import json  # noqa: F401,F811
        garbage = [{"n": i} for i in range(100)]
    # a freeze would add every object alive (the 100 dicts above among them); the count may only drop,
    # as frozen objects that other code releases are freed by their reference counts meanwhile
    assert gc.get_freeze_count() <= frozen, "a block that imported nothing froze the caller's objects"
    del garbage
    gc.disable()
    try:
        with heavy_imports():
            pass
        assert not gc.isenabled(), "the caller turned the collector off: the block must leave it off"
    finally:
        gc.enable()


def test_lazy_exports_import_a_name_s_module_on_first_use_and_name_the_package_for_an_unknown_one():
    sys.modules.pop("colorsys", None)
    getattr_ = lazy_exports("pkg", {"rgb_to_hsv": "colorsys"})
    assert "colorsys" not in sys.modules
    assert getattr_("rgb_to_hsv")(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0) and "colorsys" in sys.modules
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'hsv'"):
        getattr_("hsv")


def test_a_train_run_freezes_its_imports_and_makes_no_full_collection_over_them(tmp_path: Path):
    from tests.recipes.conftest import small_overrides
    from vagent.models.tiny import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "tiny-vlm", hidden=64, layers=2, image_size=64)
    run = subprocess.run([sys.executable, "-c", PROBE, "train", *small_overrides(tmp_path, model, "steps=1")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stderr.splitlines() if x.startswith("GCPROBE"))
    frozen, full = line.split(" ", 2)[1:]
    # torch + transformers + the recipes: ~590,000 objects frozen; before, none, and 6 full collections
    assert int(frozen) > 200_000, line
    assert "(True, 0)" not in full, f"a full collection walked torch's objects before they were frozen: {line}"
