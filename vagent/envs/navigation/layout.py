"""The records of a navigation room: placed furniture, the floor plan and the agent pose.

Coordinates and grid values as in :mod:`vagent.envs.navigation.world`, which re-exports these
names; :mod:`vagent.envs.navigation.relations` measures with them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Furniture", "Pose", "Room"]


@dataclass(frozen=True)
class Furniture:
    """A placed object: catalogue type name, colour name, footprint ``[x0, x1) x [z0, z1)`` in cells."""

    name: str
    color: str
    x0: int
    z0: int
    x1: int
    z1: int
    height: float

    @property
    def label(self) -> str:
        """``"red sofa"``."""
        return f"{self.color} {self.name}"


@dataclass(frozen=True)
class Room:
    """A floor plan: ``grid`` [nz, nx] of FLOOR / WALL / object index + 2, the objects, the cell size."""

    grid: np.ndarray
    objects: tuple[Furniture, ...]
    cell: float

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.grid.shape[0]), int(self.grid.shape[1])


@dataclass(frozen=True)
class Pose:
    """Agent pose: cell ``(ix, iz)``, yaw in {0, 90, 180, 270}, camera pitch in degrees (down > 0)."""

    ix: int
    iz: int
    yaw: int
    pitch: int = 0

    def position(self, cell: float) -> tuple[float, float]:
        """(x, z) of the agent in metres (the cell centre)."""
        return (self.ix + 0.5) * cell, (self.iz + 0.5) * cell
