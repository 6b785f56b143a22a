"""Every numeric config field is checked at load: finite and inside its documented range
(vagent.runconfig.ranges.RANGES); run names that leave out_dir, non-UTF-8 config files and an
out_dir that is a file are refused before any model work, in one line each."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest

from vagent.config import ConfigError, field_types
from vagent import runconfig as C
from vagent.runconfig import load_config
from vagent.runconfig.ranges import RANGES, Range, ranges_markdown


def _numeric_fields(cls: type = C.RunConfig, prefix: str = "") -> dict[str, type]:
    """dotted key -> int or float, for every numeric field (optional ones included)."""
    out: dict[str, type] = {}
    for name, tp in field_types(cls).items():
        sub = C.field_class(cls, name)
        if name == "envs":
            out.update(_numeric_fields(C.EnvEntry, prefix + "envs.N."))
        elif sub is not None and dataclasses.is_dataclass(sub):
            out.update(_numeric_fields(sub, f"{prefix}{name}."))
        else:
            base = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
            if len(base) == 1 and base[0] in (int, float):
                out[prefix + name] = base[0]
    return out


NUMERIC = _numeric_fields()


def test_every_numeric_field_has_a_range_and_every_range_a_field():
    assert sorted(set(NUMERIC) - set(RANGES)) == [], "numeric config fields without a row in config.ranges.RANGES"
    assert sorted(set(RANGES) - set(NUMERIC)) == [], "RANGES rows that name no numeric config field"


def _yaml(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ".nan"
    if isinstance(v, float) and math.isinf(v):
        return ".inf" if v > 0 else "-.inf"
    return repr(v)


def _outside(key: str, r: Range) -> list[float]:
    """Values just outside the range (and non-finite ones for float fields)."""
    if NUMERIC[key] is int:
        bad = [int(r.lo) - 1 if not r.lo_open else int(r.lo), int(r.hi) + 1 if not r.hi_open else int(r.hi)]
        if r.multiple_of:
            bad.append(int(r.lo) + 1)
        return bad
    step_lo, step_hi = max(1e-3, abs(r.lo) * 0.01), max(1e-3, abs(r.hi) * 0.01)
    return [math.nan, math.inf, -math.inf, r.lo if r.lo_open else r.lo - step_lo, r.hi if r.hi_open else r.hi + step_hi]


CASES = [(key, v) for key, r in RANGES.items() if key in NUMERIC for v in _outside(key, r)]


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={_yaml(v)}" for k, v in CASES])
def test_values_outside_the_range_are_refused_naming_the_key(key, value):
    dotted = key.replace(".N.", ".0.")
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{dotted}={_yaml(value)}"])
    msg = str(info.value)
    assert "\n" not in msg
    if NUMERIC[key] is int and isinstance(value, float):  # .nan for an integer: a type error
        assert "expected an integer" in msg
    else:
        assert msg.startswith(f"{dotted} must be ") and "got" in msg and "the default is" in msg


_DEFAULT: list = []


def _default_run() -> C.RunConfig:
    if not _DEFAULT:
        _DEFAULT.append(load_config(None))
    return _DEFAULT[0]


@pytest.mark.parametrize("key", sorted(RANGES))
def test_defaults_and_inclusive_ends_are_inside(key):
    r = RANGES[key]
    node: typing.Any = _default_run()
    for part in key.replace(".N.", ".0.").split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    assert node is None or r.contains(node)
    if not r.lo_open and not r.multiple_of:
        assert r.contains(NUMERIC[key](r.lo))
    if not r.hi_open and not r.multiple_of:
        assert r.contains(NUMERIC[key](r.hi))


def test_the_reported_cases_fail_at_load():
    """The values of the attack report (issue 35, finding 8), as a config file and as overrides."""
    for override in ("rollout.temperature=.nan", "rollout.top_p=.inf", "update.actor_lr=.inf", "ppo.gamma_turn=.nan",
                     "update.grad_clip=.nan", "steps=1.0e+26", "rollout.max_new_tokens=100000000000000",
                     "rollout.group_size=1000000000", "model.tiny_hidden=-64"):
        with pytest.raises(ConfigError, match=f"^{override.split('=')[0]} must be"):
            load_config(None, [override])


@pytest.mark.parametrize("name", ["../../x", "/abs", "a/b", "..", ".", "x\\y", " x"])
def test_names_that_leave_out_dir_are_refused(name):
    with pytest.raises(ConfigError, match="name must be a plain folder name"):
        load_config(None, [f"name={name!r}"])


def test_non_utf8_config_file_is_one_line(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("name: caf\u00e9-run\nsteps: 3\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config(f)


def test_out_dir_that_is_a_file_is_refused_before_any_model_work(tmp_path):
    from vagent.recipes.run import train

    f = tmp_path / "not-a-folder"
    f.write_text("x")
    # a model path that does not exist: were the model loaded first, the error would be about it
    cfg = load_config(None, [f"out_dir={f}", f"model.path={tmp_path / 'no-model'}", "sft.steps=0"])
    with pytest.raises(ConfigError, match="out_dir .* is a file, not a folder"):
        train(cfg, quiet=True)
    cfg = load_config(None, [f"out_dir={f / 'runs'}", f"model.path={tmp_path / 'no-model'}", "sft.steps=0"])
    with pytest.raises(ConfigError, match="cannot be created: .* is a file"):
        train(cfg, quiet=True)
    assert f.read_text() == "x"


def test_ranges_are_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert ranges_markdown() in doc, "docs/configuration.md 'Value ranges' is stale: regenerate it from " \
        "vagent.runconfig.ranges.ranges_markdown()"
