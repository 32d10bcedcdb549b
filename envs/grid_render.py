"""Frames of the grid worlds, drawn with numpy: Level-Based Foraging and the Multi-Robot Warehouse.

Both packages render through a pyglet window only, which a run without a display cannot open; these frames are what
`--capture-video` films instead, from the package env's own state. One cell is `CELL` pixels, with a grey line
between cells; numbers (levels, robot ids) are drawn in a 3 x 5 pixel font.
"""

from __future__ import annotations

import numpy as np

CELL = 24
WHITE, GRID, INK = (255, 255, 255), (200, 200, 200), (0, 0, 0)
PALETTE = [(31, 119, 180), (214, 39, 40), (148, 103, 189), (255, 127, 14), (23, 190, 207), (140, 86, 75)]  # players
FOOD, UNSEEN = (60, 179, 113), (225, 225, 225)
# the warehouse as rware's rendering.py colours it
GOAL, SHELF, REQUESTED, ROBOT, LOADED = (60, 60, 60), (72, 61, 139), (0, 128, 128), (255, 140, 0), (255, 0, 0)
DIGITS = "111101101101111 010110010010111 111001111100111 111001111001111 101101111001001 " \
         "111100111001111 111100111101111 111001001001001 111101111101111 111101111001111"  # fmt: skip
FONT = np.array([[int(c) for c in d] for d in DIGITS.split()], bool).reshape(10, 5, 3)
_yy, _xx = np.mgrid[: CELL - 1, : CELL - 1] - (CELL - 2) / 2  # a cell inside its lines
DISC = _yy**2 + _xx**2 <= (CELL * 0.4) ** 2


def canvas(rows: int, cols: int) -> np.ndarray:
    """A white (H, W, 3) uint8 frame of rows x cols cells with grid lines."""
    frame = np.full((rows * CELL + 1, cols * CELL + 1, 3), WHITE, np.uint8)
    frame[::CELL, :] = GRID
    frame[:, ::CELL] = GRID
    return frame


def _cell(frame, row, col):
    return frame[row * CELL + 1 : (row + 1) * CELL, col * CELL + 1 : (col + 1) * CELL]


def shade(frame, cells: np.ndarray, colour) -> None:
    """Fill the cells where the (rows, cols) bool array `cells` is True, keeping the grid lines."""
    rows, cols = cells.shape
    by_cell = frame[:-1, :-1].reshape(rows, CELL, cols, CELL, 3)  # a view: (row, pixel row, col, pixel col)
    r, c = np.nonzero(cells)
    by_cell[r, 1:, c, 1:] = colour  # pixel 0 of each cell's rows and columns is a grid line


def square(frame, row, col, colour, pad=2) -> None:
    """Fill cell (row, col), `pad` pixels in from its lines."""
    _cell(frame, row, col)[pad : CELL - 1 - pad, pad : CELL - 1 - pad] = colour


def disc(frame, row, col, colour) -> None:
    """A disc in cell (row, col)."""
    _cell(frame, row, col)[DISC] = colour


def number(frame, row, col, n: int, colour=WHITE, scale=2) -> None:
    """The number `n` centred in cell (row, col)."""
    glyphs = [np.kron(FONT[int(d)], np.ones((scale, scale), bool)) for d in str(n)]
    gap = np.zeros((5 * scale, scale), bool)
    text = np.hstack([g for glyph in glyphs for g in (glyph, gap)][:-1])
    h, w = text.shape
    top, left = (CELL - 1 - h) // 2, (CELL - 1 - w) // 2
    _cell(frame, row, col)[top : top + h, left : left + w][text] = colour


def arrow(frame, row, col, direction: tuple[int, int], colour=INK) -> None:
    """A notch at the edge of cell (row, col)'s disc on the side (drow, dcol): where a robot faces."""
    centre = (CELL - 1) // 2
    for t in range(CELL // 3, CELL // 2):
        _cell(frame, row, col)[centre + direction[0] * t, centre + direction[1] * t] = colour
