"""The package's import graph has no cycle, and ``import vagent`` stays light.

The graph is read from the source (every ``import`` / ``from ... import`` of a ``vagent`` module,
at module level or inside a function: a lazy import still ties the two modules together), so a
cycle fails here with the modules and the edges that make it, whichever way the code would run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import vagent

ROOT = Path(vagent.__file__).parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``{"vagent.rollout.loop": path}`` for every module and package of the tree at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from pkg import name``: ``pkg.name`` when that
    is a module, else ``pkg``)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else resolve(base) for a in node.names]
            graph[mod].update(t for t in targets if t and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(module_files())
    found = cycles(graph)
    report = "\n".join(
        "cycle: " + ", ".join(c) + "\n" + "\n".join(f"  {a} -> {b}" for a in c for b in sorted(graph[a] & set(c)))
        for c in found)
    assert not found, f"import cycles (move the shared piece into a module below both):\n{report}"


def test_the_checker_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(module_files(pkg))) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_import_vagent_is_light():
    """``import vagent`` (and its CLI module) loads none of the heavy optional parts."""
    code = ("import sys, vagent, vagent.cli; heavy = ['torch', 'transformers', 'ray', 'vllm', 'fastapi', 'peft', "
            "'matplotlib', 'wandb']; print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported at package import time: {out.stdout.strip()}"


def test_the_command_line_and_api_only_evaluation_import_no_torch():
    """``vagent --help`` builds every subcommand's parser, and API-only evaluation (``vagent.rollout``'s
    loop, policies and records, the eval config) runs without torch: neither imports it. Nor does the
    replica actors' module, which Ray imports before an actor's ``__init__``: torch and transformers
    load inside the actor's ``heavy_imports`` block (vagent/startup.py), out of the collector's walks."""
    code = ("import sys, vagent.cli, vagent.rollout, vagent.rollout.loop, vagent.eval.config, "
            "vagent.models.replica_actors; vagent.cli.build_parser(); "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported by the CLI parser, vagent.rollout or the replica actors' module: {out.stdout.strip()}"


@pytest.mark.parametrize("job", [[], ["--nproc", "2"]], ids=["one-process", "torchrun-job"])
def test_a_config_error_is_said_before_torch_loads(tmp_path, job):
    """``vagent train`` (and ``--nproc``'s launcher) checks its config before importing torch and the
    recipes: a wrong key is one line in well under a second of work instead of ~6 s (``-X importtime``
    lists every module loaded)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "vagent", "train", *job, "update.bogus=1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "unknown key 'bogus' in UpdateConfig" in errors[0], out.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "vagent.runconfig" in loaded and not {"torch", "transformers"} & loaded, sorted(loaded)[:40]


#: the packages that run recipes (and so sit above them); every other module is below the recipes
ABOVE_RECIPES = ("vagent.recipes", "vagent.cli", "vagent.__main__", "vagent.sweep", "vagent.eval")


def test_no_module_below_the_recipes_imports_them():
    """The run config lives below the recipes (``vagent.runconfig``), so the rollout drivers, the
    replicas, the run directory's tokens and progress read it without an arrow up into a recipe."""
    graph = import_graph(module_files())
    upward = {m: sorted(t for t in targets if t == "vagent.recipes" or t.startswith("vagent.recipes."))
              for m, targets in graph.items() if not m.startswith(ABOVE_RECIPES)}
    upward = {m: t for m, t in upward.items() if t}
    assert not upward, f"modules below the recipes import them (move what they need below): {upward}"


def test_the_run_configs_old_name_is_the_same_module():
    import vagent.recipes.config as old
    import vagent.recipes.config.sections as old_sections
    import vagent.runconfig as new

    assert old is new and old_sections.RunConfig is new.RunConfig
