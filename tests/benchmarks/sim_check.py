"""The shared-GPU simulation's transfer model, checked against the executor.

Kept apart from sim_shared_gpu.py so the simulation stays a model and this
file holds the one place it touches real training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainwave.runtime.submodel.executor import SubmodelExecutor
from trainwave.runtime.submodel.partition import Loss, partition


def small_transformer_traffic(
    bytes_model: Callable[[Any], tuple[int, int]], group_cost: Any
) -> dict[str, object]:
    torch.manual_seed(0)
    hidden, vocab, batch, sequence = 32, 50, 8, 12
    blocks = [
        nn.TransformerEncoderLayer(hidden, 4, 2 * hidden, dropout=0.0, batch_first=True)
        for _ in range(4)
    ]
    model = nn.Sequential(
        nn.Embedding(vocab, hidden), *blocks, nn.Linear(hidden, vocab), nn.Flatten(0, 1)
    )
    x = torch.randint(0, vocab, (batch, sequence))
    y = torch.randint(0, vocab, (batch * sequence,))
    factory = torch.optim.AdamW
    loss = nn.functional.cross_entropy
    part = partition(model, x, factory, groups=3, loss=Loss(loss, y))
    executor = SubmodelExecutor(model, part, factory, loss, part.largest.peak)
    executor.step(x, y)  # the first step creates the optimizer state on the device
    before = (executor.traffic.to_device, executor.traffic.to_host)
    executor.step(x, y)
    measured = (executor.traffic.to_device - before[0], executor.traffic.to_host - before[1])
    costs = []
    for index, group in enumerate(part.groups):
        following = part.groups[index + 1].input_bytes if index + 1 < len(part.groups) else 0
        costs.append(
            group_cost(
                group.peak,
                group.param_bytes,
                2 * group.param_bytes,
                group.input_bytes,
                following,
                0.0,
            )
        )
    return {"executor": list(measured), "model": list(bytes_model(tuple(costs)))}
