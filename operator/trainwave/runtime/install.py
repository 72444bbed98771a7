"""`python -m trainwave.runtime.install DIR`: copy the runtime into DIR (the init container).

Only what workers import travels: the `trainwave` package marker, the
contract, the report signatures, the hardware checks and the runtime
package; none of the operator's dependencies. The copy goes to a
temporary name first and is renamed into place, so a worker never sees
half a runtime, and running it twice is harmless.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import trainwave
from trainwave import contract, signatures

_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def install(target: Path) -> Path:
    """Copy the runtime under `target`; returns the installed package directory."""
    source = Path(trainwave.__file__).resolve().parent
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".trainwave-", dir=target))
    package = staging / "trainwave"
    package.mkdir()
    shutil.copy2(source / "__init__.py", package / "__init__.py")
    shutil.copy2(Path(contract.__file__), package / "contract.py")
    shutil.copy2(Path(signatures.__file__), package / "signatures.py")
    # The doctor runs the node agent's hardware checks again inside the pod.
    shutil.copytree(source / "hardware", package / "hardware", ignore=_IGNORED)
    shutil.copytree(source / "runtime", package / "runtime", ignore=_IGNORED)
    final = target / "trainwave"
    if final.exists():
        shutil.rmtree(final)
    package.rename(final)
    staging.rmdir()
    return final


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainwave.runtime.install DIR", file=sys.stderr)
        return 2
    installed = install(Path(args[0]))
    print(f"trainwave runtime installed in {installed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
