"""A mutating admission webhook for pods, as a user's cluster may have one: served on
loopback over TLS, registered with the API server (a host process here) by URL.

    with mutating_pod_webhook(cluster, {"trainwave.io/job-name": "x"}, toleration):
        ...  # pods carrying those labels get `toleration` added on their way in

Only pods matching the object selector are sent to it. It answers dry runs as well
(`sideEffects: None`), as a webhook must for `kubectl --dry-run=server` to work.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from cluster.controlplane import Cluster


@contextmanager
def mutating_pod_webhook(
    cluster: Cluster, labels: dict[str, str], toleration: dict[str, Any]
) -> Iterator[list[bool]]:
    """Yields the dry-run flag of each review it answered, in order."""
    reviewed: list[bool] = []
    with TemporaryDirectory() as scratch:
        cert, key = _self_signed(Path(scratch))
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(toleration, reviewed))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        name = f"test-pod-webhook-{uuid.uuid4().hex[:6]}"
        configuration = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "tolerate.test.trainwave.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "objectSelector": {"matchLabels": labels},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                           "operations": ["CREATE"], "resources": ["pods"]}],
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.server_address[1]}/mutate",
                    "caBundle": base64.b64encode(cert.read_bytes()).decode(),
                },
            }],
        }  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=json.dumps(configuration))
        try:
            yield reviewed
        finally:
            cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
            server.shutdown()
            server.server_close()


def _handler(toleration: dict[str, Any], reviewed: list[bool]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = review["request"]
            reviewed.append(bool(request.get("dryRun")))
            existing = (request["object"].get("spec") or {}).get("tolerations")
            patch = (
                [{"op": "add", "path": "/spec/tolerations/-", "value": toleration}]
                if existing
                else [{"op": "add", "path": "/spec/tolerations", "value": [toleration]}]
            )
            answer = json.dumps({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_args: Any) -> None:
            pass  # the API server's calls are counted in `reviewed`, not printed

    return Handler


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-days", "1",
         "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
