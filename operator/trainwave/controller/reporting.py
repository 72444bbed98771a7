"""Read each running worker's runtime status (GET /status) and wake its job's reconcile.

The runtime's launcher serves its worker's doctor report and progress on the
status port (runtime/status.py); the operator pulls, like a Prometheus scrape,
so workers need no API credentials and no RBAC at all. Only pod IPs inside
`networks` are contacted (the chart's `runtime.statusNetworks`): an operator
never connects to addresses outside the pod network it was told about.
Reports live in memory; after an operator restart they are simply fetched again.
"""

import asyncio
import contextlib
import ipaddress
import json
import logging
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainwave import contract
from trainwave.lifecycle.reports import WorkerReport, read_report

logger = logging.getLogger(__name__)

JobKey = tuple[str, str]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
ANY_NETWORK: tuple[Network, ...] = (
    ipaddress.ip_network("0.0.0.0/0"),
    ipaddress.ip_network("::/0"),
)


@dataclass(frozen=True)
class Targets:
    attempt: int
    workers: Mapping[int, tuple[str, int]]  # rank -> (pod IP, status port)


class StatusPoller:
    def __init__(
        self,
        wake: Callable[[JobKey], None],
        *,
        networks: Sequence[Network] = ANY_NETWORK,
        interval: float = 15.0,
        timeout: float = 2.0,
    ):
        self._wake = wake
        self._networks = tuple(networks)
        self._interval = interval
        self._timeout = timeout
        self._targets: dict[JobKey, Targets] = {}
        self._reports: dict[JobKey, tuple[int, dict[int, WorkerReport]]] = {}
        self._event = asyncio.Event()

    def track(self, key: JobKey, targets: Targets) -> None:
        allowed = {r: t for r, t in targets.workers.items() if self._allowed(t[0])}
        targets = Targets(targets.attempt, allowed)
        if self._targets.get(key) != targets:
            new_workers = key not in self._targets or self._targets[key].workers != allowed
            self._targets[key] = targets
            if new_workers:
                self._event.set()  # fetch a new gang's reports now, not in a full interval

    def forget(self, key: JobKey) -> None:
        self._targets.pop(key, None)
        self._reports.pop(key, None)

    def reports(self, key: JobKey, attempt: int) -> dict[int, WorkerReport]:
        found = self._reports.get(key)
        return dict(found[1]) if found and found[0] == attempt else {}

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=self._interval)
            self._event.clear()
            for key, targets in list(self._targets.items()):
                try:
                    await self._poll(key, targets)
                except Exception:
                    logger.exception("%s/%s: reading worker status failed", *key)

    async def _poll(self, key: JobKey, targets: Targets) -> None:
        ranks = sorted(targets.workers)
        documents = await asyncio.gather(
            *(asyncio.to_thread(self._fetch, *targets.workers[r]) for r in ranks)
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

    def _fetch(self, address: str, port: int) -> WorkerReport | None:
        host = f"[{address}]" if ":" in address else address
        url = f"http://{host}:{port}{contract.STATUS_PATH}"
        try:
            with urllib.request.urlopen(url, timeout=self._timeout) as response:
                document = json.loads(response.read())
        except (OSError, ValueError) as error:
            logger.debug("status %s: %s", url, error)
            return None
        return read_report(document) if isinstance(document, dict) else None

    def _allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)


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
