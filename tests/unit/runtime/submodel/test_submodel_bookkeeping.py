"""Seeded randomized property tests of the bookkeeping: no leaks, never over
budget, every tensor in exactly one tier. Each seed is a separate case, so a
failure names the seed that reproduces it."""

import random
from itertools import pairwise

import pytest
import torch
from submodel_training import OPTIMIZERS, deterministic, loss_fn
from torch import nn

from trainwave.runtime.submodel.census import StorageCensus
from trainwave.runtime.submodel.executor import SubmodelExecutor
from trainwave.runtime.submodel.ledger import DEVICE, HOST, BudgetExceeded, Ledger
from trainwave.runtime.submodel.partition import Loss, partition
from trainwave.runtime.submodel.tiers import HostArena


@pytest.mark.parametrize("seed", range(40), ids=lambda s: f"seed{s}")
def test_ledger_against_a_shadow_model(seed):
    rng = random.Random(seed)
    budget = rng.randint(100, 10_000)
    ledger = Ledger(budget)
    shadow: dict[int, tuple[str, int]] = {}
    for _ in range(300):
        key = rng.randrange(30)
        if rng.random() < 0.25:
            ledger.drop(key)
            shadow.pop(key, None)
        else:
            tier, nbytes = rng.choice((DEVICE, HOST)), rng.randint(0, budget // 3)
            others = sum(n for k, (t, n) in shadow.items() if t == DEVICE and k != key)
            if tier == DEVICE and others + nbytes > budget:
                with pytest.raises(BudgetExceeded):
                    ledger.place(key, tier, nbytes)
            else:
                ledger.place(key, tier, nbytes)
                shadow[key] = (tier, nbytes)
        ledger.check()
        assert {k: ledger.tier_of(k) for k in shadow} == {k: t for k, (t, _) in shadow.items()}
        assert ledger.used[DEVICE] == sum(n for t, n in shadow.values() if t == DEVICE) <= budget
        assert ledger.peak[DEVICE] <= budget
    for key in list(shadow):
        ledger.drop(key)
    assert ledger.used == {DEVICE: 0, HOST: 0}


@pytest.mark.parametrize("seed", range(20), ids=lambda s: f"seed{s}")
def test_host_arena_slots_never_overlap(seed):
    rng = random.Random(seed)
    arena = HostArena(chunk_bytes=4096)
    for _round in range(3):
        spans = []
        for _ in range(rng.randint(1, 40)):
            like = torch.empty(
                rng.randint(1, 700), dtype=rng.choice((torch.float32, torch.int64, torch.uint8))
            )
            slot = arena.slot(like)
            assert slot.shape == like.shape
            assert slot.dtype == like.dtype
            start = slot.data_ptr()
            spans.append((start, start + slot.numel() * slot.element_size()))
        spans.sort()
        for (_, end), (start, _) in pairwise(spans):
            assert end <= start
        reserved = arena.reserved
        arena.reset()
    assert arena.reserved == reserved  # reuse after reset: no new chunks for the same load


def random_mlp(rng: random.Random) -> nn.Sequential:
    widths = [rng.randint(4, 40) for _ in range(rng.randint(2, 6))]
    layers: list[nn.Module] = []
    for i, o in pairwise(widths):
        layers += [nn.Linear(i, o), rng.choice((nn.ReLU(), nn.Tanh(), nn.Dropout(0.2)))]
    layers.append(nn.Linear(widths[-1], 5))
    return nn.Sequential(*layers)


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_executor_bookkeeping_randomized(seed):
    rng = random.Random(seed)
    with deterministic():
        torch.manual_seed(seed)
        model = random_mlp(rng)
        batch = rng.randint(1, 24)
        width = model[0].in_features
        data = [(torch.randn(batch, width), torch.randint(0, 5, (batch,))) for _ in range(6)]
        optimizer = rng.choice(list(OPTIMIZERS))
        groups = rng.randint(1, len(model))
        part = partition(
            model, data[0][0], OPTIMIZERS[optimizer], groups=groups, loss=Loss(loss_fn, data[0][1])
        )
        census = StorageCensus()
        executor = SubmodelExecutor(
            model, part, OPTIMIZERS[optimizer], loss_fn, part.largest.peak, census=census
        )
        host_after_first_cycle = None
        for step, (x, y) in enumerate(data):
            apply = rng.random() < 0.6 or step == len(data) - 1
            executor.step(x, y, apply=apply)
            executor.check()  # every tensor in exactly one tier, where the ledger says
            assert executor.ledger.used[DEVICE] == 0, "something stayed on the device"
            assert census.current <= 4, "device storage leaked past the step"
            assert executor.ledger.peak[DEVICE] <= part.largest.peak
            assert census.peak <= part.largest.peak
            if step == 2:
                host_after_first_cycle = executor.static.reserved
        # Gradient slots are reused across accumulation cycles: the host does not grow.
        assert executor.static.reserved == host_after_first_cycle
