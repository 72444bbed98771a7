"""Files a kubelet writes into pods, in the formats Kubernetes uses. Pure.

- Downward API files for `metadata.labels` / `metadata.annotations`: one
  `key="value"` line per entry, keys sorted, values quoted as Go's `%q`
  (strconv.Quote) does, no newline after the last line (kubelet's
  fieldpath.FormatMap). trainwave's runtime parses exactly this
  (trainwave/runtime/podinfo.py), so the two are tested against each other.
- /etc/hosts: the kubelet's managed header plus one line per pod of the gang.
  Real clusters resolve peers through the headless Service's DNS records; the
  test kubelet has no DNS server, so it writes those names into every pod's
  hosts file instead, with the same names the records would have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_SIMPLE_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": r"\\",
    '"': r"\"",
}


def go_quote(text: str) -> str:
    """strconv.Quote: printable characters as they are, the rest as Go escapes."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[char])
        elif char == " " or char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_map(entries: Mapping[str, str]) -> str:
    """A labels or annotations file of the downward API."""
    return "\n".join(f"{key}={go_quote(entries[key])}" for key in sorted(entries))


@dataclass(frozen=True)
class PodAddress:
    """A pod's DNS identity: what its hostname resolves to for its peers."""

    ip: str
    hostname: str
    subdomain: str
    namespace: str

    def names(self) -> tuple[str, ...]:
        if not self.subdomain:
            return (self.hostname,)
        short = f"{self.hostname}.{self.subdomain}"
        return (f"{short}.{self.namespace}.svc.cluster.local", short, self.hostname)


_HOSTS_HEADER = """# Kubernetes-managed hosts file (trainwave test kubelet).
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""


def hosts_file(own: PodAddress, peers: Iterable[PodAddress]) -> str:
    """The pod's own line first (as the kubelet writes it), then every peer's."""
    lines = [f"{own.ip}\t{' '.join(own.names())}"]
    lines += [f"{peer.ip}\t{' '.join(peer.names())}" for peer in peers if peer != own]
    return _HOSTS_HEADER + "\n".join(lines) + "\n"
