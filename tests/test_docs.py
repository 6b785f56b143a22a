"""The commands the docs show either run here or are listed with the reason they do not.

Every command in a fenced shell code block (language ``bash``, ``sh``, ``shell``, ``console`` or
none) of README.md and docs/*.md is collected: a line (with its ``\\`` continuations) that, after
a ``$ `` prompt and leading ``NAME=value`` assignments, starts with ``vagent``, ``python``,
``python3``, ``pip``, ``torchrun`` or ``.venv/bin/...``, or has such a command after ``&&``,
``||``, ``;`` or ``(``. In a block with ``$ `` prompts only the prompted lines are commands (the
rest is output). Trailing ``# comments`` are not part of a command.

Each command must match a pattern of exactly one of two tables:

- :data:`RUN`: fast commands (no model download, no training), run by
  ``test_doc_commands_run`` with the repository venv's executables first on ``PATH``, in a
  temporary directory, in the order the doc shows them, each with a timeout;
- :data:`SKIP`: commands that cannot run here or take minutes, each with its reason.

A command that matches neither fails ``test_every_doc_command_is_run_or_listed`` with its file
and line and what to add; a pattern that matches no command any more fails
``test_every_table_pattern_matches_a_doc_command``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SHELL_LANGS = frozenset({"", "bash", "sh", "shell", "console"})
COMMAND_START = re.compile(r"(?:vagent|python3?|pip3?|torchrun|\.venv/bin/\S+)(?:\s|$)")
ASSIGNMENTS = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
TIMEOUT_S = 120

# Fast commands, run in a temporary directory (a doc's commands in the order shown, so a later one
# may use an earlier one's output). Patterns are full matches of the command with its comment
# removed and whitespace collapsed.
RUN: tuple[str, ...] = (
    r"vagent train --describe",
    r"vagent eval --describe",
    r"vagent envs",
    r"vagent envs frozenlake",
    r"vagent play frozenlake --policy solver --seed 3",
    r"vagent play frozenlake --policy random --max-turns 5 --config is_slippery=true",
    r"vagent play sokoban --policy solver --seed 3 --save-dir out/ --config dim_room=\[7,7\] num_boxes=2",
    r"vagent demos frozenlake --format grounding_worldmodeling --n 8 demos/frozenlake\.jsonl",
    r"vagent vigorl make-data data/vs --n 64 --seed 0",
    r"export VAGENT_SERVICE_TOKEN=\$\(python -c 'import secrets; print\(secrets\.token_urlsafe\(\)\)'\)",
)

MINUTES = "trains (caption pretraining, SFT, RL): minutes to hours; tests/recipes run scaled-down versions"
GPU = "needs GPUs (CUDA, vLLM or several cards); tests marked gpu run it where a GPU exists"
SERVER = "starts a server that runs until stopped; tests/service and tests/viewer start it on loopback"
HUB = "needs a Hugging Face hub model (a download); tests/models/test_hub_loading.py loads a cached one"
NEEDS_RUN = "needs a run directory or checkpoint that a training run writes"
CORRIDOR = ("needs mypackage/corridor.py, the template of docs/custom_env.md: tests/recipes/test_custom_env.py runs "
            "the guide's envs, play, demos and train commands as written from the markdown, and "
            "tests/recipes/test_remote_envs.py starts serve-env --import mypackage.corridor")
BENCH = "a benchmark: minutes on a 2-core machine, and its figures are measurements, not checks"

# Commands the docs show that this test does not run: pattern -> reason.
SKIP: dict[str, str] = {
    # README: the two commands (.ci/run runs the second one verbatim)
    r"scripts/make-venv \.venv && .*\.venv/bin/vagent train": "creates a venv and runs the main job: "
    "minutes of install and ~15 min of training",
    r"\(command -v chromium .*\.venv-vllm/bin/python -m pytest -q -m vllm": "creates the venvs and runs the "
    "whole test suite: .ci/run runs exactly this",
    # training
    r"vagent train": MINUTES,
    r"vagent train --config configs/\S+\.yaml( \S+=\S+)*": MINUTES,
    r"vagent train --config configs/frozenlake_ppo\.yaml steps=60 .*": MINUTES,
    r"vagent train --resume \S+": NEEDS_RUN,
    r"vagent train --config my_run\.yaml rollout\.replicas=2 .*rollout\.replica_resources=.*": "needs a Ray cluster "
    "of two hosts; tests/multihost/test_ray_hosts.py runs it on network namespaces",
    r"vagent train --import mypackage\.corridor .*": CORRIDOR,
    r"(WANDB_MODE=offline )?vagent train log\.wandb=true .*": MINUTES,
    r"vagent train hub\.repo_id=.*": "trains and uploads to the Hugging Face hub (a token, network)",
    r"(HF_HUB_OFFLINE=1 )?vagent train (--config \S+ )?model\.path=Qwen/.*": HUB + "; and a GPU",
    r"vagent train --nproc .*": GPU,
    r"vagent train --config configs/paper/\S+\.yaml --nproc \d+": GPU + "; and the 3B model (docs/paper.md)",
    r"vagent train --config configs/paper/\S+\.yaml --smoke": "tests/recipes/test_paper_recipes.py runs every "
    "recipe's smoke step",
    r"vagent eval --config configs/paper/\S+\.yaml --backend \S+ --model \S+": "calls a paid API or needs the 3B model",
    r"torchrun .*": GPU,
    r"python3 scripts/gpu-check OUT": GPU + "; tests/test_gpu_check.py runs its dry run",
    # models
    r"vagent model init-tiny \S+( --\S+ \S+)*": "builds a model (imports torch and transformers, "
    "trains a tokenizer): tens of seconds, minutes on a loaded machine; tests/models/test_cli.py runs it",
    r"vagent model info runs/tiny": "needs the model of the init-tiny line above; tests/models/test_cli.py runs it",
    r"vagent model info Qwen/.*": HUB,
    r"python -c \"from transformers import .*": NEEDS_RUN,
    # envs
    r"vagent envs corridor .*": CORRIDOR,
    r"vagent play corridor .*": CORRIDOR,
    r"vagent demos corridor .*": CORRIDOR,
    r"vagent serve-env --envs corridor .*": CORRIDOR,
    r"vagent play frozenlake --policy human .*": "interactive: reads moves from the terminal",
    r"vagent play svg --policy solver .*": "renders with cairosvg and scores image similarity: "
    "~25 s; tests/envs/test_svg.py plays the solver",
    # service
    r"(CUDA_VISIBLE_DEVICES=\S+ )?vagent serve-env .*": SERVER,
    r"python -m vagent\.service\.server .*": SERVER,
    r"vagent view \S+( --out \S+)?": NEEDS_RUN + " (and without --out it serves until stopped)",
    # evaluation
    r"vagent eval --backend openai .*": "calls a paid API (an API key, network)",
    r"vagent eval --backend hf --model runs/.*": NEEDS_RUN,
    r"vagent eval --model runs/.*": NEEDS_RUN,
    r"vagent eval runs/\S+.*": NEEDS_RUN,
    r"vagent eval --backend hf --model /tmp/tiny .*": "needs the tiny model built at /tmp/tiny first "
        "(`vagent model init-tiny /tmp/tiny`, minutes); tests/eval run the hf backend on a tiny model",
    r"vagent sweep configs/sweeps/\S+\.yaml": MINUTES,
    r"vagent sweep report \S+": NEEDS_RUN,
    r"vagent eval --config configs/eval_example\.yaml": "evaluates the example's models: "
    "needs its API key or checkpoint",
    # rewards
    r"vagent judge-audit .*": NEEDS_RUN + " and an LLM judge's endpoint",
    r"python -m pytest tests/\S+ .*": "a part of the test suite itself",
    # vigorl
    r"vagent vigorl mcts .*": "MCTS over 64 examples: ~50 s on a loaded machine; tests/vigorl runs it small",
    r"vagent vigorl traces .*": "needs the trees of the mcts line above; tests/vigorl runs it",
    # benchmarks
    r"(PYTHONPATH=\. )?python bench/\S+\.py.*": BENCH,
}


@dataclass(frozen=True)
class DocCommand:
    """One command shown in a doc: where it is and its text (comment removed, spaces collapsed)."""

    path: str  # relative to the repository root
    line: int  # 1-based line of its first line
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` at a word start, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def is_command(text: str) -> bool:
    """Whether a shell line is a command this test tracks (see the module docstring)."""
    for part in re.split(r"&&|\|\||;|\(|\$\(", text):
        if COMMAND_START.match(ASSIGNMENTS.sub("", part.strip())):
            return True
    return False


def extract_commands(path: Path, root: Path = ROOT) -> list[DocCommand]:
    """The commands in ``path``'s fenced shell code blocks."""
    rel = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    commands: list[DocCommand] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        marker, lang = fence.group(1), fence.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(marker):
            end += 1
        body = list(enumerate(lines[i + 1:end], start=i + 2))
        i = end + 1
        if lang not in SHELL_LANGS:
            continue
        prompted = any(text.lstrip().startswith("$ ") for _, text in body)
        j = 0
        while j < len(body):
            number, text = body[j]
            j += 1
            text = text.strip()
            if prompted:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            while text.endswith("\\") and j < len(body):
                text = text[:-1] + " " + body[j][1].strip()
                j += 1
            text = " ".join(strip_comment(text).split())
            if text and is_command(text):
                commands.append(DocCommand(rel, number, text))
    return commands


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def classify(command: DocCommand) -> tuple[str, str]:
    """("run", pattern), ("skip", reason) or ("unlisted", message) for one command."""
    runs = [p for p in RUN if re.fullmatch(p, command.text)]
    skips = [p for p in SKIP if re.fullmatch(p, command.text)]
    if runs and skips:
        return "unlisted", (f"{command.where}: `{command.text}` matches both RUN {runs[0]!r} and SKIP "
                            f"{skips[0]!r} in tests/test_docs.py; make the patterns disjoint")
    if runs:
        return "run", runs[0]
    if skips:
        return "skip", SKIP[skips[0]]
    return "unlisted", (f"{command.where}: `{command.text}` is neither run nor listed; add a pattern "
                        f"to RUN in tests/test_docs.py if it is fast (seconds, no network, no GPU), "
                        f"or to SKIP with the reason it cannot run here")


ALL_COMMANDS = [c for path in doc_files() for c in extract_commands(path)]
RUN_BY_DOC: dict[str, list[DocCommand]] = {}
for _command in ALL_COMMANDS:
    if classify(_command)[0] == "run":
        RUN_BY_DOC.setdefault(_command.path, []).append(_command)


def test_every_doc_command_is_run_or_listed():
    problems = [message for c in ALL_COMMANDS for kind, message in [classify(c)] if kind == "unlisted"]
    assert not problems, "\n".join(problems)


def test_every_table_pattern_matches_a_doc_command():
    texts = [c.text for c in ALL_COMMANDS]
    stale = [p for p in (*RUN, *SKIP) if not any(re.fullmatch(p, t) for t in texts)]
    assert not stale, ("patterns in tests/test_docs.py that match no command in README.md or "
                       f"docs/*.md (remove them, or fix them to the doc's text): {stale}")


@pytest.mark.parametrize("doc", sorted(RUN_BY_DOC))
def test_doc_commands_run(doc, tmp_path):
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)  # for commands written as .venv/bin/...
    for command in RUN_BY_DOC[doc]:
        try:
            proc = subprocess.run(["bash", "-c", command.text], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command.where}: `{command.text}` ran past {TIMEOUT_S} s; make it faster or move "
                        f"it to SKIP in tests/test_docs.py with the reason")
        assert proc.returncode == 0, (f"{command.where}: `{command.text}` exited {proc.returncode}; fix the "
                                      f"doc or the command.\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


# The collector itself, on docs written for the purpose.

def _doc(tmp_path: Path, text: str) -> list[DocCommand]:
    (tmp_path / "docs").mkdir(exist_ok=True)
    path = tmp_path / "docs" / "x.md"
    path.write_text(text)
    return extract_commands(path, root=tmp_path)


def test_collects_shell_blocks_with_continuations_comments_and_prompts(tmp_path):
    commands = _doc(tmp_path, "\n".join([
        "# Title",                                                   # 1
        "```bash",                                                   # 2
        "vagent train steps=2 \\",                                   # 3
        "    seed=1   # a comment",                                  # 4
        "mkdir -p out && touch out/x",                               # 5: not a tracked command
        "HF_HUB_OFFLINE=1 vagent envs",                              # 6
        "```",                                                       # 7
        "```yaml",                                                   # 8
        "vagent: not a command in YAML",                             # 9
        "```",                                                       # 10
        "```console",                                                # 11
        "$ python -m vagent --help",                                 # 12
        "vagent output line, not a command",                         # 13
        "```",                                                       # 14
        "```",                                                       # 15
        "cd x && .venv/bin/pip install -e . # install",              # 16
        "```",                                                       # 17
        "```text",                                                   # 18
        "vagent vigorl mcts  ->  vagent vigorl traces",               # 19
        "```",                                                       # 20
    ]))
    assert [(c.line, c.text) for c in commands] == [
        (3, "vagent train steps=2 seed=1"),
        (6, "HF_HUB_OFFLINE=1 vagent envs"),
        (12, "python -m vagent --help"),
        (16, "cd x && .venv/bin/pip install -e ."),
    ]
    assert strip_comment("python -c 'print(\"#\")'  # note") == "python -c 'print(\"#\")'"


def test_an_unlisted_command_fails_naming_file_line_and_fix(tmp_path):
    [command] = _doc(tmp_path, "intro\n\n```sh\nvagent frobnicate --now\n```\n")
    kind, message = classify(command)
    assert kind == "unlisted"
    assert message.startswith("docs/x.md:4: `vagent frobnicate --now` is neither run nor listed")
    assert "RUN in tests/test_docs.py" in message and "SKIP" in message


def test_listed_commands_are_classified():
    assert classify(DocCommand("d.md", 1, "vagent envs")) == ("run", "vagent envs")
    assert classify(DocCommand("d.md", 1, "vagent train"))[0] == "skip"
    assert classify(DocCommand("d.md", 1, "vagent train --describe")) == ("run", "vagent train --describe")


def test_ci_runs_the_readmes_test_command_verbatim():
    """.ci/run's command line is README command 2, character for character (a change to one and not
    the other would make CI test another set-up than the one users run)."""
    readme = [c.text for c in extract_commands(ROOT / "README.md") if c.text.startswith("(command -v chromium")]
    ci = [" ".join(line.split()) for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith("(command -v chromium")]
    assert len(readme) == 1 and ci == readme, f"README command 2: {readme}\n.ci/run: {ci}"
