"""The chart's Grafana dashboard against Grafana's own published schema types.

`@grafana/schema` is the npm package Grafana generates from its dashboard schema: its
`Dashboard` type (panels, grid positions, templating, annotations, time settings, ...) is
the TypeScript model Grafana's frontend builds dashboards with. The committed JSON is
written into a .ts file as `const dashboard = <JSON> satisfies Dashboard;` and the pinned
`tsc --strict` compiles it: object-literal checks reject a key the type does not declare
and a value of the wrong type, at every level the type describes. It does not run a Grafana;
panel `options`, `fieldConfig.custom` and query `targets` are open records in the type, so
their contents are not checked here (the queries are checked in test_chart_dashboards.py).

The pinned versions are installed by `make tools` (tests/cluster/install-tools.sh
grafana-schema); this test reads them from that script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainwave"
INSTALL = ROOT / "tests" / "cluster" / "install-tools.sh"
BOARD = CHART / "dashboards" / "trainwave.json"


def schema_dir() -> Path:
    """The cached node_modules holding the pinned typescript and @grafana/schema."""
    text = INSTALL.read_text()
    (version,) = re.findall(r"^GRAFANA_SCHEMA_VERSION=(\S+)$", text, re.M)
    cache = Path(os.environ.get("TRAINWAVE_CACHE", Path.home() / ".cache" / "trainwave"))
    modules = cache / f"grafana-schema-{version}" / "node_modules"
    for need in (modules / "typescript" / "bin" / "tsc", modules / "@grafana" / "schema"):
        if not need.exists():
            pytest.fail(f"{need} is missing: run `make tools` (install-tools.sh grafana-schema)")
    return modules


def tsc(board: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Compile `board satisfies Dashboard` with the pinned tsc; returns the finished process."""
    modules = schema_dir()
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH; it runs the pinned tsc (install Node.js)")
    (tmp_path / "node_modules").symlink_to(modules)
    (tmp_path / "dashboard.ts").write_text(
        "import type { Dashboard } from '@grafana/schema';\n\n"
        f"export const dashboard = {json.dumps(board, indent=2)} satisfies Dashboard;\n"
    )
    config = {
        "compilerOptions": {
            "strict": True,
            "noEmit": True,
            "module": "esnext",
            "moduleResolution": "bundler",  # follows the package's `exports` to its .d.ts
            "types": [],
        },
        "files": ["dashboard.ts"],
    }
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    return subprocess.run(
        [node, str(modules / "typescript" / "bin" / "tsc"), "--noEmit", "--strict", "-p", "."],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_the_dashboard_satisfies_grafanas_dashboard_type(tmp_path: Path) -> None:
    done = tsc(json.loads(BOARD.read_text()), tmp_path)
    assert done.returncode == 0, f"tsc rejects {BOARD.name}:\n{done.stdout}{done.stderr}"


def wrong_grid_height(board: dict[str, Any]) -> None:
    board["panels"][0]["gridPos"]["h"] = "8"


def unknown_top_level_key(board: dict[str, Any]) -> None:
    board["refreshInterval"] = "30s"


def wrong_variable_field(board: dict[str, Any]) -> None:
    board["templating"]["list"][0]["multi"] = "yes"


@pytest.mark.parametrize(
    ("break_it", "line", "code"),
    [
        (wrong_grid_height, '"h": "8"', "TS2322"),  # not assignable
        (unknown_top_level_key, '"refreshInterval": "30s"', "TS2353"),  # not a known property
        (wrong_variable_field, '"multi": "yes"', "TS2322"),
    ],
    ids=["gridPos.h-string", "unknown-top-level-key", "variable-multi-string"],
)
def test_a_broken_dashboard_fails(
    tmp_path: Path, break_it: Callable[[dict[str, Any]], None], line: str, code: str
) -> None:
    board = json.loads(BOARD.read_text())
    break_it(board)
    done = tsc(board, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"tsc accepted the broken dashboard:\n{output}"
    source = (tmp_path / "dashboard.ts").read_text().splitlines()
    (number,) = [i for i, text in enumerate(source, 1) if text.strip().rstrip(",") == line]
    errors = [e for e in output.splitlines() if e.startswith("dashboard.ts(")]
    assert len(errors) == 1, output  # only the broken field, nothing else
    assert errors[0].startswith(f"dashboard.ts({number},"), output
    assert f"error {code}:" in errors[0], output
