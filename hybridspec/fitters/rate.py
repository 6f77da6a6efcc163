"""ρ by Dinkelbach's iteration (DESIGN A.2, A.9): the pooled throughput of the draft-side selector
over the capture rounds, at the ρ the selector itself uses.

    w0_r(ρ) = argmax_{w ∈ W0} [1 + Σ_{i<w} p̂_{r,i} − ρ C(w)]   (ties → shorter)
    ρ ← Σ_r G_r(w0_r) / Σ_r (C(w0_r) + fixed)                   until it stops changing"""

from __future__ import annotations

import numpy as np


def expected_tokens(prefix: np.ndarray) -> np.ndarray:
    """G_r(w) for w = 0 … W: [N, D] → [N, D + 2] (G(0) = G(1) = 1)."""
    N = prefix.shape[0]
    return np.concatenate((np.ones((N, 2)), 1 + np.cumsum(prefix, axis=1)), axis=1)


def select_lengths(gain: np.ndarray, cost: np.ndarray, lengths: np.ndarray, rho: float) -> np.ndarray:
    """Eq. 5 per round: [N] chosen lengths (argmax takes the first, i.e. shortest, maximum)."""
    scores = gain[:, lengths] - rho * cost[lengths][None, :]
    return lengths[np.argmax(scores, axis=1)]


def pooled_throughput(gain, cost, fixed: float, chosen: np.ndarray) -> float:
    rows = np.arange(len(chosen))
    return float(gain[rows, chosen].sum() / (cost[chosen] + fixed).sum())


def dinkelbach(prefix: np.ndarray, cost: np.ndarray, fixed: float, lengths, *, tol: float = 1e-12,
               max_iter: int = 100, strict: bool = True) -> tuple[float, list[dict]]:
    """(ρ, iterations) for p̂ [N, D], C table [W + 1] (seconds), fixed per-round cost.

    Without convergence in `max_iter` steps: RuntimeError when `strict`, else the last ρ (the
    caller sees it in the iterations and in the `rho_converged` check)."""
    lengths = np.asarray(sorted(lengths))
    gain = expected_tokens(np.asarray(prefix, float))
    rho = pooled_throughput(gain, cost, fixed, np.full(len(gain), lengths[-1]))  # start: always W
    iterations = []
    for step in range(max_iter):
        chosen = select_lengths(gain, cost, lengths, rho)
        new = pooled_throughput(gain, cost, fixed, chosen)
        done = abs(new - rho) <= tol * max(1.0, abs(rho))
        iterations.append({"iteration": step, "rho": rho, "next_rho": new, "mean_w0": float(chosen.mean()),
                           "converged": bool(done)})
        if done:
            return new, iterations
        rho = new
    if not strict:
        return rho, iterations
    raise RuntimeError(f"Dinkelbach did not converge in {max_iter} iterations (last ρ {rho})")
