"""A watch-backed store of one kind of object: list once, then follow a watch.

This is client-go's reflector (tools/cache/reflector.go) cut down to what the
placement caches need:

- one paginated LIST (`limit` + `continue`, like the reflector's pager) gives the
  store and the resourceVersion the list was served at;
- a WATCH from that resourceVersion delivers every later change, with
  `allowWatchBookmarks` so the server moves our resourceVersion forward even when
  nothing we watch changes, and a server-side timeout after which the watch is
  simply resumed from the last resourceVersion (no relist);
- a watch that fails - 410 Gone when our resourceVersion was compacted away, or
  any other error - is followed by a fresh LIST that REPLACES the store (the
  reflector's `syncWith`/`Replace`), so objects deleted during the gap vanish.
  kopf's indexes never relist, which is why the placer does not use them.

Events are read as JSON lines off the raw response (`_preload_content=False`):
kubernetes.watch.Watch deserializes every object into model classes, which costs
more than the whole placement round at thousands of pods. Only a converter's
record (a few fields) is kept of each object.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

from trainwave.backoff import Backoff

logger = logging.getLogger(__name__)

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)
Converter = Callable[[Mapping[str, Any]], R | None]  # raw object -> record; None: keep nothing
Lister = Callable[..., Any]  # a list call of the official client, e.g. CoreV1Api.list_node

PAGE_SIZE = 500  # the reflector's default page size
WATCH_SECONDS = 300  # server-side watch timeout; the reflector picks 5-10 min
CONNECT_SECONDS = 10.0
LIST_SECONDS = 60.0  # one page of 500 objects; a stuck LIST must not block stop() forever
# Failed watches in a row: relist after 1, 2, 4 ... 30 s, each up to a tenth longer at
# random so informers that lost the same API server do not all relist at once. (The
# reflector jitters by up to 100%; a tenth keeps the longest wait near 30 s.)
RELIST_BACKOFF = Backoff(base=1.0, cap=30.0, jitter=0.1)


class Store(Protocol[R_contra]):
    """Where an informer writes; the caller's lock, if any, is inside these."""

    def replace(self, records: Mapping[str, R_contra]) -> None: ...

    def put(self, key: str, record: R_contra | None) -> None:
        """Add or update `key`; None removes it."""


class LockedDict(Generic[R]):
    """A Store that keeps every record by key, each write under `lock`; readers of
    `records` take the same lock."""

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self.records: dict[str, R] = {}

    def replace(self, records: Mapping[str, R]) -> None:
        with self._lock:
            self.records = dict(records)

    def put(self, key: str, record: R | None) -> None:
        with self._lock:
            if record is None:
                self.records.pop(key, None)
            else:
                self.records[key] = record


class Expired(Exception):
    """The watch's resourceVersion is gone (410): only a relist can continue."""


def object_key(obj: Mapping[str, Any]) -> str:
    """client-go's MetaNamespaceKeyFunc: `namespace/name`, or `name` for cluster objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def list_records(
    lister: Lister, convert: Converter[R], page_size: int = PAGE_SIZE
) -> tuple[dict[str, R], str]:
    """Every object, page by page, as records; and the resourceVersion to watch from.

    Each page is converted before the next is read, so the raw objects of at most
    one page are in memory at a time.
    """
    records: dict[str, R] = {}
    token = ""
    while True:
        kwargs: dict[str, Any] = {
            "limit": page_size,
            "_preload_content": False,
            "_request_timeout": (CONNECT_SECONDS, LIST_SECONDS),
        }
        if token:
            kwargs["_continue"] = token
        response = lister(**kwargs)
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        for obj in body.get("items") or ():
            record = convert(obj)
            if record is not None:
                records[object_key(obj)] = record
        meta = body.get("metadata") or {}
        token = meta.get("continue") or ""
        if not token:
            return records, str(meta.get("resourceVersion") or "")


def watch_lines(response: Any) -> Iterator[tuple[str, bool]]:
    """The JSON lines of a streamed watch response, each with whether more lines were
    already buffered behind it (so a burst can be applied before anyone is told)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for position, line in enumerate(lines):
            if line.strip():
                yield line.decode(), position < len(lines) - 1
    if pending.strip():
        yield pending.decode(), False


class Informer(Generic[R]):
    """List, then watch, one kind of object into `store`, in a daemon thread."""

    def __init__(
        self,
        kind: str,
        lister: Lister,
        convert: Converter[R],
        store: Store[R],
        *,
        on_change: Callable[[], None] = lambda: None,
        on_deleted: Callable[[R], None] | None = None,
        page_size: int = PAGE_SIZE,
        watch_seconds: int = WATCH_SECONDS,
    ):
        self.kind = kind
        self._lister = lister
        self._convert = convert
        self._store = store
        self._on_change = on_change
        self._on_deleted = on_deleted
        self._page_size = page_size
        self._watch_seconds = watch_seconds
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._relist = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._delivered = False  # the current watch has read at least one event
        self.resource_version = ""
        self.lists = 0  # LISTs that replaced the store
        self.events = 0  # watch events applied (bookmarks not counted)
        self.errors = 0

    @property
    def relists(self) -> int:
        """LISTs after the first: each one follows a failed or expired watch."""
        return max(0, self.lists - 1)

    def start(self) -> None:
        """Start (or restart after stop) the thread; it always begins with a LIST."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def force_relist(self) -> None:
        """End the current watch and list again, as after a 410."""
        self._relist.set()
        self._interrupt()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether the first LIST has filled the store (client-go's HasSynced)."""
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def _interrupt(self) -> None:
        # shutdown() wakes a thread blocked reading the socket; close() alone does not.
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # it may be closing on its own already
                response.shutdown()

    def _run(self) -> None:
        failures = 0  # in a row; a watch that delivered anything was healthy
        need_list = True
        while not self._stop.is_set():
            self._delivered = False
            try:
                if need_list or self._relist.is_set():
                    self._relist.clear()
                    self._list()
                    need_list = False
                self._watch()  # returns when the server ends the watch: resume, no relist
                failures = 0
            except Exception as error:  # never die silently: log, back off, relist
                if self._stop.is_set():
                    break
                if self._relist.is_set():
                    continue  # force_relist interrupted the watch on purpose
                need_list = True
                failures = 1 if self._delivered else failures + 1
                if isinstance(error, Expired) and failures == 1:
                    # A 410 is routine (etcd compaction): relist at once, like the reflector.
                    logger.info("%s watch expired (%s); relisting", self.kind, error)
                    continue
                self.errors += 1
                delay = RELIST_BACKOFF.delay(failures)
                logger.warning(
                    "%s informer: %s; relisting in %.0fs", self.kind, error, delay, exc_info=True
                )
                self._stop.wait(delay)

    def _list(self) -> None:
        records, version = list_records(self._lister, self._convert, self._page_size)
        self._store.replace(records)
        self.resource_version = version
        self.lists += 1
        self._synced.set()
        logger.debug("%s listed: %d at resourceVersion %s", self.kind, len(records), version)
        self._on_change()

    def _watch(self) -> None:
        response = self._lister(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_seconds,
            _preload_content=False,
            _request_timeout=(CONNECT_SECONDS, self._watch_seconds + 30),
        )
        self._response = response
        try:
            if self._stop.is_set() or self._relist.is_set():
                return  # asked to stop while connecting; the interrupt found no response
            changed = False
            for line, more in watch_lines(response):
                changed |= self.apply(json.loads(line))
                self._delivered = True  # after apply: an ERROR line is no sign of health
                if changed and not more:
                    self._on_change()  # once per burst, not once per event
                    changed = False
                if self._stop.is_set() or self._relist.is_set():
                    return
        finally:
            self._response = None
            response.release_conn()

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event to the store; whether the store changed."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(obj.get("message", "410 Gone"))
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = str(version or self.resource_version)
            return False
        if kind == "DELETED":
            # Also how a field-selector watch reports an object that stopped matching
            # (a pod that Succeeded or Failed): it left our set, so it goes.
            if self._on_deleted is not None:
                last = self._convert(obj)  # its final state, which the store forgets
                if last is not None:
                    self._on_deleted(last)
            self._store.put(object_key(obj), None)
        elif kind in ("ADDED", "MODIFIED"):
            self._store.put(object_key(obj), self._convert(obj))
        else:
            logger.warning("%s watch: unknown event type %r ignored", self.kind, kind)
            return False
        if version:
            self.resource_version = str(version)
        self.events += 1
        return True
