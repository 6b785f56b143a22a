"""The navigation env's furniture catalogue: object types with their map symbols, footprints,
heights and synonyms (the judge's object vocabulary), the furniture colours and the legend of the
egocentric symbolic map. Data only; rooms are built from it in :mod:`vagent.envs.navigation.world`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FurnitureType:
    """A catalogue entry: name, map symbol, footprint (width x depth, metres), height (metres)."""

    name: str
    symbol: str
    width: float
    depth: float
    height: float
    synonyms: tuple[str, ...] = ()


#: the furniture catalogue (names are the judge's object types)
CATALOG: tuple[FurnitureType, ...] = (
    FurnitureType("sofa", "S", 1.5, 0.75, 0.8, ("couch", "settee")),
    FurnitureType("table", "T", 1.0, 0.75, 0.75, ("dining table", "coffee table")),
    FurnitureType("fridge", "F", 0.75, 0.75, 1.8, ("refrigerator", "freezer")),
    FurnitureType("lamp", "L", 0.25, 0.25, 1.6, ("floor lamp", "standing lamp")),
    FurnitureType("plant", "P", 0.5, 0.5, 1.1, ("houseplant", "potted plant", "pot plant")),
    FurnitureType("tv", "V", 1.0, 0.25, 1.2, ("television", "tv set", "screen")),
    FurnitureType("chair", "C", 0.5, 0.5, 0.9, ("armchair", "stool")),
    FurnitureType("bookshelf", "B", 1.0, 0.5, 1.9, ("bookcase", "shelf")),
    FurnitureType("cabinet", "K", 0.75, 0.5, 1.0, ("cupboard", "dresser")),
    FurnitureType("trash can", "R", 0.5, 0.5, 0.6, ("garbage can", "trashcan", "bin", "dustbin")),
    FurnitureType("desk", "D", 1.0, 0.5, 0.75, ("writing desk", "workbench")),
    FurnitureType("piano", "N", 1.25, 0.5, 1.2, ("upright piano", "grand piano")),
)
CATALOG_BY_NAME = {t.name: t for t in CATALOG}

#: named colours of the furniture (RGB); a room uses distinct colours
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200), "yellow": (230, 200, 30),
    "orange": (235, 130, 30), "purple": (130, 50, 170), "pink": (240, 120, 180), "cyan": (40, 190, 200),
    "brown": (120, 75, 35), "black": (30, 30, 30), "white": (240, 240, 240), "gray": (130, 130, 130),
}

#: legend of the egocentric symbolic map (``state["map"]``)
LEGEND = ", ".join(["# wall", ". floor", "^ you (facing up)"] + [f"{t.symbol} {t.name}" for t in CATALOG])


__all__ = ["FurnitureType", "CATALOG", "CATALOG_BY_NAME", "COLORS", "LEGEND"]
