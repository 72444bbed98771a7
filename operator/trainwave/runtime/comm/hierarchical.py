"""Hierarchical allreduce as a DDP communication hook.

A flat ring over every rank pushes 2(N-1)/N of the gradient through each node's
inter-node link. Reducing inside the node first cuts that to 2(n-1)/n (n nodes),
the layout Horovod's hierarchical allreduce uses:

1. reduce-scatter inside the node: local rank i ends up with the node's sum of
   slice i of the gradient;
2. allreduce of slice i across nodes, among the ranks with the same local rank
   (the `local_world_size` allreduces run side by side, each 1/local of the data);
3. all-gather inside the node: every rank gets every summed slice back.

Ranks must be numbered node by node (RANK = NODE_RANK * LOCAL_WORLD_SIZE +
LOCAL_RANK), which the operator and torchrun both guarantee.

In the DDP hook the phases run as a pipeline, one thread per phase, each with
its own process group: DDP calls the hook in bucket order on every rank, each
thread keeps that order for its group (so ranks never match one bucket's
all-gather against another's reduce-scatter), buckets overlap each other, and
backward keeps computing meanwhile. gloo's callbacks never block: a callback
that waits on another collective can starve gloo's own two threads.
"""

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from trainwave import contract


@dataclass(frozen=True)
class NodeGroups:
    """This rank's two process subgroups: its node, and its peers across nodes."""

    intra: dist.ProcessGroup  # the ranks on this node (reduce-scatter)
    inter: dist.ProcessGroup  # one rank per node: those with this rank's local rank
    local_world_size: int
    nodes: int
    # The same ranks as `intra`, a second group so the all-gather of one bucket
    # and the reduce-scatter of the next can run side by side (see the hook).
    intra_gather: dist.ProcessGroup

    @property
    def world_size(self) -> int:
        return self.local_world_size * self.nodes


def local_world_size_from(environ: Mapping[str, str]) -> int:
    """LOCAL_WORLD_SIZE as the launcher set it, with an error that says what is wrong."""
    raw = environ.get(contract.ENV_LOCAL_WORLD_SIZE)
    if raw is None:
        raise ValueError(
            f"{contract.ENV_LOCAL_WORLD_SIZE} is not set; hierarchical allreduce needs the "
            "number of processes per node (torchrun and trainwave pods set it)"
        )
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{contract.ENV_LOCAL_WORLD_SIZE}={raw!r} is not an integer; "
            "expected the number of processes per node"
        ) from None
    if value < 1:
        raise ValueError(f"{contract.ENV_LOCAL_WORLD_SIZE}={value} must be >= 1")
    return value


def build_node_groups(local_world_size: int) -> NodeGroups:
    """Create the intra-node and inter-node subgroups. Every rank must call this, in step."""
    world = dist.get_world_size()
    if local_world_size < 1 or world % local_world_size:
        raise ValueError(
            f"local_world_size={local_world_size} must be >= 1 and divide the world size "
            f"{world}: hierarchical allreduce needs the same number of ranks on every node"
        )
    nodes = world // local_world_size
    by_node = [list(range(n * local_world_size, (n + 1) * local_world_size)) for n in range(nodes)]
    by_local = [list(range(i, world, local_world_size)) for i in range(local_world_size)]
    # new_subgroups_by_enumeration creates every group on every rank (a collective
    # requirement) and hands back the one this rank belongs to.
    intra, _ = dist.new_subgroups_by_enumeration(by_node)
    intra_gather, _ = dist.new_subgroups_by_enumeration(by_node)
    inter, _ = dist.new_subgroups_by_enumeration(by_local)
    # Every rank is in one group of each kind; anything else is a torch contract change.
    if not all(isinstance(g, dist.ProcessGroup) for g in (intra, intra_gather, inter)):
        raise RuntimeError(f"rank {dist.get_rank()} was left out of its node or peer group")
    return NodeGroups(intra, inter, local_world_size, nodes, intra_gather)  # type: ignore[arg-type]


class _Reduction:
    """One tensor's trip through the three phases; each phase is one method."""

    def __init__(
        self, tensor: torch.Tensor, groups: NodeGroups, average: bool, dtype: torch.dtype | None
    ) -> None:
        self.tensor, self.groups = tensor, groups
        self.flat = tensor.reshape(-1)
        self.count = self.flat.numel()
        self.average, self.dtype = average, dtype or tensor.dtype
        self.padded = self.shard = torch.empty(0)

    def scatter(self) -> None:
        g = self.groups
        # Divide before any cast, as torch's hooks do, so fp16 sums cannot overflow.
        source = self.flat / g.world_size if self.average else self.flat
        chunk = math.ceil(self.count / g.local_world_size)
        # The padding (at most local-1 elements) lets every rank own an equal slice.
        self.padded = torch.zeros(
            chunk * g.local_world_size, dtype=self.dtype, device=source.device
        )
        self.padded[: self.count].copy_(source)
        if g.local_world_size == 1:
            self.shard = self.padded
            return
        self.shard = torch.empty(chunk, dtype=self.dtype, device=source.device)
        dist.reduce_scatter_tensor(self.shard, self.padded, group=g.intra)

    def cross(self) -> None:
        if self.groups.nodes > 1:
            dist.all_reduce(self.shard, group=self.groups.inter)

    def gather(self) -> torch.Tensor:
        if self.groups.local_world_size > 1:
            dist.all_gather_into_tensor(self.padded, self.shard, group=self.groups.intra_gather)
        self.flat.copy_(self.padded[: self.count])
        return self.tensor


def hierarchical_all_reduce_(
    tensor: torch.Tensor,
    groups: NodeGroups,
    *,
    average: bool = True,
    compress_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Allreduce `tensor` in place (sum, or mean with `average`) in three phases; returns it.

    With `compress_dtype` (fp16/bf16) the data travels in that dtype and is cast
    back at the end, as the fp16/bf16 compression hooks do for a flat allreduce.
    """
    job = _Reduction(tensor, groups, average, compress_dtype)
    job.scatter()
    job.cross()
    return job.gather()


def _stage() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="trainwave-hier")


@dataclass
class HierarchicalState:
    """What the hook carries between calls: the groups, the dtype, one thread per phase."""

    groups: NodeGroups
    compress_dtype: torch.dtype | None = None
    _scatter: ThreadPoolExecutor = field(default_factory=_stage)
    _cross: ThreadPoolExecutor = field(default_factory=_stage)
    _gather: ThreadPoolExecutor = field(default_factory=_stage)

    def close(self) -> None:
        for stage in (self._scatter, self._cross, self._gather):
            stage.shutdown(wait=True)


def hierarchical_allreduce_hook(
    state: HierarchicalState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket with the three-phase allreduce (see module doc).

    The phases form a pipeline: while bucket k crosses nodes, bucket k+1 is
    reduce-scattered inside the node. Each phase runs on its own thread and
    each thread owns its own process group, so every group sees its buckets in
    the same order on every rank.
    """
    job = _Reduction(bucket.buffer(), state.groups, True, state.compress_dtype)
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def phase(run: Callable[[], object], then: Callable[[], object] | None) -> Callable[[], None]:
        def step() -> None:
            try:
                value = run()
            except Exception as exc:  # handed to DDP, which raises it in backward
                result.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong
                return
            if then is None:
                result.set_result(value)  # type: ignore[arg-type]  # gather returns the tensor
            else:
                then()

        return step

    gather = phase(job.gather, None)
    cross = phase(job.cross, lambda: state._gather.submit(gather))
    state._scatter.submit(phase(job.scatter, lambda: state._cross.submit(cross)))
    return result
