"""Deterministic names of a job's children.

Pure. Names are functions of (job, rank, attempt) only, so a restarted
operator computes the same names and cannot create a second copy of a worker.
"""


def service_name(job: str) -> str:
    return job


def worker_hostname(job: str, rank: int) -> str:
    return f"{job}-worker-{rank}"


def worker_pod_name(job: str, rank: int, attempt: int) -> str:
    # The attempt is part of the name so a restarted gang never waits for, or
    # collides with, the terminating pods of the gang before it.
    return f"{job}-a{attempt}-worker-{rank}"


def master_address(job: str) -> str:
    """Rank 0's DNS name through the headless Service; the search path adds the rest."""
    return f"{worker_hostname(job, 0)}.{service_name(job)}"


def status_key_secret(job: str, uid: str) -> str:
    # The UID is part of the name: a job deleted and created again under its old
    # name must not find (and mount) the old job's Secret before GC removes it.
    return f"{job}-status-key-{uid[:8]}"
