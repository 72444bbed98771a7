"""The protobuf wire format of the kubelet's plugin APIs, for the few messages they use. Pure.

The kubelet talks to a DRA driver over gRPC with the messages of
k8s.io/kubelet pkg/apis/pluginregistration/v1 (GetInfo, NotifyRegistrationStatus)
and pkg/apis/dra/v1 (NodePrepareResources, NodeUnprepareResources). Those
messages are a handful of strings, booleans, repeated fields and one map, so
they are encoded here by hand (proto3: varints and length-delimited fields)
instead of adding the protobuf runtime and generated code to the agent image.
Field numbers are the .proto files' of v0.34.4; tests/cluster/draclient, built
from those files' Go code, checks the encoding end to end.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _key(number, _BYTES) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    """proto3 leaves a default (empty) scalar out."""
    return _bytes_field(number, text.encode()) if text else b""


def _strings(number: int, texts: Sequence[str]) -> bytes:
    return b"".join(_bytes_field(number, text.encode()) for text in texts)


def _flag(number: int, value: bool) -> bytes:
    return _key(number, _VARINT) + b"\x01" if value else b""


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) in order: an int for varints, bytes for length-delimited."""
    position = 0

    def varint() -> int:
        nonlocal position
        result, shift = 0, 0
        while True:
            if position >= len(data):
                raise WireError("truncated varint")
            byte = data[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise WireError("varint longer than 64 bits")

    while position < len(data):
        key = varint()
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            yield number, varint()
        elif wire_type == _BYTES:
            size = varint()
            if position + size > len(data):
                raise WireError(
                    f"field {number}: {size} bytes announced, {len(data) - position} left"
                )
            yield number, data[position : position + size]
            position += size
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4  # none in these APIs: skipped
        else:
            raise WireError(f"field {number}: wire type {wire_type} is not supported")


def _texts(data: bytes) -> dict[int, list[str]]:
    """Field number -> its string values, for messages made only of (repeated) strings."""
    found: dict[int, list[str]] = {}
    for number, value in _fields(data):
        found.setdefault(number, []).append(_text(value))
    return found


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise WireError("expected a length-delimited field")
    return value.decode()


# --- pluginregistration/v1 ---------------------------------------------------


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]

    def encode(self) -> bytes:
        return (
            _string(1, self.type)
            + _string(2, self.name)
            + _string(3, self.endpoint)
            + _strings(4, self.supported_versions)
        )

    @classmethod
    def decode(cls, data: bytes) -> PluginInfo:
        found = _texts(data)
        first = {number: values[0] for number, values in found.items()}
        return cls(first.get(1, ""), first.get(2, ""), first.get(3, ""), tuple(found.get(4, [])))


@dataclass(frozen=True)
class RegistrationStatus:
    plugin_registered: bool
    error: str = ""

    def encode(self) -> bytes:
        return _flag(1, self.plugin_registered) + _string(2, self.error)

    @classmethod
    def decode(cls, data: bytes) -> RegistrationStatus:
        registered, error = False, ""
        for number, value in _fields(data):
            if number == 1:
                registered = bool(value)
            elif number == 2:
                error = _text(value)
        return cls(registered, error)


def empty(_: bytes = b"") -> bytes:
    """InfoRequest and RegistrationStatusResponse have no fields."""
    return b""


# --- dra/v1 ------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    namespace: str
    uid: str
    name: str

    def encode(self) -> bytes:
        return _string(1, self.namespace) + _string(2, self.uid) + _string(3, self.name)

    @classmethod
    def decode(cls, data: bytes) -> Claim:
        values = {1: "", 2: "", 3: ""}
        for number, value in _fields(data):
            if number in values:
                values[number] = _text(value)
        return cls(values[1], values[2], values[3])


def encode_claims(claims: Sequence[Claim]) -> bytes:
    """Node(Un)PrepareResourcesRequest: `repeated Claim claims = 1`."""
    return b"".join(_bytes_field(1, claim.encode()) for claim in claims)


def decode_claims(data: bytes) -> tuple[Claim, ...]:
    return tuple(Claim.decode(_bytes(value)) for number, value in _fields(data) if number == 1)


@dataclass(frozen=True)
class Device:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]

    def encode(self) -> bytes:
        return (
            _strings(1, self.request_names)
            + _string(2, self.pool_name)
            + _string(3, self.device_name)
            + _strings(4, self.cdi_device_ids)
        )

    @classmethod
    def decode(cls, data: bytes) -> Device:
        found = _texts(data)
        return cls(
            tuple(found.get(1, [])),
            (found.get(2) or [""])[0],
            (found.get(3) or [""])[0],
            tuple(found.get(4, [])),
        )


@dataclass(frozen=True)
class Prepared:
    """NodePrepareResourceResponse: the claim's devices, or why it could not be prepared."""

    devices: tuple[Device, ...] = ()
    error: str = ""

    def encode(self) -> bytes:
        return b"".join(_bytes_field(1, d.encode()) for d in self.devices) + _string(2, self.error)

    @classmethod
    def decode(cls, data: bytes) -> Prepared:
        devices: list[Device] = []
        error = ""
        for number, value in _fields(data):
            if number == 1:
                devices.append(Device.decode(_bytes(value)))
            elif number == 2:
                error = _text(value)
        return cls(tuple(devices), error)


@dataclass(frozen=True)
class Unprepared:
    error: str = ""

    def encode(self) -> bytes:
        return _string(1, self.error)

    @classmethod
    def decode(cls, data: bytes) -> Unprepared:
        return cls(next((_text(v) for n, v in _fields(data) if n == 1), ""))


@dataclass(frozen=True)
class ClaimResults:
    """Both responses: `map<string, ...> claims = 1`, keyed by claim UID."""

    claims: Mapping[str, Prepared | Unprepared] = field(default_factory=dict)

    def encode(self) -> bytes:
        # A map is a repeated message of {key = 1, value = 2}.
        return b"".join(
            _bytes_field(1, _string(1, uid) + _bytes_field(2, result.encode()))
            for uid, result in self.claims.items()
        )


def decode_results(
    data: bytes, kind: type[Prepared] | type[Unprepared]
) -> dict[str, Prepared | Unprepared]:
    results: dict[str, Prepared | Unprepared] = {}
    for number, entry in _fields(data):
        if number != 1:
            continue
        key, value = "", b""
        for inner, part in _fields(_bytes(entry)):
            if inner == 1:
                key = _text(part)
            elif inner == 2:
                value = _bytes(part)
        results[key] = kind.decode(value)
    return results


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError("expected a length-delimited field")
    return value
