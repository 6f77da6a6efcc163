"""The counter-based draws of `kernels/sampling/reference.py`: exact 32-bit arithmetic in int64, uniforms that
depend on (seed, position, lane) only and pass a goodness-of-fit test, a race that samples in
proportion to its weights, and the point-mass rule's edge cases."""

from __future__ import annotations

import random

import torch
from scipy.stats import chisquare, kstest

from hybridspec.kernels.sampling.reference import MASK32, _mix32, _mul32, keyed_uniforms, point_mass, race


def test_mul32_is_multiplication_mod_2_to_the_32():
    rng = random.Random(0)
    xs = [rng.randrange(2**32) for _ in range(2000)] + [0, 1, MASK32]
    for c in (0x7FEB352D, 0x846CA68B, 1, MASK32):
        got = _mul32(torch.tensor(xs, dtype=torch.long), c).tolist()
        assert got == [(x * c) % 2**32 for x in xs]


def test_mix32_is_a_bijection_on_a_sample():
    x = torch.arange(1 << 16, dtype=torch.long) * 65537 & MASK32
    assert _mix32(x).unique().numel() == x.numel()


def test_uniforms_depend_on_seed_position_and_lane_only_and_are_uniform():
    seed, positions, lanes = torch.tensor([123456789012345]), torch.arange(200), torch.arange(500)
    u = keyed_uniforms(seed, positions, lanes)
    assert u.shape == (200, 500) and bool((u > 0).all() and (u < 1).all())
    assert torch.equal(u[7:9, 3:5], keyed_uniforms(seed, positions[7:9], lanes[3:5]))
    assert not torch.equal(u, keyed_uniforms(seed + 1, positions, lanes))
    assert not torch.equal(u[:, :1], keyed_uniforms(seed, positions + 1, lanes[:1])[:, :1])
    assert kstest(u.flatten().double().numpy(), "uniform").pvalue > 1e-3
    negative = keyed_uniforms(torch.tensor([-5]), positions[:4], lanes[:4])
    assert bool((negative > 0).all() and (negative < 1).all())


def test_race_samples_in_proportion_to_its_weights():
    weights = torch.tensor([[0.5, 1.5, 0.0, 3.0, 1.0]])  # unnormalised; token 2 impossible
    draws = torch.cat([race(weights, torch.tensor([9]), torch.tensor([p])) for p in range(6000)])
    counts = torch.bincount(draws, minlength=5).double()
    assert counts[2] == 0
    expected = (weights[0] / weights.sum()).double() * counts.sum()
    keep = expected > 0
    assert chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue > 1e-3


def test_point_mass_edge_cases():
    seed, start = torch.tensor([1]), torch.tensor([10])
    certain = torch.zeros(4, 6)
    certain[torch.arange(4), torch.tensor([2, 5, 1, 3])] = 1.0
    accepted, x_new = point_mass(torch.tensor([2, 5, 1]), certain, seed, start)
    assert int(accepted) == 3 and int(x_new) == 3  # every draft has probability 1: all kept, then row 3's token
    half = torch.zeros(3, 6)
    half[:, 4] = half[:, 1] = 0.5
    outcomes = set()
    for s in range(200):  # draft 4 kept with probability 1/2; when rejected the residual holds token 1 only
        accepted, x_new = point_mass(torch.tensor([4, 4]), half, torch.tensor([s]), start)
        if int(accepted) < 2:
            assert int(x_new) == 1
        outcomes.add(int(accepted))
    assert outcomes == {0, 1, 2}
    accepted, x_new = point_mass(torch.zeros(0, dtype=torch.long), certain[:1], seed, start)
    assert int(accepted) == 0 and int(x_new) == 2  # one row (ar): a plain draw
