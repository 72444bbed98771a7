"""Wakes the agent's pass when one of its ResourceSlices is deleted: the kubelet deletes them.

A kubelet (v1.34.4 DRAPluginManager) deletes every ResourceSlice of its node when it
starts, so that pods do not wait on drivers that may never come back, and a driver's
slices when its plugin stays unregistered for 30 s. It does so in the background, with
a backoff while it waits for its Node, so the delete can come after the agent's plugin
has registered again and the agent has published. Seen on the real node: after a kubelet
restart the slices were gone until the next pass (`--interval`, 60 s in the chart), and
no shared worker's claim could be allocated meanwhile. Upstream's kubelet plugin helper
keeps its slices with an informer; the agent publishes in passes, so this watch only
starts the next pass at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from trainwave.contract import DRA_DRIVER

logger = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server ends each watch after this; the next resumes from its version
MAX_BACKOFF = 60.0


class SliceWatch:
    def __init__(
        self, resources: client.ResourceV1Api, node_name: str, wake: Callable[[], None]
    ) -> None:
        self.resources = resources
        self.node_name = node_name
        self.wake = wake
        self._version: str | None = None

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="slice-watch", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop`; a failed watch is logged and tried again, never fatal."""
        backoff = 1.0
        while not stop.is_set():
            try:
                self.watch_once(stop)
                backoff = 1.0
            except ApiException as error:
                if error.status == 410:  # our version is too old: start from now
                    self._version = None
                    continue
                self._retry_later(stop, f"{error.status} {error.reason}", backoff)
                backoff = min(2 * backoff, MAX_BACKOFF)
            except Exception as error:  # the API server away, a broken stream: try again
                self._retry_later(stop, str(error), backoff)
                backoff = min(2 * backoff, MAX_BACKOFF)

    def watch_once(self, stop: threading.Event) -> None:
        # Events carry plain dicts (raw_object): no client model drops fields it predates.
        stream: Any = watch.Watch(return_type="object")  # type: ignore[no-untyped-call]
        kwargs: dict[str, Any] = {
            "field_selector": f"spec.nodeName={self.node_name},spec.driver={DRA_DRIVER}",
            "timeout_seconds": WATCH_SECONDS,
            "_request_timeout": WATCH_SECONDS + 30,
        }
        if self._version is not None:
            kwargs["resource_version"] = self._version
        for event in stream.stream(self.resources.list_resource_slice, **kwargs):
            if stop.is_set():
                stream.stop()
                return
            body = event["raw_object"]
            if event["type"] == "ERROR":  # a Status: 410 when our version is too old
                raise ApiException(status=body.get("code"), reason=body.get("message"))
            self._version = (body.get("metadata") or {}).get("resourceVersion") or self._version
            if event["type"] == "DELETED":
                name = (body.get("metadata") or {}).get("name")
                logger.info("node=%s ResourceSlice %s deleted: publishing again", self.node_name,
                            name)  # fmt: skip
                self.wake()

    def _retry_later(self, stop: threading.Event, why: str, seconds: float) -> None:
        logger.warning("node=%s ResourceSlice watch: %s; again in %.0f s", self.node_name, why,
                       seconds)  # fmt: skip
        stop.wait(seconds)
