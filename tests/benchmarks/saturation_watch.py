"""The saturation benchmark's own watches: per pod, when each stage was first seen (sub-second,
unlike the API's 1 s timestamps), and per TrainingJob, when its status said the queue held it.

Both are threads on one plain HTTPS watch each (list, then watch from its resourceVersion,
again after a dropped connection), timed with this process's clock in seconds after `t0`.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

from cluster.components import Layout
from cluster.controlplane import Cluster
from trainwave import contract


class Watch(threading.Thread):
    """One watch on a collection of the namespace; `_record` sees each event with the time
    it arrived (seconds after `t0`, this process's clock)."""

    def __init__(self, cluster: Cluster, path: str, t0: float | None = None) -> None:
        super().__init__(daemon=True)
        pki = Layout(cluster.state_dir).pki
        url = urlsplit(cluster.server)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 6443
        self._context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._path = path
        self.t0 = t0 if t0 is not None else time.time()
        self.errors: list[str] = []
        self.restarts = 0

    def start(self) -> None:
        super().start()
        if not self._ready.wait(60):
            raise TimeoutError("pod watch did not start")

    def stop(self) -> None:
        self._stopping.set()

    def _request(self, path: str) -> http.client.HTTPResponse:
        connection = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=600
        )
        connection.request("GET", path, headers={"Accept": "application/json"})
        return connection.getresponse()

    def run(self) -> None:
        base = self._path
        listed = json.loads(self._request(base).read())
        version = listed["metadata"]["resourceVersion"]
        self._ready.set()
        while not self._stopping.is_set():
            try:
                response = self._request(
                    f"{base}?watch=1&resourceVersion={version}&timeoutSeconds=300"
                )
                while not self._stopping.is_set():
                    line = response.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        self.errors.append(str(event["object"].get("message")))
                        return
                    version = event["object"]["metadata"]["resourceVersion"]
                    self._record(event["type"], event["object"], time.time() - self.t0)
            except (OSError, http.client.HTTPException, ValueError) as error:
                self.restarts += 1
                self.errors.append(repr(error))
                time.sleep(0.2)

    def _record(self, kind: str, body: dict[str, Any], now: float) -> None:
        raise NotImplementedError


class PodWatch(Watch):
    """Per pod, when each stage was first seen; `job_label` names the pod's gang (the
    TrainingJob's label for trainwave, the Job's for the Kueue peer)."""

    def __init__(
        self, cluster: Cluster, namespace: str, job_label: str = contract.LABEL_JOB_NAME
    ) -> None:
        super().__init__(cluster, f"/api/v1/namespaces/{namespace}/pods")
        self._job_label = job_label
        self.pods: dict[str, dict[str, Any]] = {}

    def _record(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
        seen = self.pods.setdefault(
            meta["name"],
            {"job": meta.get("labels", {}).get(self._job_label, ""), "created": now},
        )
        if not spec.get("schedulingGates"):
            seen.setdefault("released", now)
        if spec.get("nodeName"):
            seen.setdefault("bound", now)
            seen["node"] = spec["nodeName"]
        phase = status.get("phase")
        if phase == "Running":
            seen.setdefault("running", now)
        if phase in ("Succeeded", "Failed") or kind == "DELETED":
            seen.setdefault("ended", now)
            seen.setdefault("phase", phase if kind != "DELETED" else "Deleted")


class HoldWatch(Watch):
    """Per job, when its status said the queue held it by policy: room kept for an earlier
    gang (bounded backfill) or a wait for one domain of its preferred level. Status writes
    follow the placer's decision within the pod-event batch (1 s), so these times are late
    by up to about that much."""

    HOLDS = ("HeldForEarlierJob", "WaitingForPreferredLevel")

    def __init__(self, cluster: Cluster, namespace: str, t0: float) -> None:
        super().__init__(
            cluster, f"/apis/{contract.API_VERSION}/namespaces/{namespace}/trainingjobs", t0
        )
        self.held: dict[str, list[tuple[float, str]]] = {}
        self.holders: dict[str, set[str]] = {}  # the gangs HeldForEarlierJob named
        self.protected_since: dict[str, float] = {}  # a named gang: first seen protected
        self.racks: dict[str, int] = {}  # racks the gang's placement summary names

    def _record(self, kind: str, job: dict[str, Any], now: float) -> None:
        condition = next(
            (c for c in job.get("status", {}).get("conditions", [])
             if c.get("type") == "Scheduled"),
            {},
        )  # fmt: skip
        reason, name = condition.get("reason", ""), job["metadata"]["name"]
        seen = self.held.setdefault(name, [])
        if not seen or seen[-1][1] != reason:
            seen.append((now, reason))  # every change: a hold is known until it ends
        holder = HOLDER.search(condition.get("message", "")) if reason == self.HOLDS[0] else None
        if holder:
            self.holders.setdefault(name, set()).add(holder.group(1))
            self.protected_since.setdefault(holder.group(1), now)
        racks = RACKS.search(job.get("status", {}).get("placement", {}).get("summary", ""))
        if racks:
            self.racks[name] = int(racks.group(1))


# placement/explain.py waiting_for: "waiting for <namespace>/<name>, which later jobs ..."
HOLDER = re.compile(r"waiting for [^/\s]+/([^,\s]+),")
# placement/gang.py Placement.describe: "... on 8 nodes, 2 racks (rack-00, rack-01), ..."
RACKS = re.compile(r"nodes?, (\d+) racks?\b")


class WorkloadWatch(Watch):
    """Per Kueue Workload, by the Job that owns it: when its quota was first seen reserved
    (QuotaReserved) and when it was first seen Finished (the quota is given back)."""

    CONDITIONS: ClassVar[dict[str, str]] = {"QuotaReserved": "admitted", "Finished": "finished"}

    def __init__(self, cluster: Cluster, api_version: str, namespace: str, t0: float) -> None:
        super().__init__(cluster, f"/apis/{api_version}/namespaces/{namespace}/workloads", t0)
        self.jobs: dict[str, dict[str, float]] = {}

    def _record(self, kind: str, workload: dict[str, Any], now: float) -> None:
        owners = workload["metadata"].get("ownerReferences") or [{}]
        seen = self.jobs.setdefault(owners[0].get("name", workload["metadata"]["name"]), {})
        for condition in workload.get("status", {}).get("conditions", []):
            stage = self.CONDITIONS.get(condition.get("type", ""))
            if stage and condition.get("status") == "True":
                seen.setdefault(stage, now)
