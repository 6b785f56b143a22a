"""What a built-in grid env's board symbols mean, with each symbol's tile as the env draws it."""

from __future__ import annotations

import sys
from functools import lru_cache


@lru_cache(maxsize=64)
def env_legend(env_name: str) -> list[dict]:
    """What each symbol of a built-in grid env's board means: [{"symbol", "meaning", "tile"}], from the
    env module's ``LEGEND`` ("P player, _ ice, ...", the text board's symbols); ``tile`` is that cell
    as the env draws it for ``render="vision"`` (a PNG data: URI, from the module's ``TILES`` and
    ``render_image``), or None. Empty for envs that are not grid envs (no ``LEGEND`` and ``TILES``:
    navigation's and svg's LEGEND are the symbols of a description style, not of the board) and for
    envs that are not built in."""
    import base64
    import io

    from vagent.envs.registry import env_class, list_envs

    if env_name not in list_envs(builtin_only=True):
        return []
    try:
        module = sys.modules[env_class(env_name).__module__]
    except Exception:  # noqa: BLE001 - display only: an env whose optional dependency is missing
        return []
    legend = getattr(module, "LEGEND", None)
    if not isinstance(legend, str) or not getattr(module, "TILES", None):
        return []
    tiles, draw = getattr(module, "TILES", {}), getattr(module, "render_image", None)
    out = []
    for item in legend.split(", "):
        symbol, _, meaning = item.strip().partition(" ")
        tile = None
        if symbol in tiles and draw is not None:
            buf = io.BytesIO()
            draw([symbol], 32).save(buf, format="PNG")
            tile = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        out.append({"symbol": symbol, "meaning": meaning, "tile": tile})
    return out
