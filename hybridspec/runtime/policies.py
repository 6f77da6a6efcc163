"""Verification-length policies (DESIGN A.2–A.5, A.10).

Lengths `w` count the anchor: a round verifies (x0, d1 … d_{w−1}). A policy picks the nominal length
w0 from the draft alone; `hybridspec` may add one token after seeing the Layer-0 routing (Eq. 6).

    ar          no drafter, one token per target pass
    full        w = W (vanilla DFlash)
    static:N    w = N
    ratio       EVICT-like: argmax_w G(w)/L(w) over 2…W, G from raw confidences
    ratio4      D-Cut-like: the same over {4, 8, 12, 16}
    nominal     Eq. 5 with the calibrated acceptance model
    hybridspec  Eq. 5, then the routing correction of Eq. 6 with two-stage verification
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from ..artifacts.artifact import check_identity, load_artifact
from ..artifacts.params import ENTROPY_EPS, PolicyParameters
from .acceptance import AcceptanceEstimator

POLICY_NAMES = ("ar", "full", "static:N", "ratio", "ratio4", "nominal", "hybridspec")
NEEDS_PARAMETERS = ("ratio", "ratio4", "nominal", "hybridspec")


class PolicyError(ValueError):
    """A policy name or policy input that cannot be used."""


def expected_tokens(prefix_acceptance: Tensor) -> Tensor:
    """G(w) = 1 + Σ_{i=1..w−1} p_i for w = 0 … W (entries 0 and 1 are 1).  p [D] → [D + 2]."""
    ones = torch.ones(2, dtype=prefix_acceptance.dtype, device=prefix_acceptance.device)
    return torch.cat((ones, 1 + torch.cumsum(prefix_acceptance, dim=0)))


def best_length(scores: Tensor, lengths: Tensor) -> Tensor:
    """argmax of scores over candidate lengths; ties go to the shorter length (lengths ascending).
    A 0-d tensor on the scores' device (indexing by a 1-element tensor: no host read)."""
    return _at(lengths, torch.argmax(scores))


def _at(values: Tensor, index: Tensor) -> Tensor:
    """values[index] for a 0-d device index, without reading the index back to the host."""
    return values.index_select(0, index.view(1)).squeeze(0)


def new_experts_added(expert_ids: Tensor, w0: int, num_experts: int) -> int:
    """n_new = U0(w0+1) − U0(w0): Layer-0 experts first selected by token w0+1.  expert_ids [u, k]."""
    seen = torch.zeros(num_experts, dtype=torch.bool, device=expert_ids.device)
    seen[expert_ids[:w0].reshape(-1)] = True
    fresh = expert_ids[w0].unique()
    return int((~seen[fresh]).sum())


@dataclass
class Policy:
    name: str
    draft_len: int  # D

    speculative = True
    corrects_routing = False

    @property
    def max_length(self) -> int:
        return self.draft_len + 1

    def select(self, confidence: Tensor, entropy: Tensor) -> tuple[int, Tensor | None]:
        """Nominal length w0 from the draft of one request ([D] each) and p̂ when the policy has it."""
        w0, p_hat = self.nominal_length(confidence, entropy)
        return int(w0), p_hat

    def nominal_length(self, confidence: Tensor, entropy: Tensor) -> tuple[Tensor, Tensor | None]:
        """`select` on the device: w0 as a 0-d long tensor beside the draft, nothing read back."""
        raise NotImplementedError

    def to(self, device) -> "Policy":
        """This policy with its tensors on `device` (the GPU-resident round decides there)."""
        return self


class AutoregressivePolicy(Policy):
    speculative = False


class FixedPolicy(Policy):
    def __init__(self, name: str, draft_len: int, length: int):
        super().__init__(name, draft_len)
        if not 2 <= length <= draft_len + 1:
            raise PolicyError(f"{name}: length must be in 2..{draft_len + 1}")
        self.length = length

    def select(self, confidence, entropy):
        return self.length, None

    def nominal_length(self, confidence, entropy):
        return torch.full((), self.length, dtype=torch.long, device=confidence.device), None


def _check_draft_len(name: str, draft_len: int, params: PolicyParameters) -> None:
    if params.draft_len != draft_len:
        raise PolicyError(f"{name}: parameters are for D={params.draft_len}, the drafter drafts D={draft_len}")


class RatioPolicy(Policy):
    """argmax_w G(w) / (C_tgt(w) + fixed) with p_i = Π_{j≤i} conf_j (raw confidences)."""

    def __init__(self, name: str, draft_len: int, params: PolicyParameters, lengths: tuple[int, ...], device="cpu"):
        super().__init__(name, draft_len)
        _check_draft_len(name, draft_len, params)
        self.params, self.candidates = params, lengths
        self.lengths = torch.tensor(lengths, device=device)
        self.latency = torch.tensor([params.cost[w] + params.fixed_cost for w in lengths], dtype=torch.float64,
                                    device=device)

    def nominal_length(self, confidence, entropy):
        gain = expected_tokens(torch.cumprod(confidence.double().to(self.latency.device), 0))[self.lengths]
        return best_length(gain / self.latency, self.lengths), None

    def to(self, device):
        return RatioPolicy(self.name, self.draft_len, self.params, self.candidates, device)


class NominalPolicy(Policy):
    """Eq. 5: w0 = argmax_{w∈W0} [1 + Σ_{i<w} p̂_i − ρ C_tgt(w)], ties → shorter."""

    def __init__(self, name: str, draft_len: int, params: PolicyParameters, device="cpu"):
        super().__init__(name, draft_len)
        _check_draft_len(name, draft_len, params)
        self.params = params
        self.estimator = AcceptanceEstimator(params.acceptance, device)
        self.lengths = torch.tensor(sorted(params.lengths), device=device)
        self.cost = torch.tensor(params.cost, dtype=torch.float32, device=device)
        # Eq. 6 in float64, the same operations as `added_latency` on the host
        f64 = torch.float64
        width = max(len(row) for row in params.nbar_cond)
        self.cost64 = torch.tensor(params.cost, dtype=f64, device=device)  # [W + 1]
        self.nbar_all64 = torch.tensor(params.nbar_all, dtype=f64, device=device)  # [W + 1]
        self.nbar_cond64 = torch.tensor([list(r) + [r[-1]] * (width - len(r)) for r in params.nbar_cond],
                                        dtype=f64, device=device)  # [W + 1, n_max + 1], rows padded with their last
        self.scalars64 = torch.tensor([params.eta, params.s, params.rho], dtype=f64, device=device)
        self.p_hat = torch.empty(draft_len, dtype=torch.float32, device=device)  # `select_fused` writes p̂ here

    def nominal_length(self, confidence, entropy):
        p_hat = self.estimator.prefix(confidence, entropy)  # [D]
        scores = expected_tokens(p_hat)[self.lengths] - self.params.rho * self.cost[self.lengths]
        return best_length(scores, self.lengths), p_hat

    def to(self, device):
        return type(self)(self.name, self.draft_len, self.params, device)

    def select_fused(self, confidence: Tensor, entropy: Tensor, w_rem: Tensor, out: tuple[Tensor, Tensor, Tensor],
                     layer0_experts: Tensor | None = None) -> None:
        """Eq. 5 (and, given Stage 0's Layer-0 experts of the whole block [W, k], Eq. 6) in one
        Triton launch (`kernels/select`), writing w0, w_c and w = min(w_c, w_rem) into `out`
        ([1] long each); w_rem [1] long."""
        from ..kernels.select.triton import select_lengths

        est = self.estimator
        correction = None if layer0_experts is None else (layer0_experts, self.cost64, self.nbar_all64,
                                                          self.nbar_cond64, self.scalars64)
        select_lengths(confidence, entropy, est.iso_x, est.iso_y, est.coef, self.lengths, self.cost, self.params.rho,
                       w_rem, out, self.p_hat, correction, entropy_eps=ENTROPY_EPS)


class HybridSpecPolicy(NominalPolicy):
    corrects_routing = True

    def correct(self, w0: int, p_hat: Tensor, layer0_experts: Tensor, w_rem: int, num_experts: int) -> int:
        """Eq. 6: keep w0 or add the token d_{w0} after seeing its Layer-0 experts.  layer0_experts [u, k]."""
        if w0 >= self.max_length or w_rem <= w0:
            return w0
        n_new = new_experts_added(layer0_experts, w0, num_experts)
        return w0 + 1 if self.expands(w0, p_hat, n_new) else w0

    def expands(self, w0: int, p_hat: Tensor, n_new: int) -> bool:
        """Eq. 6's test p̂_{w0} > ρ ΔL_c, for a token d_{w0} that adds `n_new` new Layer-0 experts."""
        return float(p_hat[w0 - 1]) > self.params.rho * self.added_latency(w0, n_new)

    def corrected_length(self, w0: Tensor, p_hat: Tensor, layer0_experts: Tensor, w_rem: Tensor,
                         num_experts: int) -> Tensor:
        """`correct` on the device: w0, w_rem 0-d long; layer0_experts [u, k] with u > w0 whenever
        w0 < W and w_rem > w0 (the rows past w0 + 1 are never read). Returns w_c, 0-d long."""
        u, prm = layer0_experts.shape[0], self.params
        device = layer0_experts.device
        # n_new = U0(w0+1) − U0(w0): experts of token w0+1 that no earlier token selected
        present = torch.zeros(u, num_experts, device=device).scatter_(1, layer0_experts, 1.0)  # [u, E]
        earlier = (present * (torch.arange(u, device=device) < w0)[:, None]).amax(0)  # [E]
        row = present.index_select(0, w0.clamp(max=u - 1).view(1))[0]  # [E]
        n_new = (row * (1 - earlier)).sum().long()
        # ΔL_c of Eq. 6, the host's float64 operations in the host's order
        w0c = w0.clamp(max=self.max_length - 1)
        table = _at(self.nbar_cond64, w0c)  # [n_max + 1]
        extra = prm.eta * (_at(table, n_new.clamp(max=table.shape[0] - 1)) - _at(self.nbar_all64, w0c))
        added = _at(self.cost64, w0c + 1) - _at(self.cost64, w0c) - prm.s + extra
        p_last = _at(p_hat.double(), (w0c - 1).clamp(min=0))  # p̂_{w0}
        expand = (p_last > prm.rho * added) & (w0 < self.max_length) & (w_rem > w0)
        return w0 + expand.long()

    def added_latency(self, w0: int, n_new: int) -> float:
        """ΔL_c of Eq. 6 (seconds): what verifying d_{w0} adds once Stage 0 has run it."""
        prm = self.params
        table = prm.nbar_cond[w0]
        extra = prm.eta * (table[min(n_new, len(table) - 1)] - prm.nbar_all[w0])
        return prm.cost[w0 + 1] - prm.cost[w0] - prm.s + extra


def make_policy(name: str, draft_len: int, params: PolicyParameters | None = None, device="cpu") -> Policy:
    """A policy by name (see the module docstring); errors name what is missing."""
    if name == "ar":
        return AutoregressivePolicy("ar", draft_len)
    if name == "full":
        return FixedPolicy("full", draft_len, draft_len + 1)
    if name.startswith("static:"):
        try:
            length = int(name.split(":", 1)[1])
        except ValueError:
            raise PolicyError(f"policy {name!r}: static:N needs an integer N") from None
        return FixedPolicy(name, draft_len, length)
    if name in NEEDS_PARAMETERS and params is None:
        raise PolicyError(f"policy {name!r} needs calibrated parameters (an artifact from `hybridspec fit`)")
    if name == "ratio":
        return RatioPolicy(name, draft_len, params, tuple(range(2, draft_len + 2)), device)
    if name == "ratio4":
        return RatioPolicy(name, draft_len, params, tuple(w for w in (4, 8, 12, 16) if w <= draft_len + 1), device)
    if name == "nominal":
        return NominalPolicy(name, draft_len, params, device)
    if name == "hybridspec":
        return HybridSpecPolicy(name, draft_len, params, device)
    raise PolicyError(f"unknown policy {name!r}; policies: {', '.join(POLICY_NAMES)}")


class ModelPair(Protocol):
    """The content ids of a model pair: a loaded `Session`, or ids computed before loading."""

    model_id: str
    drafter_id: str | None


def resolve_policy(names: str | Sequence[str], artifact: Path | None, models: ModelPair, force: bool = False
                   ) -> tuple[PolicyParameters | None, dict | None]:
    """The calibrated parameters (and the artifact's metadata) that the policies `names` decode with.

    A policy that needs parameters needs `artifact` (PolicyError naming them); the artifact is
    loaded and validated (ArtifactError); whenever a drafter runs (`models.drafter_id`), it must
    have been fitted for this pair, both ids named, unless `force`. `ar` alone runs no drafter and
    uses nothing of the artifact. The names themselves are checked by `make_policy`."""
    names = (names,) if isinstance(names, str) else tuple(names)
    missing = [name for name in names if name in NEEDS_PARAMETERS]
    if missing and artifact is None:
        label, verb = ("policy", "needs") if len(missing) == 1 else ("policies", "need")
        raise PolicyError(f"{label} {', '.join(missing)} {verb} --artifact (the output of `hybridspec fit`); "
                          "ar, full and static:N need none")
    if artifact is None:
        return None, None
    params, meta = load_artifact(artifact)
    if models.drafter_id is not None:
        check_identity(meta, model_id=models.model_id, drafter_id=models.drafter_id, force=force,
                       source=str(artifact))
    return params, meta
