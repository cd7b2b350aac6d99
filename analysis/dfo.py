"""A derivative-free least-squares search within a box (pure numerics: no simulator, no epdbench types), used by
analysis.fit to fit the simulator's constants, where each evaluation is a whole virtual-time run.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.optimize import lsq_linear


class BudgetExhausted(Exception):
    """Raised by the function under search when its budget of evaluations is spent (analysis.fit: every
    simulator run the fit was allowed): the search stops and returns the best point seen."""


def _lagrange(points: np.ndarray) -> np.ndarray:
    """Coefficients of the linear Lagrange polynomials of n+1 points (rows): [1, x] @ L gives ℓ_j(x) per j."""
    return np.linalg.pinv(np.hstack([np.ones((len(points), 1)), points]))


def least_squares_dfo(f: Callable[[np.ndarray], np.ndarray], points: np.ndarray, values: np.ndarray,
                      lower: np.ndarray, upper: np.ndarray, radius: float, xtol: float,
                      max_radius: float, grid: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ||f(x)||² over the box [lower, upper] without derivatives, after DFO-GN (Cartis & Roberts,
    "A derivative-free Gauss–Newton method", 2019): the residual vector f is modelled as linear through n+1
    points (rows of `points`, their residuals the rows of `values`); each step is the Gauss–Newton step of that
    model within a trust region (an ∞-norm box of half-width `radius`) and costs one evaluation; the new point
    replaces the one whose loss keeps the set best spread (Lagrange polynomial × distance). A failed step
    either moves a far point back near the best (where the set is thinnest) or halves the radius; a successful
    one at the region's edge doubles it, up to `max_radius`. Stops when the radius is below `xtol` or f raises
    BudgetExhausted; returns the best point seen and its residuals.
    `grid` > 0: every point evaluated is first rounded to a multiple of it (within the box), so that the last bits
    of the step's arithmetic, which differ between machines and library builds, do not choose the point."""
    X, R = points.astype(float).copy(), values.astype(float).copy()

    def on_grid(x: np.ndarray) -> np.ndarray:
        return np.clip(np.round(x / grid) * grid, lower, upper) if grid > 0 else x

    norms = np.einsum("ij,ij->i", R, R)
    try:
        while radius >= xtol:
            k = int(np.argmin(norms))
            xk, rk = X[k], R[k]
            jac = np.linalg.lstsq(X - xk, R - rk, rcond=None)[0].T          # R - rk ≈ (X - xk) Jᵀ
            box = (np.maximum(lower - xk, -radius), np.minimum(upper - xk, radius))
            step = lsq_linear(jac, -rk, bounds=box).x if np.all(box[0] < box[1]) else np.zeros_like(xk)
            gain = norms[k] - float(np.sum((rk + jac @ step) ** 2))
            if gain <= 1e-12 * norms[k] or np.abs(step).max() < xtol:
                if not _respread(f, X, R, norms, k, radius, lower, upper, on_grid):
                    radius /= 2
                continue
            x = on_grid(xk + step)
            if np.array_equal(x, xk):                   # the step rounds to nothing
                radius /= 2
                continue
            r = f(x)
            ratio = (norms[k] - float(r @ r)) / gain
            _insert(X, R, norms, k, x, r, radius)
            if ratio >= 0.7 and np.abs(step).max() >= 0.99 * radius:
                radius = min(2 * radius, max_radius)
            elif ratio < 0.1 and not _respread(f, X, R, norms, int(np.argmin(norms)), radius, lower, upper,
                                               on_grid):
                radius /= 2
    except BudgetExhausted:
        pass
    k = int(np.argmin(norms))
    return X[k], R[k]


def _insert(X, R, norms, k, x, r, radius) -> None:
    """Put (x, r) in the set in place of the point whose Lagrange polynomial is largest at x, weighted by its
    distance from the best point (which stays unless x is better)."""
    best = x if float(r @ r) < norms[k] else X[k]
    weight = np.abs(np.concatenate([[1.0], x]) @ _lagrange(X))
    weight *= np.maximum(1.0, np.abs(X - best).max(axis=1) / radius) ** 2
    if float(r @ r) >= norms[k]:
        weight[k] = -1.0
    t = int(np.argmax(weight))
    X[t], R[t], norms[t] = x, r, float(r @ r)


def _respread(f, X, R, norms, k, radius, lower, upper, on_grid) -> bool:
    """If a point lies farther than 2·radius from the best, replace it by the corner of the trust region where
    its Lagrange polynomial is largest (one evaluation) and return True; else False."""
    far = np.abs(X - X[k]).max(axis=1)
    t = int(np.argmax(far))
    if far[t] <= 2 * radius:
        return False
    gradient = _lagrange(X)[1:, t]
    x = on_grid(np.clip(X[k] + radius * np.where(gradient >= 0, 1.0, -1.0), lower, upper))
    r = f(x)
    X[t], R[t], norms[t] = x, r, float(r @ r)
    return True
