"""Writes a single-layer OCI image archive from a few files, standard library only.

The real nodes of tests/cluster need small images that nothing here can pull: the pod
sandbox (our pause), CoreDNS. Each is a handful of static files, so instead of a builder
this writes the OCI image layout directly as a tar:

    oci-layout, index.json, blobs/sha256/<layer> <config> <manifest>

`ctr -n k8s.io images import ARCHIVE` names the image from the index's
`io.containerd.image.name` annotation (the full reference); `org.opencontainers.image.ref.name`
carries the tag, as `docker save` writes both. The layer is an uncompressed tar, so its
digest is its diff ID. Output is deterministic: fixed times, owners and entry order, so the
same inputs give the same digests.

Usage from a shell (install-tools.sh):

    python3 ociarchive.py OUT.tar --ref REF --entrypoint /pause --user 65535 \\
        --file /pause=path/to/pause:0755 [--env K=V ...]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import posixpath
import re
import sys
import tarfile
from collections.abc import Mapping, Sequence

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
EPOCH = "1970-01-01T00:00:00Z"
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# name[:tag], lower-case path components; a digest reference is not something we write.
REF_PATTERN = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*:[\w][\w.-]{0,127}$"
)

Files = Mapping[str, tuple[bytes, int]]


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _check_path(path: str) -> str:
    normal = posixpath.normpath(path)
    if not path.startswith("/") or normal != path or normal == "/":
        raise ValueError(f"files: path {path!r} must be absolute and normalized, like '/pause'")
    return normal.lstrip("/")


def build_layer(files: Files) -> bytes:
    """A tar of `files` (absolute path -> (content, mode)) with their parent directories (0755),
    owned by root, every time 0, entries sorted so parents come first."""
    entries: dict[str, tuple[bytes, int] | None] = {}  # None: a directory
    for path, (content, mode) in files.items():
        name = _check_path(path)
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"files[{path!r}]: mode {mode:#o} is not a permission mode 0..0o7777")
        if name in entries and entries[name] is None:
            raise ValueError(f"files: {name!r} is both a file and the directory of another file")
        entries[name] = (content, mode)
        parent = posixpath.dirname(name)
        while parent:
            if entries.get(parent) is not None:
                raise ValueError(f"files: {parent!r} is both a file and the directory of {path!r}")
            entries[parent] = None
            parent = posixpath.dirname(parent)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            entry = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if entry is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                content, info.mode = entry
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def image_blobs(
    ref: str,
    files: Files,
    entrypoint: Sequence[str],
    *,
    user: str = "",
    env: Mapping[str, str] | None = None,
    arch: str | None = None,
) -> tuple[dict[str, object], dict[str, bytes]]:
    """The archive's index.json and its blobs (digest -> bytes) for one image."""
    if not REF_PATTERN.match(ref):
        raise ValueError(
            f"ref: {ref!r} is not a reference like 'localhost/trainwave/pause:3.10' (name:tag)"
        )
    if not entrypoint or not all(isinstance(arg, str) for arg in entrypoint):
        raise ValueError(f"entrypoint: {entrypoint!r} must be a non-empty list of strings")
    goarch = arch or GO_ARCH.get(platform.machine(), platform.machine())
    layer = build_layer(files)
    config = {
        "architecture": goarch,
        "os": "linux",
        "created": EPOCH,
        "config": {
            "Entrypoint": list(entrypoint),
            "User": user,
            "Env": [f"{key}={value}" for key, value in (env or {}).items()],
        },
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created": EPOCH, "created_by": "tests/cluster/ociarchive.py"}],
    }
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": _digest(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}],
    }
    manifest_bytes = _canonical(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": _digest(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": goarch, "os": "linux"},
                "annotations": {CONTAINERD_NAME: ref, OCI_REF_NAME: ref.rsplit(":", 1)[1]},
            }
        ],
    }
    blobs = {_digest(blob): blob for blob in (layer, config_bytes, manifest_bytes)}
    return index, blobs


def write_image(
    archive: str,
    ref: str,
    files: Files,
    entrypoint: Sequence[str],
    *,
    user: str = "",
    env: Mapping[str, str] | None = None,
) -> str:
    """Writes the OCI archive of a one-layer image holding `files` to `archive` and returns the
    manifest's digest (what `ctr images ls` shows for the imported image)."""
    index, blobs = image_blobs(ref, files, entrypoint, user=user, env=env)
    members = {
        "oci-layout": _canonical({"imageLayoutVersion": "1.0.0"}),
        "index.json": _canonical(index),
    }
    for digest, blob in sorted(blobs.items()):
        members["blobs/sha256/" + digest.removeprefix("sha256:")] = blob
    with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    manifests = index["manifests"]
    assert isinstance(manifests, list)
    return str(manifests[0]["digest"])


def _parse_file(spec: str) -> tuple[str, tuple[bytes, int]]:
    match = re.fullmatch(r"(/[^=]+)=(.+?)(?::([0-7]{3,4}))?", spec)
    if not match:
        raise argparse.ArgumentTypeError(
            f"--file {spec!r}: expected DEST=SRC[:MODE], like /pause=./pause:0755"
        )
    dest, src, mode = match.groups()
    with open(src, "rb") as f:
        return dest, (f.read(), int(mode or "0644", 8))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive")
    parser.add_argument("--ref", required=True)
    parser.add_argument(
        "--entrypoint", required=True, action="append", help="repeat for each argument"
    )
    parser.add_argument("--user", default="")
    parser.add_argument("--env", action="append", default=[], help="K=V")
    parser.add_argument("--file", action="append", type=_parse_file, required=True, dest="files")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    digest = write_image(
        args.archive, args.ref, dict(args.files), args.entrypoint, user=args.user, env=env
    )
    print(f"{args.ref} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
