"""`trainwave logs`: read a gang's worker logs through the API server, one thread per pod.

The API server fetches each log from the pod's kubelet, so this needs only
`pods/log` on the job's namespace. Lines go to `out` prefixed with their rank;
the previous attempt's failed worker (finished, so its log is whole) is
printed first, then the current workers' lines in the order they arrive.
Without --follow every worker's log is printed as one block in rank order:
interleaving finished logs would only scramble them.
"""

import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainwave import contract
from trainwave.lifecycle.logsources import LogSource, NoLogs, choose_sources, prefixed

__all__ = ["LogRequest", "NoLogs", "current_namespace", "gather_sources", "print_logs"]
from trainwave.lifecycle.observed import WorkerPod, observe_pod

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# How often a followed worker whose container has not started yet is looked at again.
WAITING_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class LogRequest:
    namespace: str
    job: str
    attempt: int | None = None
    rank: int | None = None
    follow: bool = False


def current_namespace() -> str:
    """The namespace a bare `kubectl` would use: the in-cluster one, the context's, default."""
    try:
        return Path(IN_CLUSTER_NAMESPACE).read_text().strip()
    except OSError:
        pass
    try:
        _, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def gather_sources(api: client.ApiClient, request: LogRequest) -> list[LogSource]:
    """The job and its worker pods, read once, through `choose_sources`."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    body = _read_job(custom, request)
    selector = (
        f"{contract.LABEL_JOB_NAME}={request.job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    )
    listing: Any = core.list_namespaced_pod(
        request.namespace, label_selector=selector, _preload_content=False
    )
    uid = body["metadata"]["uid"]
    pods = [p for p in map(observe_pod, json.loads(listing.data)["items"]) if p is not None]
    # A job deleted and created again under the same name may still have old pods around.
    own: list[WorkerPod] = [p for p in pods if p.owner_uid == uid]
    status = body.get("status") or {}
    return choose_sources(
        request.job,
        int(status.get("attempt") or 0),
        int(body["spec"]["workers"]),
        own,
        attempt=request.attempt,
        rank=request.rank,
    )


def print_logs(
    api: client.ApiClient, request: LogRequest, sources: list[LogSource], out: TextIO, err: TextIO
) -> int:
    """Print every source's log; 0 when all were read, 1 when some could not be."""
    core = client.CoreV1Api(api)
    failures = 0
    previous = [s for s in sources if s.previous]
    current = [s for s in sources if not s.previous]
    for source in previous:
        code = "" if source.exit_code is None else f", exit code {source.exit_code}"
        why = f"{source.reason or 'Failed'}{code}"
        print(
            f"attempt {source.attempt} failed first at rank {source.rank} ({why}); "
            "its log comes first",
            file=err,
        )
    ordered = [*previous, *([] if request.follow else current)]
    lines: queue.Queue[tuple[LogSource, str | None, str | None]] = queue.Queue()
    # Every log is fetched at once; without follow they are printed one whole block at a time.
    for source in ordered if not request.follow else previous:
        _spawn(core, request, source, lines)
    failures += _drain(lines, ordered, out, err, merged=False)
    if request.follow:
        for source in current:
            _spawn(core, request, source, lines)
        failures += _drain(lines, current, out, err, merged=True)
    return 1 if failures else 0


def _drain(
    lines: "queue.Queue[tuple[LogSource, str | None, str | None]]",
    sources: list[LogSource],
    out: TextIO,
    err: TextIO,
    *,
    merged: bool,
) -> int:
    """Print lines until every source has ended: as they arrive, or source by source."""
    pending = list(sources)
    held: dict[LogSource, list[str]] = {s: [] for s in sources}
    ended: set[LogSource] = set()
    failures = 0
    while pending:
        source, line, error = lines.get()
        if error is not None:  # the source's end marker follows
            failures += 1
            print(prefixed(source, error), file=err)
            continue
        if line is not None:
            if merged or source == pending[0]:
                print(prefixed(source, line), file=out, flush=merged)
            else:
                held[source].append(line)
            continue
        ended.add(source)
        # Blocks in order: once the head ends, release the next ones' held lines.
        while pending and pending[0] in ended:
            pending.pop(0)
            if pending and not merged:
                for kept in held.pop(pending[0]):
                    print(prefixed(pending[0], kept), file=out)
    out.flush()
    return failures


def _spawn(
    core: client.CoreV1Api, request: LogRequest, source: LogSource, lines: "queue.Queue[Any]"
) -> None:
    follow = request.follow and not source.previous

    def pump() -> None:
        try:
            for line in _read(core, request.namespace, source.pod, follow):
                lines.put((source, line, None))
        except ApiException as error:
            lines.put((source, None, _reason(error)))
        except Exception as error:  # a dropped connection: say so for this rank, keep the rest
            lines.put((source, None, f"log stream ended: {error}"))
        lines.put((source, None, None))

    threading.Thread(target=pump, name=f"logs-{source.pod}", daemon=True).start()


def _read(core: client.CoreV1Api, namespace: str, pod: str, follow: bool) -> Iterator[str]:
    if follow:
        _wait_for_start(core, namespace, pod)
    response: Any = core.read_namespaced_pod_log(
        pod, namespace, container=contract.WORKER_CONTAINER, follow=follow, _preload_content=False
    )
    try:
        yield from split_lines(response.stream(amt=None, decode_content=True))
    finally:
        response.release_conn()


def _wait_for_start(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    """Wait until the worker container has run: a follow asked earlier would end at once.

    The API server answers a log request for a pod without a node with an empty log,
    and the kubelet refuses one for a container that is still waiting to start.
    """
    while True:
        body: Any = core.read_namespaced_pod(pod, namespace, _preload_content=False)
        statuses = (json.loads(body.data).get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            state = status.get("state") or {}
            if status.get("name") == contract.WORKER_CONTAINER and (
                "running" in state or "terminated" in state
            ):
                return
        time.sleep(WAITING_RETRY_SECONDS)


def split_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of a byte stream as they complete; a last line without a newline too."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
    if buffer:
        yield buffer.decode(errors="replace")


def _read_job(custom: client.CustomObjectsApi, request: LogRequest) -> dict[str, Any]:
    try:
        response: Any = custom.get_namespaced_custom_object(
            contract.GROUP,
            contract.VERSION,
            request.namespace,
            contract.PLURAL,
            request.job,
            _preload_content=False,
        )
    except ApiException as error:
        if error.status != 404:
            raise
        listing: Any = custom.list_namespaced_custom_object(
            contract.GROUP,
            contract.VERSION,
            request.namespace,
            contract.PLURAL,
            _preload_content=False,
        )
        names = sorted(item["metadata"]["name"] for item in json.loads(listing.data)["items"])
        there = ", ".join(names) if names else "none"
        raise NoLogs(
            f"no TrainingJob {request.job} in namespace {request.namespace} (jobs there: {there})"
        ) from None
    body: dict[str, Any] = json.loads(response.data)
    return body


def _reason(error: ApiException) -> str:
    """The Status message the API server (or the kubelet behind it) gave."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return f"HTTP {error.status}: {error.reason}"
