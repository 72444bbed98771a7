"""A watch-backed store of one kind of object: list once, then follow a watch.

This is client-go's reflector (k8s.io/client-go tools/cache/reflector.go) with
the informer around it (tools/cache/shared_informer.go, controller.go) cut down
to what trainwave's caches need:

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
- the handlers (`EventHandlers`, client-go's ResourceEventHandlerFuncs) hear of
  every change, a relist's included: an object the store held and the new LIST
  lacks is reported deleted as a `DeletedFinalStateUnknown` tombstone carrying the
  last state this informer saw, as DeltaFIFO.Replace (tools/cache/delta_fifo.go)
  does; listed objects are reported added or updated (processDeltas,
  tools/cache/controller.go).

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from trainwave.backoff import Backoff

logger = logging.getLogger(__name__)

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)
Converter = Callable[[Mapping[str, Any]], R | None]  # raw object -> record; None: keep nothing
Lister = Callable[..., Any]  # a list call of the official client, e.g. CoreV1Api.list_node

# Objects per LIST page. The reflector's default is 500; here each page is decoded whole
# (json.loads of its body) before it is converted, and 500 nodes with their inventory
# annotations decode to tens of MiB for a moment: the operator's peak RSS. 100 keeps
# that moment small for a few more requests at start (11 for 1,024 nodes).
PAGE_SIZE = 100
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


class StoreFuncs(Generic[R]):
    """A Store over two functions, each call under `lock` when one is given: how a
    cache that files records its own way (an index, a count per owner) takes an
    informer's writes. client-go's informer writes an Indexer; here the cache is one."""

    def __init__(
        self,
        replace: Callable[[Mapping[str, R]], None],
        put: Callable[[str, R | None], None],
        lock: threading.Lock | None = None,
    ):
        self._replace, self._put = replace, put
        self._lock: contextlib.AbstractContextManager[Any] = lock or contextlib.nullcontext()

    def replace(self, records: Mapping[str, R]) -> None:
        with self._lock:
            self._replace(records)

    def put(self, key: str, record: R | None) -> None:
        with self._lock:
            self._put(key, record)


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


@dataclass(frozen=True)
class DeletedFinalStateUnknown(Generic[R]):
    """client-go's tombstone (tools/cache/delta_fifo.go): an object a relist no longer
    lists, so it was deleted while no watch was open. `obj` is the last state this
    informer saw, not the final one: what happened to it in the gap (an eviction, an
    exit code) is not known."""

    key: str
    obj: R


# What a delete handler receives: the final state from a DELETED event, or a tombstone.
Deleted: TypeAlias = R | DeletedFinalStateUnknown[R]


def _ignore(*_: object) -> None:
    pass


@dataclass(frozen=True)
class EventHandlers(Generic[R]):
    """client-go's ResourceEventHandlerFuncs (tools/cache/controller.go), with the key
    passed along since a record need not carry its name. Called on the informer's
    thread: they must be cheap and thread-safe.

    Order: `on_add`/`on_update` after the store holds the record (as processDeltas
    updates the indexer, then calls the handler); `on_delete` BEFORE the store forgets
    it, so a handler that keeps a departed object's last state (departures.py) has it
    before any reader can find the object gone from the store."""

    on_add: Callable[[str, R], None] = _ignore
    on_update: Callable[[str, R, R], None] = _ignore  # key, old, new
    on_delete: Callable[[str, Deleted[R]], None] = _ignore


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


class Follower(Protocol):
    """What an InformerGroup is made of: an Informer, or NamespacedInformers."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def wait_synced(self, timeout: float | None = None) -> bool: ...

    def force_relist(self) -> None: ...


class InformerGroup:
    """Informers that start, stop, fill and relist together: a cache's (the jobs cache's
    jobs, pods and Services), or one kind's in each namespace. A subclass names them in
    `informers`; what is done to all of them is written once, here."""

    @property
    def informers(self) -> Sequence[Follower]:
        raise NotImplementedError

    def start(self) -> None:
        """Start (or restart after stop) each; each begins with a LIST that replaces what
        its store kept."""
        for informer in self.informers:
            informer.start()

    def stop(self, timeout: float = 5.0) -> None:
        for informer in self.informers:
            informer.stop(timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether every store was filled by a LIST (each within `timeout`)."""
        return all(informer.wait_synced(timeout) for informer in self.informers)

    def force_relist(self) -> None:
        for informer in self.informers:
            informer.force_relist()


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
        handlers: EventHandlers[R] | None = None,
        page_size: int = PAGE_SIZE,
        watch_seconds: int = WATCH_SECONDS,
    ):
        self.kind = kind
        self._lister = lister
        self._convert = convert
        self._store = store
        self._on_change = on_change
        self._handlers: EventHandlers[R] = handlers or EventHandlers()
        # client-go's knownObjects: what the store was given, by key, so a relist can
        # tell what vanished and hand on its last state. Kept across stop/start.
        self._known: dict[str, R] = {}
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
        known, handlers = self._known, self._handlers
        # Deleted in the gap: reported first, while the store still holds them.
        for key in known.keys() - records.keys():
            handlers.on_delete(key, DeletedFinalStateUnknown(key, known[key]))
        self._store.replace(records)
        self._known = dict(records)
        for key, record in records.items():
            old = known.get(key)
            if old is None:
                handlers.on_add(key, record)
            else:
                handlers.on_update(key, old, record)  # client-go's Replaced: maybe unchanged
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
        key = object_key(obj)
        if kind == "DELETED":
            # Also how a field-selector watch reports an object that stopped matching
            # (a pod that Succeeded or Failed): it left our set, so it goes.
            self._forget(key, self._convert(obj))  # its final state, which the store forgets
        elif kind in ("ADDED", "MODIFIED"):
            record = self._convert(obj)
            if record is None:
                self._forget(key, None)  # no longer one we keep: it left our set
            else:
                old = self._known.get(key)
                self._store.put(key, record)
                self._known[key] = record
                if old is None:
                    self._handlers.on_add(key, record)
                else:
                    self._handlers.on_update(key, old, record)
        else:
            logger.warning("%s watch: unknown event type %r ignored", self.kind, kind)
            return False
        if version:
            self.resource_version = str(version)
        self.events += 1
        return True

    def _forget(self, key: str, final: R | None) -> None:
        """Drop `key`, telling the delete handler first: its final state if the event
        had one we keep, else the last state the store was given."""
        last = final if final is not None else self._known.get(key)
        if last is not None:
            self._handlers.on_delete(key, last)
        self._store.put(key, None)
        self._known.pop(key, None)
