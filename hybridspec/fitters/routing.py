"""Routing tables n̄_all(w0) and n̄_all(w0 | n) (DESIGN A.5, A.9).

Indexing: w0 counts the anchor, so the token that a one-token expansion adds sits at target-input
position w0 + 1, i.e. draft position i = w0. Per draft position:
    n̄_all(w0)      = mean n0 (capture rounds) + mean n>0 (routing run)
    n̄_all(w0 | n)  = n + mean n>0 over routing-run tokens at that position with n0 = n;
                     a cell with fewer than `min_cell` tokens uses a per-position linear fit of
                     n>0 on n0 instead."""

from __future__ import annotations

import numpy as np

MIN_CELL = 30


class RoutingTables:
    """`fit(capture_positions, capture_n0, routing_positions, routing_n0, routing_later, draft_len, top_k)`.
    Learned: `nbar_all_` [W + 1], `nbar_cond_` [W + 1, top_k + 1], `cell_counts_` (same shape),
    `fitted_cells_` (bool, where the linear fit replaced a thin cell)."""

    def __init__(self, *, min_cell: int = MIN_CELL):
        self.min_cell = min_cell

    def fit(self, capture_positions, capture_n0, routing_positions, routing_n0, routing_later,
            draft_len: int, top_k: int) -> "RoutingTables":
        cp, cn0 = np.asarray(capture_positions), np.asarray(capture_n0, float)
        rp, rn0, rl = np.asarray(routing_positions), np.asarray(routing_n0), np.asarray(routing_later, float)
        W = draft_len + 1
        self.nbar_all_ = np.zeros(W + 1)
        self.nbar_cond_ = np.zeros((W + 1, top_k + 1))
        self.cell_counts_ = np.zeros((W + 1, top_k + 1), dtype=int)
        self.fitted_cells_ = np.zeros((W + 1, top_k + 1), dtype=bool)
        for i in range(1, draft_len + 1):  # draft position i ↔ w0 = i
            here = rp == i
            if not here.any() or not (cp == i).any():
                continue
            self.nbar_all_[i] = cn0[cp == i].mean() + rl[here].mean()
            slope, intercept = _line(rn0[here].astype(float), rl[here])
            for n in range(top_k + 1):
                cell = here & (rn0 == n)
                self.cell_counts_[i, n] = int(cell.sum())
                if cell.sum() >= self.min_cell:
                    self.nbar_cond_[i, n] = n + rl[cell].mean()
                else:
                    self.nbar_cond_[i, n] = n + intercept + slope * n
                    self.fitted_cells_[i, n] = True
        return self


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of least squares; a flat line at the mean when x does not vary."""
    if len(np.unique(x)) < 2:
        return 0.0, float(y.mean())
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)
