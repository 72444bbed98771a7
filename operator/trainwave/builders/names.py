"""Deterministic names of a job's children.

Pure. Names are functions of (job, rank, attempt, replacement serial) only, all
read from the job and its status, so a restarted operator computes the same names
and cannot create a second copy of a worker.
"""


def service_name(job: str, attempt: int) -> str:
    """The headless Service of one attempt, whose name is the workers' DNS subdomain.

    A recreated gang gets names nobody has looked up: cluster DNS caches an answer for
    its TTL (30 s with kubeadm's CoreDNS `cache 30` and `ttl 30`), so under the old
    names a gang recreated soon after it started found rank 0's old address, and waited
    for the cache (10-15 s of a 21-24 s recreation on the real node,
    docs/benchmarks/faults.md).
    The first attempt keeps the job's own name. At most 51 + 2 + 10 digits: a DNS-1035
    label (<= 63) for any attempt below 10^10.
    """
    return f"{job}-a{attempt}" if attempt else job


def worker_hostname(job: str, rank: int) -> str:
    return f"{job}-worker-{rank}"


def worker_pod_name(job: str, rank: int, attempt: int, serial: int = 0) -> str:
    # The attempt is part of the name so a restarted gang never waits for, or
    # collides with, the terminating pods of the gang before it; a worker replaced
    # alone adds its replacement's serial (status.replacements.pending) for the same
    # reason: its new pod is created while the old one still terminates.
    base = f"{job}-a{attempt}-worker-{rank}"
    return f"{base}-r{serial}" if serial else base


def master_address(job: str, attempt: int) -> str:
    """Rank 0's DNS name through the headless Service; the search path adds the rest."""
    return worker_address(job, 0, attempt)


def worker_address(job: str, rank: int, attempt: int) -> str:
    """A worker's DNS name through the headless Service (its PET_LOCAL_ADDR)."""
    return f"{worker_hostname(job, rank)}.{service_name(job, attempt)}"


def worker_address_template(job: str, attempt: int) -> str:
    """worker_address with `{rank}` for the rank, for the launcher to format."""
    return worker_address(job, 0, attempt).replace("-worker-0.", "-worker-{rank}.", 1)


def status_key_secret(job: str, uid: str) -> str:
    # The UID is part of the name: a job deleted and created again under its old
    # name must not find (and mount) the old job's Secret before GC removes it.
    return f"{job}-status-key-{uid[:8]}"
