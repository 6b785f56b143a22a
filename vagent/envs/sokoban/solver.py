"""Sokoban boards and an optimal (fewest moves) A* solver over push states.

A board is a flat grid of ``height * width`` cells indexed ``r * width + c`` whose border is
wall. A search state is (player cell, boxes as a bit mask). The search expands pushes, not single
steps: from a state, every push whose push-from cell the player can reach is an edge of cost
``walk distance + 1``; the state after a push holds the player's exact cell, so the plan is
optimal in moves (not just pushes).

Heuristic: the cheapest assignment of boxes to distinct targets, each box costing the fewest
pushes that move it alone to its target (``push_distances``; exact over all assignments for up
to 4 boxes, otherwise each box to its nearest target); infinite on dead cells, which prunes them.
A push changes it by at most 1 and costs at least 1, so it is admissible and consistent and the
first goal popped is optimal.
Also pruned: a box pushed into a 2x2 block of walls and boxes that is not all on targets.
Ties break deterministically (lowest f, then highest g, then insertion order).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from vagent.envs.grid import bfs_actions

INF = 1 << 30
MOVE_NAMES = ("Up", "Down", "Left", "Right")


class SolverLimitError(RuntimeError):
    """The search expanded more than ``max_nodes`` push states without finishing."""


@dataclass(frozen=True)
class Board:
    """The static part of a level: floor cells (bytes, 1 = floor) and targets."""

    height: int
    width: int
    floor: bytes
    targets: frozenset[int]

    @property
    def deltas(self) -> tuple[int, int, int, int]:
        """Index offsets of Up, Down, Left, Right."""
        return (-self.width, self.width, -1, 1)

    def cell(self, index: int) -> tuple[int, int]:
        return divmod(index, self.width)

    def index(self, row: int, col: int) -> int:
        return row * self.width + col


def push_distances(board: Board, targets: Iterable[int] | None = None) -> list[int]:
    """Fewest pushes moving a lone box from each cell to any of ``targets`` (default: the board's);
    INF marks a dead cell.

    Reverse BFS from the targets: a box at ``x`` came from ``x - d`` by a push in direction ``d``
    if ``x - d`` and the push-from cell ``x - 2d`` are floor.
    """
    n, floor = len(board.floor), board.floor
    dist = [INF] * n
    queue = deque()
    for t in sorted(board.targets if targets is None else targets):
        dist[t] = 0
        queue.append(t)
    while queue:
        x = queue.popleft()
        for d in board.deltas:
            b, p = x - d, x - 2 * d
            if 0 <= p < n and floor[b] and floor[p] and dist[b] == INF:
                dist[b] = dist[x] + 1
                queue.append(b)
    return dist


class _Heuristic:
    """Lower bound on the pushes left: the cheapest assignment of boxes to distinct targets
    (exact over all permutations for up to 4 boxes, else each box to its nearest target)."""

    def __init__(self, board: Board) -> None:
        self.nearest = push_distances(board)
        targets = sorted(board.targets)
        self.per_target = [push_distances(board, [t]) for t in targets] if len(targets) <= 4 else None
        self.assignments = list(itertools.permutations(range(len(targets)))) if self.per_target else []

    def __call__(self, boxes: Sequence[int]) -> int:
        if any(self.nearest[b] >= INF for b in boxes):
            return INF
        if self.per_target is None:
            return sum(self.nearest[b] for b in boxes)
        pt = self.per_target
        return min(sum(pt[t][b] for b, t in zip(boxes, perm)) for perm in self.assignments)


def walk_distances(board: Board, start: int, boxes: int) -> list[int]:
    """BFS distances of the player from ``start`` over floor cells without boxes (-1: unreachable)."""
    floor, deltas = board.floor, board.deltas
    dist = [-1] * len(floor)
    dist[start] = 0
    queue = deque([start])
    while queue:
        x = queue.popleft()
        nd = dist[x] + 1
        for d in deltas:
            y = x + d
            if dist[y] < 0 and floor[y] and not (boxes >> y) & 1:
                dist[y] = nd
                queue.append(y)
    return dist


def walk_path(board: Board, start: int, goal: int, boxes: int) -> list[str]:
    """A shortest walk (move names) from ``start`` to ``goal`` avoiding boxes (fixed move order)."""
    if start == goal:
        return []
    floor, deltas = board.floor, board.deltas

    def moves(x: int) -> Iterator[tuple[str, int]]:
        for name, d in zip(MOVE_NAMES, deltas):
            if floor[x + d] and not (boxes >> (x + d)) & 1:
                yield name, x + d

    path = bfs_actions(start, moves, lambda x: x == goal)
    if path is None:
        raise ValueError(f"cell {goal} is not reachable from {start}")
    return path


def box_mask(boxes: Iterable[int]) -> int:
    mask = 0
    for b in boxes:
        mask |= 1 << b
    return mask


def _cells(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _frozen_square(board: Board, box: int, boxes: int, target_mask: int) -> bool:
    """True if ``box`` completes a 2x2 block of walls/boxes holding a box off target."""
    w, floor = board.width, board.floor
    for c0 in (box, box - 1, box - w, box - w - 1):
        c1, c2, c3 = c0 + 1, c0 + w, c0 + w + 1
        if (floor[c0] and not (boxes >> c0) & 1) or (floor[c1] and not (boxes >> c1) & 1) \
                or (floor[c2] and not (boxes >> c2) & 1) or (floor[c3] and not (boxes >> c3) & 1):
            continue
        square = (1 << c0) | (1 << c1) | (1 << c2) | (1 << c3)
        if boxes & square & ~target_mask:
            return True
    return False


def solve(board: Board, player: int, boxes: Sequence[int], max_nodes: int = 200_000) -> list[str] | None:
    """The fewest-moves plan (move names) solving the level, [] if solved, None if unsolvable.

    Raises SolverLimitError after ``max_nodes`` expanded push states.
    """
    heuristic = _Heuristic(board)
    dist = heuristic.nearest
    mask = box_mask(boxes)
    target_mask = box_mask(board.targets)
    if mask == target_mask:
        return []
    h0 = heuristic(sorted(boxes))
    if h0 >= INF:
        return None
    shift = len(board.floor).bit_length()
    start_key = (mask << shift) | player
    best = {start_key: 0}
    parent: dict[int, tuple[int, int, int]] = {}  # key -> (parent key, box cell, direction index)
    heap = [(h0, 0, 0, player, mask, h0)]
    counter, expanded, deltas, floor = 1, 0, board.deltas, board.floor
    while heap:
        _, neg_g, _, p, m, h = heapq.heappop(heap)
        g, key = -neg_g, (m << shift) | p
        if g > best[key]:
            continue
        if m == target_mask:
            return _plan(board, key, start_key, parent, shift)
        expanded += 1
        if expanded > max_nodes:
            raise SolverLimitError(f"Sokoban solver expanded {max_nodes} push states without finishing")
        walk = walk_distances(board, p, m)
        for b in _cells(m):
            for i, d in enumerate(deltas):
                src, dst = b - d, b + d
                if walk[src] < 0 or not floor[dst] or (m >> dst) & 1 or dist[dst] >= INF:
                    continue
                nm = m ^ (1 << b) ^ (1 << dst)
                if _frozen_square(board, dst, nm, target_mask):
                    continue
                ng, nkey = g + walk[src] + 1, (nm << shift) | b
                if ng < best.get(nkey, INF):
                    best[nkey] = ng
                    parent[nkey] = (key, b, i)
                    nh = heuristic(_cells(nm))
                    heapq.heappush(heap, (ng + nh, -ng, counter, b, nm, nh))
                    counter += 1
    return None


def _plan(board: Board, key: int, start_key: int, parent: dict, shift: int) -> list[str]:
    pushes = []
    while key != start_key:
        prev, b, i = parent[key]
        pushes.append((prev, b, i))
        key = prev
    out: list[str] = []
    low = (1 << shift) - 1
    for prev, b, i in reversed(pushes):
        p, m = prev & low, prev >> shift
        out += walk_path(board, p, b - board.deltas[i], m)
        out.append(MOVE_NAMES[i])
    return out
