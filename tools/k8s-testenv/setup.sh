#!/usr/bin/env bash
# Installs what the Kubernetes tests need (internal/k8stest): Debian's etcd-server and a
# kube-apiserver built from the k8s.io/kubernetes module through the Go module proxy.
#
# Idempotent: etcd is installed once; the kube-apiserver binary is cached outside the repo
# under $KVROUTER_K8S_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter/k8s), keyed by
# version, so a second run takes seconds. The first build takes about 6 minutes of CPU.
#
# Each step that cannot be done prints one line "k8s-testenv: missing ..." and the script
# exits 1 at the end; the tests then skip (or fail with KVROUTER_K8S_REQUIRED=1).
#
# Environment: KUBE_VERSION (default v1.37.2), KVROUTER_K8S_CACHE, GO (default go).
set -u

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
CACHE="${KVROUTER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter/k8s}"
GO="${GO:-go}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
missing=0

say() { echo "k8s-testenv: $*"; }
miss() { say "missing $*"; missing=1; }

# --- etcd (Debian's etcd-server) -------------------------------------------------------------
install_etcd() {
	if command -v etcd >/dev/null 2>&1; then
		say "etcd: $(command -v etcd)"
		return
	fi
	if [ "$(id -u)" != 0 ]; then
		miss "etcd: not installed and not root (run: apt-get install etcd-server)"
		return
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		miss "etcd: not installed and no apt-get (install etcd 3.4+ on PATH)"
		return
	fi
	if ! apt-cache show etcd-server >/dev/null 2>&1; then
		apt-get update -qq >/dev/null 2>&1 || true
	fi
	if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1 &&
		command -v etcd >/dev/null 2>&1; then
		# The package starts a system etcd on 2379; the tests start their own on free ports.
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
		say "etcd: installed $(command -v etcd)"
	else
		miss "etcd: apt-get install etcd-server failed"
	fi
}

# --- kube-apiserver, built from the k8s.io/kubernetes module -------------------------------
# The module's go.mod points its k8s.io/* staging modules at ./staging/src/..., which the
# module zip does not hold: drop those replace lines and require the published v0.X.Y of
# each instead (v1.37.2 -> v0.37.2), delete vendor/, build with -mod=mod.
build_apiserver() {
	local dir="$CACHE/$KUBE_VERSION" bin="$CACHE/$KUBE_VERSION/kube-apiserver"
	if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$KUBE_VERSION\$"; then
		say "kube-apiserver: $bin"
		return
	fi
	if ! command -v "$GO" >/dev/null 2>&1; then
		miss "kube-apiserver: no Go toolchain ($GO) to build it"
		return
	fi
	mkdir -p "$dir" || { miss "kube-apiserver: cannot create $dir"; return; }
	(
		# One build at a time per cache; a second caller waits and then finds the binary.
		exec 9>"$dir/.lock"
		flock 9
		if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$KUBE_VERSION\$"; then exit 0; fi
		set -e
		export GOFLAGS=-mod=mod
		local staged="v0.${KUBE_VERSION#v1.}" src="$dir/src" log="$dir/build.log"
		say "kube-apiserver: building $KUBE_VERSION from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log $log)"
		: >"$log"
		modjson=$("$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" 2>>"$log") || {
			printf '%s\n' "$modjson" >>"$log"
			exit 1
		}
		moddir=$(printf '%s\n' "$modjson" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -d "$moddir" ] || { printf 'no Dir in go mod download output:\n%s\n' "$modjson" >>"$log"; exit 1; }
		rm -rf "$src"
		cp -r "$moddir" "$src"
		chmod -R u+w "$src"
		cd "$src"
		rm -rf vendor go.work go.work.sum
		grep '=> ./staging' go.mod | awk '{print $1}' >staged.txt
		sed -i '/=> .\/staging/d' go.mod
		while read -r m; do
			sed -i "s#^\([[:space:]]*\)$m v0.0.0\$#\1$m $staged#" go.mod
		done <staged.txt
		ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
		ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
		"$GO" build -ldflags "$ldflags" -o "$bin.tmp" ./cmd/kube-apiserver >>"$log" 2>&1
		mv "$bin.tmp" "$bin"
		cd "$dir"
		rm -rf "$src"
	)
	# (not "( ... ) || true": that would switch set -e off inside)
	if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$KUBE_VERSION\$"; then
		say "kube-apiserver: $bin"
	else
		rm -f "$bin.tmp"
		miss "kube-apiserver: download or build of k8s.io/kubernetes@$KUBE_VERSION failed (see $dir/build.log)"
	fi
}

install_etcd
build_apiserver
exit "$missing"
