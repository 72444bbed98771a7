"""Read each running worker's runtime status (GET /status) and wake its job's reconcile.

The runtime's launcher serves its worker's doctor report and progress on the
status port (runtime/launcher/status.py); the operator pulls, like a Prometheus scrape,
so workers need no API credentials and no RBAC at all. Only pod IPs inside
`networks` are contacted (the chart's `runtime.statusNetworks`): an operator
never connects to addresses outside the pod network it was told about.
Reports live in memory; after an operator restart they are simply fetched again.

Workers run tenants' code, so the channel trusts nothing it is sent:
- reads run in their own small thread pool, never the executor the API calls
  share, each within one total deadline and a byte cap, and redirects are not
  followed (controller/fetching.py): a slow or huge worker costs one pool
  thread for at most `deadline` seconds and other jobs' reads go on;
- every answer must be signed with the asked job's key over the identity the
  operator asked for (namespace, job, attempt, rank) and a fresh nonce
  (trainwave/signatures.py), and the body must name that same identity: one job
  cannot write another's progress or RDMAVerified, even from the same IP.
What a job's own code says about itself is still believed: it holds its key.
"""

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainwave import contract, signatures
from trainwave.api.trainingjob import JobKey
from trainwave.controller import metrics
from trainwave.controller.fetching import FetchError, fetch
from trainwave.lifecycle.reports import WorkerReport, read_report

logger = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
ANY_NETWORK: tuple[Network, ...] = (
    ipaddress.ip_network("0.0.0.0/0"),
    ipaddress.ip_network("::/0"),
)
# A doctor report and a progress line are a few KiB; 1 MiB leaves room and
# bounds the operator's memory at pool size x 1 MiB however many jobs lie.
MAX_REPORT_BYTES = 1 << 20


@dataclass(frozen=True)
class Targets:
    attempt: int
    workers: Mapping[int, tuple[str, int]]  # rank -> (pod IP, status port)
    key: bytes = field(default=b"", repr=False)  # the job's status key; never logged


class Untrusted(Exception):
    """A report that arrived but cannot be trusted as the asked worker's own."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome


class StatusPoller:
    def __init__(
        self,
        wake: Callable[[JobKey], None],
        *,
        networks: Sequence[Network] = ANY_NETWORK,
        interval: float = 15.0,
        deadline: float = 2.0,
        pool_size: int = 8,
        max_bytes: int = MAX_REPORT_BYTES,
    ):
        self._wake = wake
        self._networks = tuple(networks)
        self._interval = interval
        self._deadline = deadline
        self._pool_size = pool_size
        self._max_bytes = max_bytes
        self._targets: dict[JobKey, Targets] = {}
        self._reports: dict[JobKey, tuple[int, dict[int, WorkerReport]]] = {}
        # The last refusal logged per worker, so a lying worker is one WARNING, not one a poll.
        self._refusals: dict[tuple[JobKey, int], str] = {}
        self._event = asyncio.Event()

    def track(self, key: JobKey, targets: Targets) -> None:
        allowed = {r: t for r, t in targets.workers.items() if self._allowed(t[0])}
        targets = Targets(targets.attempt, allowed, targets.key)
        if self._targets.get(key) != targets:
            new_workers = key not in self._targets or self._targets[key].workers != allowed
            self._targets[key] = targets
            if new_workers:
                self._event.set()  # fetch a new gang's reports now, not in a full interval

    def forget(self, key: JobKey) -> None:
        self._targets.pop(key, None)
        self._reports.pop(key, None)
        for worker in [w for w in self._refusals if w[0] == key]:
            del self._refusals[worker]

    def reports(self, key: JobKey, attempt: int) -> dict[int, WorkerReport]:
        found = self._reports.get(key)
        return dict(found[1]) if found and found[0] == attempt else {}

    async def run(self) -> None:
        # Its own pool: a read that hangs to its deadline holds one of these threads,
        # never one the reconciles need for API calls.
        pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="status")
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), timeout=self._interval)
                self._event.clear()
                # Every job at once: one slow job's workers must not hold back the others.
                await asyncio.gather(
                    *(self._poll(pool, key, t) for key, t in list(self._targets.items()))
                )
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _poll(self, pool: ThreadPoolExecutor, key: JobKey, targets: Targets) -> None:
        try:
            await self._poll_job(pool, key, targets)
        except Exception:
            logger.exception("%s/%s: reading worker status failed", *key)

    async def _poll_job(self, pool: ThreadPoolExecutor, key: JobKey, targets: Targets) -> None:
        loop = asyncio.get_running_loop()
        ranks = sorted(targets.workers)
        documents = await asyncio.gather(
            *(loop.run_in_executor(pool, self._read, key, targets, r) for r in ranks)
        )
        fresh = {r: report for r, d in zip(ranks, documents, strict=True) if (report := d)}
        if not fresh or self._targets.get(key) != targets:
            return
        old = self._reports.get(key)
        merged = dict(old[1]) if old and old[0] == targets.attempt else {}
        merged.update(fresh)
        if old is None or old != (targets.attempt, merged):
            self._reports[key] = (targets.attempt, merged)
            self._wake(key)

    def _read(self, key: JobKey, targets: Targets, rank: int) -> WorkerReport | None:
        """One worker's report, or None; every outcome is counted, refusals logged once."""
        address, port = targets.workers[rank]
        identity = signatures.Identity(key[0], key[1], targets.attempt, rank)
        try:
            report = self._fetch(identity, address, port, targets.key)
        except FetchError as error:
            metrics.STATUS_READS.labels(error.outcome).inc()
            logger.debug("%s/%s rank %d at %s:%d: %s", *key, rank, address, port, error)
            return None
        except Untrusted as untrusted:
            metrics.STATUS_READS.labels(untrusted.outcome).inc()
            if self._refusals.get((key, rank)) != untrusted.outcome:
                self._refusals[(key, rank)] = untrusted.outcome
                logger.warning(
                    "%s/%s rank %d at %s:%d: report refused: %s",
                    *key, rank, address, port, untrusted,
                )  # fmt: skip
            return None
        metrics.STATUS_READS.labels("ok").inc()
        self._refusals.pop((key, rank), None)
        return report

    def _fetch(
        self, identity: signatures.Identity, address: str, port: int, key: bytes
    ) -> WorkerReport:
        nonce = signatures.new_nonce()
        fetched = fetch(
            address,
            port,
            contract.STATUS_PATH,
            {contract.STATUS_NONCE_HEADER: nonce},
            deadline=self._deadline,
            max_bytes=self._max_bytes,
        )
        signature = fetched.headers.get(contract.STATUS_SIGNATURE_HEADER.lower())
        if not signature:
            raise Untrusted("unsigned", "not signed (a runtime without the job's status key?)")
        if not key or not signatures.verify(key, identity, nonce, fetched.body, signature):
            raise Untrusted("forged", "signature does not match this job's key and identity")
        try:
            document = json.loads(fetched.body)
        except ValueError as error:
            raise Untrusted("malformed", f"not JSON: {error}") from None
        if not isinstance(document, dict) or (report := read_report(document)) is None:
            raise Untrusted("malformed", "not a status document")
        claimed = _claimed(document)
        asked = (identity.namespace, identity.job, identity.attempt, identity.rank)
        if claimed != asked:
            raise Untrusted("wrong_identity", f"speaks for {claimed}, asked {asked}")
        return report

    def _allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)


def _claimed(document: Mapping[str, Any]) -> tuple[Any, ...]:
    """(namespace, job, attempt, node rank) as the report states them."""
    return tuple(document.get(k) for k in ("namespace", "job", "attempt", "node_rank"))


def parse_networks(text: str) -> tuple[Network, ...]:
    """'10.0.0.0/8,fd00::/8' -> networks; empty -> any address."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        return ANY_NETWORK
    try:
        return tuple(ipaddress.ip_network(p, strict=False) for p in parts)
    except ValueError as error:
        raise ValueError(
            f"--status-networks: {error}; expected comma-separated CIDRs such as 10.0.0.0/8"
        ) from None
