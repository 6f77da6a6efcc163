"""Launch parameters of the GDN kernels: frozen dataclasses and the shipped per-length table.

Every launcher takes its parameters explicitly (`tuning=`, a `Tuning`); `SHIPPED` is the default.
Nothing here is mutable: a benchmark or a test that wants other parameters builds its own table
(`Tuning.replace`). What was measured to choose `SHIPPED`, and the variants
that lost, are in bench/results/gdn_kernels_notes.md and bench/results/gdn_fold_sweep.md.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hybridspec.kernels.gdn.checks import MAX_TOKENS


def _check_power_of_two(cls: str, name: str, value: int) -> None:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{cls}: {name}={value} is not a power of two")


@dataclass(frozen=True, slots=True)
class VerifyTuning:
    """One verification length's kernel and program shape: grid (B * HV, dv / block_v).

    method "recurrent": `verify_recurrent` (forward substitution in state space, every token's
    inputs loaded first); "split": `verify_split` (Eqs. 3, 10 by 16 x 16 products, all loads in
    flight at once, S_0 in two bf16 pieces for bf16 q, k). pdl: programmatic dependent launch on
    SM90+ (`launch.launch_options`). late_keys (split, raw keys): k's copy to k_out after the
    outputs instead of with the solve. early_state: the state rows and pending factors
    read before the PDL wait."""

    method: str
    block_v: int
    num_warps: int
    pdl: bool = True
    late_keys: bool = False
    early_state: bool = False

    def __post_init__(self):
        if self.method not in ("recurrent", "split"):
            raise ValueError(f"VerifyTuning: method={self.method!r}, expected recurrent or split")
        if self.late_keys and self.method != "split":
            raise ValueError(f"VerifyTuning: late_keys with method {self.method!r}, only the split kernel has it")
        _check_power_of_two("VerifyTuning", "block_v", self.block_v)
        _check_power_of_two("VerifyTuning", "num_warps", self.num_warps)


@dataclass(frozen=True, slots=True)
class CommitTuning:
    """The commit's program shape, grid (L * B * HV, dv / block_v). method "loop": m rank-1
    updates; "dot": one [block_v, 16] x [16, dk] tf32x3 product of all tokens' factors, loaded at
    once (block_v >= 16, the smallest tl.dot tile)."""

    method: str
    block_v: int
    num_warps: int

    def __post_init__(self):
        if self.method not in ("loop", "dot"):
            raise ValueError(f"CommitTuning: method={self.method!r}, expected loop or dot")
        _check_power_of_two("CommitTuning", "block_v", self.block_v)
        _check_power_of_two("CommitTuning", "num_warps", self.num_warps)
        if self.method == "dot" and self.block_v < 16:
            raise ValueError(f"CommitTuning: block_v={self.block_v} with method dot, expected at least 16")


@dataclass(frozen=True, slots=True)
class Tuning:
    """Per length T = 1..MAX_TOKENS: the verify launch (T the verification length) and the commit
    launch (T the window length of the factors; m is read on the device). Read-only mappings."""

    verify: Mapping[int, VerifyTuning]
    commit: Mapping[int, CommitTuning]

    def __post_init__(self):
        lengths = set(range(1, MAX_TOKENS + 1))
        for name in ("verify", "commit"):
            table = getattr(self, name)
            if set(table) != lengths:
                raise ValueError(f"Tuning: {name} covers lengths {sorted(table)}, expected 1..{MAX_TOKENS}")
            object.__setattr__(self, name, MappingProxyType(dict(table)))

    def replace(self, *, verify: Mapping[int, VerifyTuning] | None = None,
                commit: Mapping[int, CommitTuning] | None = None) -> "Tuning":
        """A new table with the given lengths' entries replaced."""
        return Tuning({**self.verify, **(verify or {})}, {**self.commit, **(commit or {})})


def _by_next_measured(measured: dict[int, object]) -> dict[int, object]:
    """A length between the measured ones takes the next measured length's choice."""
    return {T: measured[min(t for t in measured if t >= T)] for T in range(1, MAX_TOKENS + 1)}


# The fastest launches measured in whole passes of the round (`bench/results/gpu_round_notes.md`,
# `gdn_kernels_notes.md`): the recurrent kernel with one warp and 4 value rows up to T = 4; split
# with 32 rows and 4 warps from T = 5, k's copy after the outputs from T = 7 to 12; both reading
# the state before the PDL wait.
RECURRENT = VerifyTuning(method="recurrent", block_v=4, num_warps=1, early_state=True)
SPLIT = VerifyTuning(method="split", block_v=32, num_warps=4, early_state=True)
SPLIT_LATE_KEYS = dataclasses.replace(SPLIT, late_keys=True)
# The commit of a whole window: the rank-1 loop up to T = 4, one tensor-core product above.
COMMIT_LOOP = CommitTuning(method="loop", block_v=16, num_warps=1)
COMMIT_DOT = CommitTuning(method="dot", block_v=16, num_warps=4)

SHIPPED = Tuning(
    verify=_by_next_measured({4: RECURRENT, 6: SPLIT, 8: SPLIT_LATE_KEYS, 12: SPLIT_LATE_KEYS, 16: SPLIT}),
    commit={T: COMMIT_LOOP if T <= 4 else COMMIT_DOT for T in range(1, MAX_TOKENS + 1)},
)
