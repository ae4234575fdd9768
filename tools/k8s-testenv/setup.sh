#!/usr/bin/env bash
# Installs what the Kubernetes tests need (internal/k8stest): Debian's etcd-server and a
# kube-apiserver built from the k8s.io/kubernetes module through the Go module proxy; for the
# real-node tests (a kubelet running Pods) also kube-controller-manager, kube-scheduler and
# kubelet built the same way, and Debian's containerd, runc, containernetworking-plugins and
# iptables.
#
# Idempotent: packages are installed once; the binaries are cached outside the repo under
# $KVROUTER_K8S_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter/k8s), keyed by
# version, so a second run takes seconds. The first kube-apiserver build takes about 6 minutes
# of CPU; the other three about 3 more with its Go build cache.
#
# Each step that cannot be done prints one line "k8s-testenv: missing ..." and the script
# exits 1 at the end; the tests then skip (or fail with KVROUTER_K8S_REQUIRED=1).
#
# Environment: KUBE_VERSION (default v1.37.2), KVROUTER_K8S_CACHE, GO (default go),
# K8S_NO_NODE=1 (only etcd and kube-apiserver).
set -u

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
CACHE="${KVROUTER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter/k8s}"
GO="${GO:-go}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
missing=0

say() { echo "k8s-testenv: $*"; }
miss() { say "missing $*"; missing=1; }

# apt_cmd CMD PKG: installs Debian's PKG unless CMD is on PATH (or, for a path, exists).
apt_cmd() {
	local cmd="$1" pkg="$2"
	have() { case "$cmd" in /*) [ -e "$cmd" ] ;; *) command -v "$cmd" >/dev/null 2>&1 ;; esac; }
	if have; then
		say "$pkg: $cmd"
		return
	fi
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		miss "$pkg: $cmd not installed (as root: apt-get install $pkg)"
		return
	fi
	if ! apt-cache show "$pkg" >/dev/null 2>&1; then
		apt-get update -qq >/dev/null 2>&1 || true
	fi
	if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 && have; then
		say "$pkg: installed $cmd"
	else
		miss "$pkg: apt-get install $pkg failed"
	fi
}

# install_node_packages: what the kubelet runs Pods with. The containerd package may start a
# system containerd; the tests run their own (own socket, root and state directories).
install_node_packages() {
	apt_cmd containerd containerd
	if command -v systemctl >/dev/null 2>&1; then systemctl disable --now containerd >/dev/null 2>&1 || true; fi
	apt_cmd runc runc
	apt_cmd /usr/lib/cni/bridge containernetworking-plugins
	apt_cmd iptables iptables
}

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

# --- kube-apiserver and the node's components, built from the k8s.io/kubernetes module ------
# The module's go.mod points its k8s.io/* staging modules at ./staging/src/..., which the
# module zip does not hold: drop those replace lines and require the published v0.X.Y of
# each instead (v1.37.2 -> v0.37.2), delete vendor/, build with -mod=mod.

# built NAME: NAME is in the cache at KUBE_VERSION.
built() {
	local bin="$CACHE/$KUBE_VERSION/$1"
	[ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$KUBE_VERSION\$"
}

# build_kube ANNOUNCE NAME...: builds the missing ones of NAME (cmd/NAME of the module) into
# the cache; ANNOUNCE is called with the build log's path to print the start line.
build_kube() {
	local announce="$1" dir="$CACHE/$KUBE_VERSION"
	shift
	local names=("$@") todo=() n
	for n in "${names[@]}"; do built "$n" || todo+=("$n"); done
	if [ "${#todo[@]}" = 0 ]; then
		for n in "${names[@]}"; do say "$n: $dir/$n"; done
		return
	fi
	if ! command -v "$GO" >/dev/null 2>&1; then
		miss "${todo[*]}: no Go toolchain ($GO) to build them"
		return
	fi
	mkdir -p "$dir" || { miss "${todo[*]}: cannot create $dir"; return; }
	(
		# One build at a time per cache; a second caller waits and then finds the binaries.
		exec 9>"$dir/.lock"
		flock 9
		todo=()
		for n in "${names[@]}"; do built "$n" || todo+=("$n"); done
		[ "${#todo[@]}" = 0 ] && exit 0
		set -e
		export GOFLAGS=-mod=mod
		local staged="v0.${KUBE_VERSION#v1.}" src="$dir/src" log="$dir/build.log" pkgs=()
		"$announce" "$log"
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
		mkdir -p "$dir/.new"
		for n in "${todo[@]}"; do pkgs+=("./cmd/$n"); done
		"$GO" build -ldflags "$ldflags" -o "$dir/.new/" "${pkgs[@]}" >>"$log" 2>&1
		for n in "${todo[@]}"; do mv "$dir/.new/$n" "$dir/$n"; done
		cd "$dir"
		rm -rf "$src" "$dir/.new"
	)
	# (not "( ... ) || true": that would switch set -e off inside)
	rm -rf "$dir/.new"
	for n in "${names[@]}"; do
		if built "$n"; then
			say "$n: $dir/$n"
		else
			miss "$n: download or build of k8s.io/kubernetes@$KUBE_VERSION failed (see $dir/build.log)"
		fi
	done
}

announce_apiserver() {
	local log="$1"
	say "kube-apiserver: building $KUBE_VERSION from the k8s.io/kubernetes module (about 6 min of CPU, 6-10 min on 2 cores; log $log)"
}

announce_node() {
	local log="$1"
	say "kubelet, kube-scheduler and kube-controller-manager: building $KUBE_VERSION from the k8s.io/kubernetes module (about 3 min of CPU after kube-apiserver's build, 3-8 min on 2 cores; log $log)"
}

install_etcd
build_kube announce_apiserver kube-apiserver
if [ "${K8S_NO_NODE:-}" != 1 ]; then
	install_node_packages
	build_kube announce_node kubelet kube-scheduler kube-controller-manager
fi
exit "$missing"
