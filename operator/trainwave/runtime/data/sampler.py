"""Length-grouped batches, balanced across ranks: DistributedSampler for variable-length data.

With random batches of variable-length samples, every batch is padded to its
longest sample and, in data-parallel training, every step waits for the rank
whose batch is most expensive. This batch sampler makes both small:

1. Shuffle all indices with a generator seeded by (seed + epoch): every rank
   computes the same permutation without communicating.
2. Cut the permutation into megabatches of `megabatch_steps` global steps
   and sort each by length, longest first, so neighbours have similar length.
3. Cut a sorted megabatch into global steps of `batch_size x num_replicas`
   samples and deal each step's samples to the ranks in snake order
   (0,1,..,R-1,R-1,..,0,...), so every rank gets one sample of each length
   band: the ranks' longest samples and total lengths differ little.
4. Shuffle the order of the global steps, so lengths vary over time.

Coverage is DistributedSampler's: without drop_last the permutation is padded
by wrapping around until it fills whole global steps (a few samples appear
twice per epoch); with drop_last the tail that does not fill a step is left
out. Use it as `DataLoader(dataset, batch_sampler=LengthGroupedSampler(...))`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


class LengthGroupedSampler:
    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        megabatch_steps: int = 50,
    ) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected an integer >= 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank}: expected 0 <= rank < num_replicas={num_replicas}")
        if megabatch_steps < 1:
            raise ValueError(f"megabatch_steps={megabatch_steps}: expected an integer >= 1")
        if not lengths:
            raise ValueError("lengths is empty: expected one length per sample")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.megabatch_steps = megabatch_steps
        self.epoch = 0
        self._position = 0  # batches of this epoch already handed out
        self._resume_at = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_replicas

    def __len__(self) -> int:
        total = len(self.lengths)
        if self.drop_last:
            return total // self.global_batch
        return math.ceil(total / self.global_batch)

    def set_epoch(self, epoch: int) -> None:
        """Like DistributedSampler.set_epoch: call before each epoch for a new order."""
        if epoch != self.epoch:
            self._resume_at = 0
        self.epoch = epoch

    def global_steps(self) -> list[list[list[int]]]:
        """This epoch's batches for every rank: steps[s][r] is rank r's batch at step s."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        total = len(self.lengths)
        order = torch.randperm(total, generator=generator) if self.shuffle else torch.arange(total)
        wanted = len(self) * self.global_batch
        if wanted > total:
            order = order.repeat(-(-wanted // total))
        order = order[:wanted]
        steps: list[list[list[int]]] = []
        span = self.global_batch * self.megabatch_steps
        for start in range(0, wanted, span):
            mega = order[start : start + span]
            # stable: equal lengths keep their shuffled order
            mega = mega[torch.sort(self.lengths[mega], descending=True, stable=True).indices]
            for step_start in range(0, len(mega), self.global_batch):
                steps.append(self._deal(mega[step_start : step_start + self.global_batch]))
        if self.shuffle:
            steps = [steps[i] for i in torch.randperm(len(steps), generator=generator).tolist()]
        return steps

    def _deal(self, step: torch.Tensor) -> list[list[int]]:
        batches: list[list[int]] = [[] for _ in range(self.num_replicas)]
        for position, index in enumerate(step.tolist()):
            lap, seat = divmod(position, self.num_replicas)
            rank = seat if lap % 2 == 0 else self.num_replicas - 1 - seat
            batches[rank].append(index)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        steps = self.global_steps()
        start, self._resume_at = self._resume_at, 0
        self._position = start
        for step in steps[start:]:
            self._position += 1
            yield step[self.rank]

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands. With DataLoader workers the position runs ahead of
        training by the batches prefetched (num_workers x prefetch_factor at most);
        those are skipped on resume, not repeated."""
        return {"epoch": self.epoch, "seed": self.seed, "position": self._position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"sampler state has seed={state['seed']}, this sampler seed={self.seed}: "
                "the resumed order would differ; construct the sampler with the saved seed"
            )
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["position"])
        self._position = self._resume_at
