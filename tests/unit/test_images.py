"""The pure parts of hack/images.py: the image tag, the build context, content keys, manifest."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("images", ROOT / "hack" / "images.py")
assert _spec
assert _spec.loader
images = importlib.util.module_from_spec(_spec)
sys.modules["images"] = images  # dataclasses resolve their module by name
_spec.loader.exec_module(images)

pytestmark = pytest.mark.timeout(20)


def test_the_tag_is_the_charts_app_version() -> None:
    chart = (ROOT / "charts" / "trainwave" / "Chart.yaml").read_text()
    version = images.chart_app_version(chart)
    assert f'appVersion: "{version}"' in chart
    assert images.app_ref("operator", version) == f"docker.io/trainwave/operator:{version}"


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('appVersion: "1.2.3"\n', "1.2.3"),
        ("name: x\nappVersion: 0.4.0  # comment\n", "0.4.0"),
        ("appVersion: '2.0'\n", "2.0"),
    ],
    ids=["double-quoted", "bare-with-comment", "single-quoted"],
)
def test_app_version_forms(text: str, version: str) -> None:
    assert images.chart_app_version(text) == version


def test_a_chart_without_app_version_says_so() -> None:
    with pytest.raises(ValueError, match="appVersion"):
        images.chart_app_version("version: 0.1.0\n")


# The repository's own .dockerignore: everything out, then the package back in, minus caches.
DOCKERIGNORE = (
    "*\n!pyproject.toml\n!README.md\n!operator/\n**/__pycache__\n**/*.py[cod]\n**/*.egg-info\n"
)


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("operator/trainwave/cli.py", False),
        ("operator/trainwave/runtime/launch/env.py", False),
        ("Makefile", True),
        ("tests/unit/test_images.py", True),
        ("charts/trainwave/Chart.yaml", True),
        ("operator/trainwave/__pycache__/cli.cpython-311.pyc", True),
        ("operator/trainwave/cli.pyc", True),
        ("operator/trainwave.egg-info/PKG-INFO", True),
    ],
)  # fmt: skip
def test_dockerignore_matches_docker(path: str, ignored: bool) -> None:
    assert images.is_ignored(path, images.ignore_rules(DOCKERIGNORE)) is ignored


@pytest.mark.parametrize(
    ("pattern", "path", "ignored"),
    [
        ("data[0-9].csv", "data7.csv", True),
        ("data[0-9].csv", "dataX.csv", False),
        ("data[!0-9].csv", "dataX.csv", True),
        ("data[^0-9].csv", "data7.csv", False),
        ("a?c", "a/c", False),
        ("a*", "a/b", True),  # through the parent directory, as Docker does
        ("**/b", "x/y/b", True),
        ("x/**/b", "x/b", True),
    ],
)  # fmt: skip
def test_dockerignore_pattern_forms(pattern: str, path: str, ignored: bool) -> None:
    assert images.is_ignored(path, images.ignore_rules(pattern)) is ignored


def test_the_repository_dockerignore_is_the_one_tested() -> None:
    assert (ROOT / ".dockerignore").read_text().endswith(DOCKERIGNORE.split("*\n", 1)[1])


def _context(tmp_path: Path) -> Path:
    (tmp_path / ".dockerignore").write_text(DOCKERIGNORE)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "README.md").write_text("# readme\n")
    package = tmp_path / "operator" / "trainwave"
    package.mkdir(parents=True)
    (package / "cli.py").write_text("print('hi')\n")
    return tmp_path


@pytest.mark.parametrize(
    ("change", "moves"),
    [
        (lambda root: (root / "operator/trainwave/cli.py").write_text("print('bye')\n"), True),
        (lambda root: (root / "operator/trainwave/new.py").write_text(""), True),
        (lambda root: (root / "README.md").write_text("# other\n"), True),
        (lambda root: (root / "operator/trainwave/cli.py").chmod(0o755), True),
        (lambda root: (root / "Makefile").write_text("all:\n"), False),
        (lambda root: (root / "operator/trainwave/__pycache__").mkdir(), False),
        (lambda root: (root / "operator/trainwave/cli.pyc").write_bytes(b"\0"), False),
    ],
    ids=["source-edited", "source-added", "readme", "exec-bit", "outside-context", "pycache-dir", "pyc"],
)  # fmt: skip
def test_the_context_digest_follows_what_the_build_sees(
    tmp_path: Path, change: Callable[[Path], object], moves: bool
) -> None:
    root = _context(tmp_path)
    before = images.context_digest(root)
    change(root)
    assert (images.context_digest(root) != before) is moves


def test_the_app_key_changes_with_each_input() -> None:
    inputs = {
        "dockerfile": b"FROM x\n",
        "context": b"c" * 32,
        "build_args": {"PYTHON_IMAGE": "base"},
        "base": "sha256:00",
        "ref": "docker.io/trainwave/operator:0.1.0",
    }
    key = images.app_key(**inputs)
    assert key.startswith("sha256:")
    assert len(key) == len("sha256:") + 64
    assert images.app_key(**inputs) == key
    changed = {
        "dockerfile": b"FROM y\n",
        "context": b"d" * 32,
        "build_args": {"PYTHON_IMAGE": "other"},
        "base": "sha256:01",
        "ref": "docker.io/trainwave/operator:0.2.0",
    }
    for name, value in changed.items():
        assert images.app_key(**{**inputs, name: value}) != key, name


def test_content_key_parts_cannot_run_into_each_other() -> None:
    assert images.content_key({"a": b"bc"}) != images.content_key({"a": b"b", "c": b""})
    assert images.content_key({"a": b"1", "b": b"2"}) == images.content_key({"b": b"2", "a": b"1"})


def test_the_base_key_follows_its_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    key = images.base_key()
    monkeypatch.setattr(images, "PACKAGES", (*images.PACKAGES, "curl"))
    assert images.base_key() != key


@pytest.mark.parametrize("name", ["operator", "agent", "runtime"])
def test_earlier_stages_of_the_repository_dockerfiles(name: str) -> None:
    dockerfile = (ROOT / "images" / f"{name}.Dockerfile").read_text()
    assert images.earlier_stages(dockerfile) == ([] if name == "runtime" else ["build"])


@pytest.mark.parametrize(
    ("dockerfile", "stages"),
    [
        ("FROM a AS deps\nRUN x\nfrom b as build\nFROM c AS final\n", ["deps", "build"]),
        ("FROM a\nFROM b AS unnamed-before\nFROM c\n", ["unnamed-before"]),
        ("ARG BASE=x\nFROM ${BASE}\n", []),
    ],
    ids=["named", "unnamed-first", "single"],
)
def test_earlier_stages(dockerfile: str, stages: list[str]) -> None:
    assert images.earlier_stages(dockerfile) == stages


def test_the_manifest_round_trips_in_the_documented_format(tmp_path: Path) -> None:
    archive = tmp_path / "operator.tar"
    archive.write_bytes(b"x" * 10)
    built = images.Built(
        "operator", "docker.io/trainwave/operator:0.1.0", str(archive), 10, "sha256:ab"
    )
    text = images.render_manifest([built])
    body = json.loads(text)
    assert body == {
        "format": 1,
        "images": [
            {"name": "operator", "ref": "docker.io/trainwave/operator:0.1.0",
             "archive": str(archive), "size": 10, "key": "sha256:ab"},
        ],
    }  # fmt: skip
    assert images.parse_manifest(text) == {"operator": built}
    assert images.is_current(built, "sha256:ab")
    assert not images.is_current(built, "sha256:cd")
    archive.write_bytes(b"x" * 5)  # a torn archive is rebuilt
    assert not images.is_current(built, "sha256:ab")
    archive.unlink()
    assert not images.is_current(built, "sha256:ab")
    assert not images.is_current(None, "sha256:ab")


@pytest.mark.parametrize("text", ["", "{", '{"format": 0, "images": []}', "[]"])
def test_an_unreadable_manifest_means_rebuild(text: str) -> None:
    assert images.parse_manifest(text) == {}
