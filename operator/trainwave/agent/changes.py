"""What the agent wants on its Node, and the patches that get it there from what is.

Pure: `diff_node` compares a Node as the API server returned it (a JSON
mapping) with a `DesiredNode` and returns two JSON merge patches, one for the
node and one for its status subresource, plus one `Change` per key that
moves. Nothing changed means both patches are empty and nothing is sent.

Ownership rules, so the agent can share a Node with the kubelet, GPU feature
discovery and cluster admins:
- labels: the agent sets its own; it removes only keys it published itself
  before (recorded in `ANNOTATION_AGENT_LABELS`), so a label someone else set
  is never removed, even under a key the agent sometimes writes;
- annotations: only the ones in `DesiredNode.annotations` and the record;
- status: only the extended resources in `OWNED_RESOURCES`, in both capacity
  and allocatable (there is no kubelet on simulated nodes to copy them over).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trainwave.api.quantity import BadQuantity, parse_quantity
from trainwave.contract import ANNOTATION_AGENT_LABELS, SHARED_GPU_MEMORY_RESOURCE
from trainwave.hardware.inventory import GpuInfo

OWNED_RESOURCES = (SHARED_GPU_MEMORY_RESOURCE,)
STATUS_FIELDS = ("capacity", "allocatable")

ChangeKind = Literal["label", "annotation", "capacity", "allocatable", "resourceslice"]


@dataclass(frozen=True)
class DesiredNode:
    """Labels, annotations and owned extended resources (integers) the node should carry."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)
    # The GPUs to publish as DRA ResourceSlices (slices.py); None: the agent
    # publishes no slices and leaves any that exist alone.
    slices: tuple[GpuInfo, ...] | None = None


@dataclass(frozen=True)
class Change:
    """One key that moves; `None` on a side means absent."""

    kind: ChangeKind
    key: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        """A logfmt line; annotation values are long JSON, so only their sizes are shown."""
        action = "removed" if self.new is None else ("added" if self.old is None else "changed")
        if self.kind == "annotation":
            sizes = " ".join(
                f"{side}_bytes={len(value)}"
                for side, value in (("old", self.old), ("new", self.new))
                if value is not None
            )
            return f"change={self.kind}-{action} key={self.key} {sizes}"
        shown = " ".join(
            f"{side}={value!r}"
            for side, value in (("old", self.old), ("new", self.new))
            if value is not None
        )
        return f"change={self.kind}-{action} key={self.key} {shown}"


@dataclass(frozen=True)
class NodePatches:
    node: dict[str, Any]  # merge patch of metadata; {} when nothing to send
    status: dict[str, Any]  # merge patch of the status subresource; {} when nothing to send
    changes: tuple[Change, ...]


def diff_node(node: Mapping[str, Any], desired: DesiredNode) -> NodePatches:
    metadata = node.get("metadata") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    changes: list[Change] = []

    label_patch: dict[str, str | None] = {}
    for key, value in sorted(desired.labels.items()):
        if labels.get(key) != value:
            label_patch[key] = value
            changes.append(Change("label", key, labels.get(key), value))
    for key in sorted(published_labels(annotations) - desired.labels.keys()):
        if key in labels:
            label_patch[key] = None
            changes.append(Change("label", key, labels[key], None))

    wanted_annotations = dict(desired.annotations)
    wanted_annotations[ANNOTATION_AGENT_LABELS] = ",".join(sorted(desired.labels))
    annotation_patch: dict[str, str] = {}
    for key, value in sorted(wanted_annotations.items()):
        if annotations.get(key) != value:
            annotation_patch[key] = value
            changes.append(Change("annotation", key, annotations.get(key), value))

    node_patch: dict[str, Any] = {}
    if label_patch:
        node_patch.setdefault("metadata", {})["labels"] = label_patch
    if annotation_patch:
        node_patch.setdefault("metadata", {})["annotations"] = annotation_patch

    status = node.get("status") or {}
    status_patch: dict[str, dict[str, str | None]] = {}
    for status_field in STATUS_FIELDS:
        have: Mapping[str, str] = status.get(status_field) or {}
        kind: ChangeKind = "capacity" if status_field == "capacity" else "allocatable"
        for resource in OWNED_RESOURCES:
            want = desired.resources.get(resource)
            old = have.get(resource)
            if want is None and old is None:
                continue
            if want is not None and old is not None and quantity_value(old) == want:
                continue
            new = None if want is None else str(want)
            status_patch.setdefault(status_field, {})[resource] = new
            changes.append(Change(kind, resource, old, new))
    return NodePatches(
        node=node_patch,
        status={"status": status_patch} if status_patch else {},
        changes=tuple(changes),
    )


def published_labels(annotations: Mapping[str, str]) -> frozenset[str]:
    """The label keys the agent recorded as its own on its last pass."""
    record = annotations.get(ANNOTATION_AGENT_LABELS, "")
    return frozenset(key.strip() for key in record.split(",") if key.strip())


def quantity_value(text: str) -> int | None:
    """An integer quantity however the API server wrote it ("81k" for 81000, "1Ki").

    None for anything else (a fraction, a bad quantity): such a value differs from
    every integer the agent wants, so it is simply written again.
    """
    try:
        value = parse_quantity(text)
    except BadQuantity:
        return None
    return int(value) if value == value.to_integral_value() else None
