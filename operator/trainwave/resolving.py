"""A TrainingJob resolved once: the one value decide, the placer's ticket and the builders use.

Pure. The reconciler turns the job body into a `ResolvedJob` at the handler
boundary: the parsed spec, the template checked for what the schema cannot see,
the shared-GPU memory request (sized from a model description when one is given)
and the gang placement asks for. Nothing downstream parses the body or sizes the
model again; data flows down the layers once. `trainwave plan` resolves the same way.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.api.podspec import POD_SPEC, shape_problem, without_nulls
from trainwave.api.sharing import SharedSetup, shared_setup
from trainwave.api.trainingjob import InvalidSpec, TrainingJob, parse_trainingjob
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.ranks import Parallelism
from trainwave.placement.rdma import network_requirements
from trainwave.placement.topology import DEFAULT_LEVELS, HOSTNAME_LABEL
from trainwave.sizing.requests import SharedMemory, shared_memory


@dataclass(frozen=True)
class ResourceOverride:
    """A resource the user set in the worker container that trainwave sets itself, to
    another value: `field` is where the user wrote it, `written` what they wrote,
    `applied` what each worker gets, and `source` the field trainwave took it from."""

    field: str
    written: str
    applied: str
    source: str

    def describe(self) -> str:
        return (
            f"{self.field} is {self.written}, but each worker gets {self.applied} "
            f"(set by trainwave from {self.source})"
        )


@dataclass(frozen=True)
class ResolvedJob:
    job: TrainingJob
    shared: SharedMemory | None  # gpuSharing's request per worker; None for whole GPUs
    gang: GangRequest  # what placement is asked; the stored pods add their own needs
    # What a shared worker gets (pinning, budget, allocator, arbiter); None for whole GPUs.
    setup: SharedSetup | None = None
    # Resources the user wrote that trainwave replaced (template_overrides): a warning.
    overrides: tuple[ResourceOverride, ...] = ()


def resolve(
    body: dict[str, Any],
    levels: Sequence[str] = DEFAULT_LEVELS,
    *,
    arbiter_dir: str | None = None,
    gpu_claims: bool = False,
) -> ResolvedJob:
    """Raises InvalidSpec naming the field for what cannot run as written.

    `arbiter_dir`: the host directory of the node-local arbiter's sockets when the
    operator runs one (Helm value agent.arbiter.enabled), else None. `gpu_claims`:
    shared workers get a DRA ResourceClaim for their GPU (Helm value sharing.gpuClaims)."""
    return resolve_job(
        parse_trainingjob(body), levels, arbiter_dir=arbiter_dir, gpu_claims=gpu_claims
    )


def resolve_job(
    job: TrainingJob,
    levels: Sequence[str] = DEFAULT_LEVELS,
    *,
    arbiter_dir: str | None = None,
    gpu_claims: bool = False,
) -> ResolvedJob:
    job = _pruned(job)
    check_template(job)
    shared = None
    if job.spec.gpu_sharing is not None:
        try:
            shared = shared_memory(job.spec.gpu_sharing)
        except ValueError as error:
            raise InvalidSpec(str(error)) from None
    gang = gang_request(job, levels)
    if shared is not None:
        gang = GangRequest(
            gang.name, gang.workers, 0, gang.required_level, gang.preferred_level,
            gang.parallelism, gang.node_selector, shared_mib=shared.mib,
        )  # fmt: skip
    setup = None
    if shared is not None:
        check_shared_env(job)
        setup = shared_setup(
            shared.mib, shared.bytes, job.spec.runtime, arbiter_dir, gpu_claim=gpu_claims
        )
    return ResolvedJob(job, shared, gang, setup, template_overrides(job, shared))


def owned_resources(job: TrainingJob, shared: SharedMemory | None) -> dict[str, tuple[str, str]]:
    """The worker container's resources trainwave sets itself: name -> (value, the field
    it comes from). The builders write these over whatever the template says
    (builders/pods.py set_gpus, builders/sharing.py, builders/network.py)."""
    spec = job.spec
    owned: dict[str, tuple[str, str]] = {}
    if spec.gpus_per_worker > 0:
        owned[contract.GPU_RESOURCE] = (str(spec.gpus_per_worker), "spec.gpusPerWorker")
    if shared is not None:
        owned[contract.SHARED_GPU_MEMORY_RESOURCE] = (
            str(shared.mib),
            "spec.gpuSharing (MiB)",
        )
    rdma = spec.network.rdma if spec.network is not None else None
    if rdma is not None:
        owned[rdma.resource_name] = (str(rdma.count), "spec.network.rdma.count")
    return owned


def template_overrides(
    job: TrainingJob, shared: SharedMemory | None
) -> tuple[ResourceOverride, ...]:
    """Where the user asked the worker container for a resource trainwave sets itself,
    with another value: in spec.template's worker container or in spec.resources. The
    same value is no news (a manifest ported from PyTorchJob often repeats the GPU count
    in the container), so only a differing one is reported. Pure."""
    owned = owned_resources(job, shared)
    if not owned:
        return ()
    sources: list[tuple[str, dict[str, Any]]] = []
    for container in job.spec.template.spec.get("containers", []):
        if container.get("name") == contract.WORKER_CONTAINER:
            where = f"{_TEMPLATE}.containers[{contract.WORKER_CONTAINER}].resources"
            sources.append((where, dict(container.get("resources") or {})))
    resources = job.spec.resources
    sources.append(("spec.resources", {"requests": resources.requests, "limits": resources.limits}))
    found = []
    for where, asked in sources:
        for kind in ("limits", "requests"):
            for name, value in (asked.get(kind) or {}).items():
                if name in owned and str(value).strip() != owned[name][0]:
                    applied, source = owned[name]
                    found.append(
                        ResourceOverride(f"{where}.{kind}[{name}]", str(value), applied, source)
                    )
    return tuple(found)


def check_shared_env(job: TrainingJob) -> None:
    """A shared worker is pinned and budgeted by the operator; a user value for one of
    those names would silently unpin it, so it is refused instead."""
    sources = [("spec.env", [e.name for e in job.spec.env])]
    for container in job.spec.template.spec.get("containers", []):
        where = f"spec.template.spec.containers[{container['name']}].env"
        sources.append((where, [str(e.get("name")) for e in container.get("env", [])]))
    for where, names in sources:
        owned = sorted(set(names) & set(contract.SHARED_GPU_ENV))
        if owned:
            raise InvalidSpec(
                f"{where} sets {', '.join(owned)}: with spec.gpuSharing trainwave sets these "
                "to pin the worker to its placed GPU and hold it to its budget; remove them"
            )


def _pruned(job: TrainingJob) -> TrainingJob:
    """The job with nulls dropped from its pod template, as the API server stores it
    (a body from elsewhere, `trainwave plan`'s file, may still carry them)."""
    spec = without_nulls(job.spec.template.spec)
    if spec == job.spec.template.spec:
        return job
    template = job.spec.template.model_copy(update={"spec": spec})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"template": template})})


# Pod fields trainwave owns; a template that sets them is refused rather than
# silently overridden, so the user learns why their value had no effect.
_OWNED_POD_FIELDS = {
    "hostname": "trainwave sets it to '<job>-worker-<rank>' for the rendezvous",
    "subdomain": "trainwave sets it to the job's headless Service",
}
_TEMPLATE = "spec.template.spec"


def check_template(job: TrainingJob) -> None:
    """Raise InvalidSpec for what the schema cannot see inside spec.template.spec:
    a field of the wrong type (api/podspec.py), a field trainwave owns, reserved env."""
    spec = job.spec.template.spec
    problem = shape_problem(spec, POD_SPEC, _TEMPLATE)
    if problem:
        raise InvalidSpec(problem)
    for key, why in _OWNED_POD_FIELDS.items():
        if key in spec:
            raise InvalidSpec(f"{_TEMPLATE}.{key} must not be set: {why}")
    policy = spec.get("restartPolicy", "Never")
    if policy != "Never":
        raise InvalidSpec(
            f"{_TEMPLATE}.restartPolicy is {policy!r}; accepted: 'Never' or unset "
            "(trainwave restarts the whole gang itself, see runPolicy.failurePolicy)"
        )
    runtime = job.spec.runtime
    if runtime is not None and runtime.enabled and not job.spec.command:
        raise InvalidSpec(
            "spec.command must be set when spec.runtime is enabled: the launcher wraps it"
        )
    for index, container in enumerate(spec.get("containers", [])):
        if not container.get("name"):
            raise InvalidSpec(
                f"{_TEMPLATE}.containers[{index}].name must be set: trainwave finds the "
                f"'{contract.WORKER_CONTAINER}' container by name"
            )
        where = f"{_TEMPLATE}.containers[{container['name']}].env"
        names = {e.get("name") for e in container.get("env", [])}
        reserved = sorted(names & set(contract.RESERVED_ENV))
        if reserved:
            raise InvalidSpec(
                f"{where} sets {', '.join(reserved)}: trainwave reserves these names for the "
                "torch rendezvous"
            )


def gang_request(job: TrainingJob, levels: Sequence[str]) -> GangRequest:
    placement = job.spec.placement
    parallelism = None
    if placement.parallelism is not None:
        parallelism = Parallelism(
            tensor=placement.parallelism.tensor, pipeline=placement.parallelism.pipeline
        )
    # By default keep the gang in one domain of the level above hosts (a rack)
    # when one has room; a user may ask for another level or require one.
    preferred = placement.preferred_level
    configured = [level for level in levels if level != HOSTNAME_LABEL]
    if preferred is None and configured and placement.required_level is None:
        preferred = configured[-1]
    return GangRequest(
        name=job.metadata.name,
        workers=job.spec.workers,
        gpus_per_worker=job.spec.gpus_per_worker,
        required_level=placement.required_level,
        preferred_level=preferred,
        parallelism=parallelism,
        node_selector={
            **dict(job.spec.template.spec.get("nodeSelector") or {}),
            **network_requirements(job.spec.network),
        },
    )
