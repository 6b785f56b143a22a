"""Config limits (vagent/envs/limits.py) in local make(), and the tile renderer's pixels."""

from __future__ import annotations

import random

import pytest
from PIL import Image

from vagent.config import ConfigError
from vagent.envs import env_class, list_envs, make
from vagent.envs import frozenlake, grid
from vagent.envs.limits import REWARD_LIMIT, bounds_of, describe_limits, server_only_fields
from vagent.envs.sokoban import env as sokoban


@pytest.mark.parametrize("name,config,match", [
    ("frozenlake", {"size": 33}, r"size: expected 2 <= value <= 32"),
    ("frozenlake", {"size": 32, "image_size": 64}, r"image_size >= 96"),  # was PIL's ValueError at reset
    ("frozenlake", {"image_size": 20000}, r"image_size: expected 8 <= value <= 1024"),
    ("frozenlake", {"reward_success": float("inf")}, "finite"),
    ("frozenlake", {"reward_success": 1e308}, r"\|value\| <= 1e\+06"),
    ("frozenlake", {"p": float("nan")}, "finite"),
    ("frozenlake", {"fixed_map": ["P" + "_" * 40, "G"]}, "at most 32 characters"),
    ("sokoban", {"dim_room": (34, 34)}, r"dim_room: expected 4 <= value <= 24"),
    ("sokoban", {"dim_room": (20, 20), "image_size": 48}, r"image_size >= 60"),
    ("sokoban", {"solver_max_nodes": 10**9}, "solver_max_nodes"),
    ("svg", {"image_size": 4096}, r"image_size: expected 16 <= value <= 512"),
    ("gym", {"reward_scale": -1e9}, r"\|value\| <= 1e\+06"),
    ("gym", {"description": "x" * 5000}, "at most 1024 characters"),
    ("vigorl_zoom", {"max_zooms": 1000, "max_steps": 1001}, r"max_zooms: expected 1 <= value <= 16"),
])
def test_make_refuses_values_past_the_bounds_with_a_config_error(name, config, match):
    with pytest.raises(ConfigError, match=match):
        make(name, **config).reset(0)


def test_values_at_the_bounds_work():
    for name, config in (("frozenlake", {"size": 32, "image_size": 96, "reward_success": REWARD_LIMIT}),
                         ("sokoban", {"dim_room": (8, 8), "image_size": 24})):
        env = make(name, format="no_think", **config)
        obs, _ = env.reset(0)
        assert obs.images[0].size == (config["image_size"],) * 2
        env.close()


def test_every_builtin_env_declares_its_limits_and_server_only_fields_exist():
    for name in list_envs(builtin_only=True):
        cls = env_class(name)
        fields = {f for f in cls.Config.__dataclass_fields__}
        assert set(bounds_of(cls)) <= fields, name
        assert set(server_only_fields(cls)) <= fields, name
        assert "image_size" in bounds_of(cls), f"{name}: image_size scales memory and needs a bound"
        assert describe_limits(cls)
    assert {"svg_dir", "render_timeout_s", "renderer"} <= set(server_only_fields(env_class("svg")))
    assert "data" in server_only_fields(env_class("vigorl_search"))
    assert {"env_kwargs", "allow_module_ids"} <= set(server_only_fields(env_class("gym")))


def _paste_reference(grid_rows, tiles, image_size, background):
    """The renderer before issue 19: PIL tiles pasted one by one."""
    rows, cols = len(grid_rows), max(len(r) for r in grid_rows)
    cell = max(1, image_size // max(rows, cols))
    image = Image.new("RGB", (image_size, image_size), background)
    x0, y0 = (image_size - cell * cols) // 2, (image_size - cell * rows) // 2
    for r, row in enumerate(grid_rows):
        for c, symbol in enumerate(row):
            image.paste(Image.fromarray(grid._tile(tiles[symbol], cell)), (x0 + c * cell, y0 + r * cell))
    return image


@pytest.mark.parametrize("module", [frozenlake, sokoban])
def test_tile_renderer_matches_pasting_tiles(module):
    rng = random.Random(0)
    symbols = sorted(module.TILES)
    for _ in range(40):
        size = rng.choice([8, 17, 48, 96, 100, 256])
        most = min(12, size // grid.MIN_CELL_PX)  # smaller cells cannot hold the tiles (check_cells_fit)
        rows, cols = rng.randint(1, most), rng.randint(1, most)
        g = ["".join(rng.choice(symbols) for _ in range(rng.randint(1, cols))) for _ in range(rows)]
        got = grid.render_tiles(g, module.TILES, size, (1, 2, 3))
        assert got.tobytes() == _paste_reference(g, module.TILES, size, (1, 2, 3)).tobytes(), (g, size)


def test_docs_table_of_limits_matches_the_envs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "envs.md").read_text()
    for name in list_envs(builtin_only=True):
        cls = env_class(name)
        bounds = "; ".join(f"`{f}` {r}" for f, r in describe_limits(cls) if r != "server-only")
        only = ", ".join(f"`{f}`" for f in server_only_fields(cls)) or "-"
        assert f"| `{name}` | {bounds} | {only} |" in text, f"docs/envs.md 'Config limits' row of {name} is stale"
