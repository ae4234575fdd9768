#!/bin/sh
# callgrind-request.sh: instructions per request of the 100K-token chat
# request path (BenchmarkRequestCPU in internal/proxy: JSON, chat template,
# tokens, block keys, kv decision), a figure that does not depend on how
# busy the machine is. Only the measured requests are counted
# (--toggle-collect on measuredRequest); set-up and the untimed warm-up
# requests are not.
#
#   tools/callgrind-request.sh [N]     N requests per case (default 5)
#
# Needs valgrind (Debian: apt-get install valgrind). Go's asynchronous
# preemption signals are turned off (GODEBUG=asyncpreemptoff=1): valgrind
# does not deliver them as the runtime expects. The garbage collector is
# off too (GOGC=off; the run allocates about 10 MB per request), so the
# count is the request path's own work, not GC assists that depend on
# the heap the earlier requests left.
set -eu
n=${1:-5}
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/proxy.test" ./internal/proxy/
for c in new continue; do
	(cd internal/proxy && GODEBUG=asyncpreemptoff=1 GOGC=off valgrind --tool=callgrind \
		--callgrind-out-file="$tmp/cg.$c" --collect-atstart=no \
		--toggle-collect='kvrouter/internal/proxy.measuredRequest' \
		"$tmp/proxy.test" -test.run '^$' -test.bench "RequestCPU/conv=$c/" \
		-test.benchtime "${n}x" -test.count 1 >"$tmp/out.$c" 2>"$tmp/err.$c") || {
		cat "$tmp/err.$c" >&2
		exit 1
	}
	ir=$(sed -n 's/^summary: *//p' "$tmp/cg.$c")
	# The benchmark runs once with b.N=1 before the N run: N+1 measured requests.
	echo "conv=$c: $ir instructions over $((n + 1)) requests: $((ir / (n + 1))) per request"
done
