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

The three phases run on one worker thread per hook state: DDP calls the hook in
bucket order on every rank, a single thread keeps that order for the collectives
of all three groups (so ranks never match one bucket's all-gather against
another's reduce-scatter), and backward keeps computing while it works.
"""

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from trainwave import contract


@dataclass(frozen=True)
class NodeGroups:
    """This rank's two process subgroups: its node, and its peers across nodes."""

    intra: dist.ProcessGroup  # the ranks on this node
    inter: dist.ProcessGroup  # one rank per node: those with this rank's local rank
    local_world_size: int
    nodes: int

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
    inter, _ = dist.new_subgroups_by_enumeration(by_local)
    # Every rank is in one group of each kind; anything else is a torch contract change.
    if not isinstance(intra, dist.ProcessGroup) or not isinstance(inter, dist.ProcessGroup):
        raise RuntimeError(f"rank {dist.get_rank()} was left out of its node or peer group")
    return NodeGroups(intra, inter, local_world_size, nodes)


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
    flat = tensor.reshape(-1)
    count, local = flat.numel(), groups.local_world_size
    dtype = compress_dtype or tensor.dtype
    # Divide before any cast, as torch's hooks do, so fp16 sums cannot overflow.
    scale = 1.0 / groups.world_size if average else 1.0
    if local == 1:
        work = (flat * scale).to(dtype)
        dist.all_reduce(work, group=groups.inter)
        flat.copy_(work)
        return tensor
    chunk = math.ceil(count / local)
    # The padding (at most local-1 elements) lets every rank own an equal slice.
    padded = torch.zeros(chunk * local, dtype=dtype, device=tensor.device)
    padded[:count].copy_(flat * scale if average else flat)
    shard = torch.empty(chunk, dtype=dtype, device=tensor.device)
    dist.reduce_scatter_tensor(shard, padded, group=groups.intra)
    if groups.nodes > 1:
        dist.all_reduce(shard, group=groups.inter)
    dist.all_gather_into_tensor(padded, shard, group=groups.intra)
    flat.copy_(padded[:count])
    return tensor


@dataclass
class HierarchicalState:
    """What the hook carries between calls: the groups, the dtype, its worker thread."""

    groups: NodeGroups
    compress_dtype: torch.dtype | None = None
    _worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="trainwave-hier")
    )

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def hierarchical_allreduce_hook(
    state: HierarchicalState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket with the three-phase allreduce (see module doc)."""
    buffer = bucket.buffer()
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def run() -> None:
        try:
            hierarchical_all_reduce_(buffer, state.groups, compress_dtype=state.compress_dtype)
        except Exception as exc:  # handed to DDP, which raises it in backward
            result.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong
        else:
            result.set_result(buffer)

    state._worker.submit(run)
    return result
