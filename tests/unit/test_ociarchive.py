"""The OCI image archive writer of tests/cluster: the archive is a valid OCI image layout
(every descriptor's digest and size match its blob), the layer holds the files, and the
output is deterministic. Importing it into a real containerd is checked by hand (report)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from cluster import ociarchive

pytestmark = pytest.mark.timeout(20)

PAUSE = {"/pause": (b"\x7fELF pretend", 0o755)}
COREDNS = {
    "/coredns": (b"binary", 0o755),
    "/etc/coredns/Corefile": (b".:1053 {\n  whoami\n}\n", 0o644),
}


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def blob(members: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    algorithm, hexdigest = descriptor["digest"].split(":")
    assert algorithm == "sha256"
    data = members[f"blobs/sha256/{hexdigest}"]
    assert hashlib.sha256(data).hexdigest() == hexdigest
    assert len(data) == descriptor["size"]
    return data


@pytest.mark.parametrize(
    ("files", "entrypoint", "user", "env"),
    [
        (PAUSE, ["/pause"], "65535", {}),
        (COREDNS, ["/coredns", "-conf", "/etc/coredns/Corefile"], "65532", {"A": "b=c"}),
    ],
    ids=["pause", "coredns"],
)
def test_archive_is_an_oci_layout_whose_digests_match(
    tmp_path: Path, files: ociarchive.Files, entrypoint: list[str], user: str, env: dict[str, str]
) -> None:
    archive = tmp_path / "image.tar"
    ref = "localhost/trainwave/test:1.0"
    digest = ociarchive.write_image(str(archive), ref, files, entrypoint, user=user, env=env)
    members = read_archive(archive)

    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    assert index["schemaVersion"] == 2
    [entry] = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"] == {ociarchive.CONTAINERD_NAME: ref, ociarchive.OCI_REF_NAME: "1.0"}
    manifest = json.loads(blob(members, entry))
    assert manifest["mediaType"] == entry["mediaType"] == ociarchive.OCI_MANIFEST
    config = json.loads(blob(members, manifest["config"]))
    [layer_descriptor] = manifest["layers"]
    layer = blob(members, layer_descriptor)
    assert config["rootfs"]["diff_ids"] == [
        layer_descriptor["digest"]
    ]  # uncompressed: diff ID == digest
    assert config["config"]["Entrypoint"] == entrypoint
    assert config["config"]["User"] == user
    assert config["config"]["Env"] == [f"{k}={v}" for k, v in env.items()]
    assert (config["os"], config["architecture"]) == ("linux", entry["platform"]["architecture"])
    assert len(members) == 2 + 3  # oci-layout, index.json, three blobs: nothing stray

    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        found = {m.name: m for m in tar.getmembers()}
        for path, (content, mode) in files.items():
            member = found.pop(path.lstrip("/"))
            assert (member.mode, member.uid, member.gid, member.mtime) == (mode, 0, 0, 0)
            assert tar.extractfile(member).read() == content  # type: ignore[union-attr]
    parents = {"/".join(p.strip("/").split("/")[:n]) for p in files for n in range(1, p.count("/"))}
    assert set(found) == parents  # only the parent directories remain, each 0755
    assert all(m.isdir() and m.mode == 0o755 for m in found.values())


def test_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    ociarchive.write_image(str(first), "localhost/p:1", COREDNS, ["/coredns"])
    ociarchive.write_image(
        str(second), "localhost/p:1", dict(reversed(COREDNS.items())), ["/coredns"]
    )
    assert first.read_bytes() == second.read_bytes()
    third = tmp_path / "c.tar"
    ociarchive.write_image(str(third), "localhost/p:1", COREDNS, ["/coredns", "-dns.port=1053"])
    assert third.read_bytes() != first.read_bytes()


@pytest.mark.parametrize(
    ("ref", "files", "entrypoint", "message"),
    [
        ("localhost/p", PAUSE, ["/pause"], "is not a reference"),
        ("Localhost/P:1", PAUSE, ["/pause"], "is not a reference"),
        ("localhost/p:1", {"pause": (b"", 0o755)}, ["/pause"], "must be absolute"),
        ("localhost/p:1", {"/a/../pause": (b"", 0o755)}, ["/pause"], "normalized"),
        (
            "localhost/p:1",
            {"/a": (b"", 0o644), "/a/b": (b"", 0o644)},
            ["/a"],
            "both a file and the directory",
        ),
        (
            "localhost/p:1",
            {"/a/b": (b"", 0o644), "/a": (b"", 0o644)},
            ["/a"],
            "both a file and the directory",
        ),
        ("localhost/p:1", {"/pause": (b"", 0o100755)}, ["/pause"], "not a permission mode"),
        ("localhost/p:1", PAUSE, [], "non-empty list"),
    ],
    ids=[
        "no-tag",
        "upper-case",
        "relative",
        "dotdot",
        "file-then-dir",
        "dir-then-file",
        "file-type-bits",
        "no-entrypoint",
    ],
)
def test_bad_input_is_refused_naming_the_field(
    tmp_path: Path, ref: str, files: ociarchive.Files, entrypoint: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ociarchive.write_image(str(tmp_path / "x.tar"), ref, files, entrypoint)
    assert not (tmp_path / "x.tar").exists()


def test_command_line_packs_a_file_with_its_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "pause"
    source.write_bytes(b"pause")
    archive = tmp_path / "pause.tar"
    ref = "localhost/trainwave/pause:3.10"
    argv = [
        str(archive),
        "--ref",
        ref,
        "--entrypoint",
        "/pause",
        "--user",
        "65535",
        f"--file=/pause={source}:0755",
    ]
    assert ociarchive.main(argv) == 0
    printed_ref, digest = capsys.readouterr().out.split()
    members = read_archive(archive)
    assert printed_ref == ref
    assert f"blobs/sha256/{digest.removeprefix('sha256:')}" in members
    with pytest.raises(SystemExit):
        ociarchive.main([str(archive), "--ref", ref, "--entrypoint", "/pause", "--file=pause"])
