"""`make images-check`: import the built images into a throwaway containerd and run each once.

Reads the manifest `hack/images.py` writes (~/.cache/trainwave/images/manifest.json), starts
containerd with its own config, root, state and socket under a temporary directory (no CRI
plugin: nothing else sees it), then for every image:

- `ctr -n k8s.io images import <archive>`, and `ctr images ls` must list the manifest's ref;
- `ctr run` of the probes below: each container gets a fresh network namespace holding only
  loopback, no cgroup of its own, and its runc state under the temporary directory. The
  operator and agent probes run with a read-only root filesystem, as the chart runs them, and
  must run as 65532:65532 without being told; the runtime probe runs the image's own
  entrypoint and command into a world-writable bind mount, as the worker's emptyDir.

containerd is stopped and its directories removed afterwards, whatever happened. Needs root
and Debian's containerd package (installed with apt-get when `containerd` is missing).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from images import MANIFEST, ensure_tools, parse_manifest

NAMESPACE = "k8s.io"
NONROOT = "65532 65532"
# What the chart's containers get: no writes outside their volumes (values.yaml,
# securityContext.readOnlyRootFilesystem; builders/security.py for the runtime).
WHO = 'echo "$(id -u) $(id -g)"; '
RO = "if touch /probe 2>/dev/null; then echo writable-root; else echo read-only-root; fi; "


@dataclass(frozen=True)
class Probe:
    image: str  # manifest name
    args: tuple[str, ...]  # empty: the image's own entrypoint and command
    expect: tuple[str, ...]  # substrings the output must hold
    read_only: bool = True
    writable_dir: str = ""  # bind a world-writable host directory here


PYTHON_SH = (
    "python --version; pip --version; "
    'python -c \'import os, sysconfig; print("marker" if os.path.exists(os.path.join('
    'sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else "pip-unmanaged")\'; '
    "python -m venv /tmp/venv && echo venv-ok"
)
OPERATOR_SH = (
    WHO + RO + "trainwave --help && python -c "
    "'import kopf, kubernetes, prometheus_client, trainwave.controller.handlers' && echo imports-ok"
)
AGENT_SH = (
    WHO + RO + "trainwave agent --help && python -c "
    "'import kubernetes, grpc, pynvml, trainwave.agent.publishing' && echo imports-ok"
)
PROBES = (
    # The base is the e2e worker image too: python on PATH, pip usable, venv available.
    Probe("python", ("sh", "-c", PYTHON_SH), ("Python 3.11.", "pip-unmanaged", "venv-ok"), False),
    Probe(
        "operator",
        ("sh", "-c", OPERATOR_SH),
        (NONROOT, "read-only-root", "usage: trainwave", "imports-ok"),
    ),
    Probe(
        "agent",
        ("sh", "-c", AGENT_SH),
        (NONROOT, "read-only-root", "usage: trainwave agent", "imports-ok"),
    ),
    Probe(
        "runtime",
        (),
        ("trainwave runtime installed in /opt/trainwave/trainwave",),
        writable_dir="/opt/trainwave",
    ),
)


class Containerd:
    """A containerd of our own: config, root, state, sockets and runc state under `home`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.socket = home / "containerd.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.home / "config.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{self.home / "root"}"\n'
            f'state = "{self.home / "state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.socket}"\n'
            f'[ttrpc]\n  address = "{self.socket}.ttrpc"\n'
        )
        log = (self.home / "containerd.log").open("wb")
        self.process = subprocess.Popen(
            ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while self.ctr("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"containerd did not start; see {self.home / 'containerd.log'}")
            time.sleep(0.1)

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", str(self.socket), "-n", NAMESPACE, *args]
        result = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"{' '.join(cmd)}: exit {result.returncode}\n{output}")
        return result

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Snapshots stay mounted only if a container outlived us; never delete through one.
        for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith(str(self.home)):
                subprocess.run(["umount", "-l", target], check=False)


@contextlib.contextmanager
def throwaway_containerd() -> Iterator[Containerd]:
    home = Path(tempfile.mkdtemp(prefix="trainwave-images-check-", dir="/tmp"))
    # containerd 1.6 puts shim sockets under /run/containerd/s whatever its state dir; the
    # shims remove their sockets, and we remove the directories if they were not there before.
    shim_dirs = [Path("/run/containerd/s"), Path("/run/containerd")]
    ours = [directory for directory in shim_dirs if not directory.exists()]
    daemon = Containerd(home)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
        for directory in ours:
            with contextlib.suppress(OSError):  # not empty: someone else's now, keep it
                directory.rmdir()


def run_probe(daemon: Containerd, probe: Probe, ref: str) -> tuple[bool, str]:
    container = f"images-check-{probe.image}"
    args = ["run", "--rm", "--cgroup", "", "--runc-root", str(daemon.home / "runc")]
    args += ["--fifo-dir", str(daemon.home / "fifo")]  # not /run/containerd/fifo
    if probe.read_only:
        args.append("--read-only")
    if probe.writable_dir:
        volume = daemon.home / f"volume-{probe.image}"
        volume.mkdir()
        volume.chmod(0o1777)
        args += ["--mount", f"type=bind,src={volume},dst={probe.writable_dir},options=rbind:rw"]
    result = daemon.ctr(*args, ref, container, *probe.args, check=False, timeout=120)
    output = result.stdout + result.stderr
    missing = [text for text in probe.expect if text not in output]
    if probe.writable_dir:
        installed = daemon.home / f"volume-{probe.image}" / "trainwave" / "runtime"
        if not installed.is_dir():
            missing.append(f"{installed} on the host")
    if missing:
        output += f"missing: {missing}\n"
    return result.returncode == 0 and not missing, output


def main() -> int:
    if not MANIFEST.exists():
        sys.exit(f"{MANIFEST} not found: run `make images` first")
    images = parse_manifest(MANIFEST.read_text())
    ensure_tools({"containerd": "containerd", "ctr": "containerd", "runc": "runc"})
    failures = 0
    with throwaway_containerd() as daemon:
        for image in images.values():
            started = time.monotonic()
            daemon.ctr("images", "import", image.archive)
            took = time.monotonic() - started
            ok = image.ref in daemon.ctr("images", "ls", "-q").stdout.split()
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} import {image.archive} as {image.ref}, {took:.1f} s")
        for probe in PROBES:
            if probe.image not in images:
                continue
            ok, output = run_probe(daemon, probe, images[probe.image].ref)
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} run {images[probe.image].ref}")
            print("".join(f"      {line}\n" for line in output.splitlines()[:12]), end="")
        usage = daemon.ctr("images", "ls").stdout
        print(json.dumps({"images listed": len(usage.splitlines()) - 1}))
    print("images-check: " + ("all good" if not failures else f"{failures} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
