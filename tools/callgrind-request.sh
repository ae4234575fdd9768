#!/bin/sh
# callgrind-request.sh: instructions per request of the 100K-token chat
# request path (BenchmarkRequestCPU in internal/proxy: JSON, chat template,
# tokens, block keys, kv decision), a figure that does not depend on how
# busy the machine is.
#
#   tools/callgrind-request.sh [N1 N2]     benchmark sizes (default 2 6)
#
# Each case runs whole under callgrind twice, with N1 and N2 requests; the
# count per request is the difference over N2-N1, so loading the tokenizer
# and the warm-up cancel out. (Counting inside the measured function with
# --toggle-collect gave counts 1.5-2x apart between identical runs.) A
# continuation's iteration also routes its conversation's previous turn
# (a new conversation) untimed, so its figure is its difference minus the
# new-conversation figure. Per iteration both also build the request body
# (copies of 518 KB, small beside the request).
#
# Needs valgrind (Debian: apt-get install valgrind). Go's asynchronous
# preemption signals are off (GODEBUG=asyncpreemptoff=1: valgrind does not
# deliver them as the runtime expects), so are the garbage collector
# (GOGC=off: the count is the request path's own work, not GC work that
# depends on the heap earlier requests left) and other Ps (GOMAXPROCS=1).
# With CG_GOGC=100 the collector runs and its work is counted too, as it is
# in a running router; its cycles fall where they fall, so give it more
# requests (tools/callgrind-request.sh 4 44).
set -eu
gogc=${CG_GOGC:-off}
n1=${1:-2}
n2=${2:-6}
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/proxy.test" ./internal/proxy/
count() { # case n: total instructions of one run
	(cd internal/proxy && GODEBUG=asyncpreemptoff=1 GOGC=$gogc GOMAXPROCS=1 valgrind --tool=callgrind \
		--callgrind-out-file="$tmp/cg.$1.$2" "$tmp/proxy.test" -test.run '^$' \
		-test.bench "RequestCPU/conv=$1/" -test.benchtime "$2x" -test.count 1 >"$tmp/out.$1.$2" 2>&1) || {
		cat "$tmp/out.$1.$2" >&2
		exit 1
	}
	sed -n 's/^summary: *//p' "$tmp/cg.$1.$2"
}
for c in new continue; do
	count $c "$n1" >"$tmp/ir.$c.1" &
	count $c "$n2" >"$tmp/ir.$c.2" &
	wait
	echo $(( ($(cat "$tmp/ir.$c.2") - $(cat "$tmp/ir.$c.1")) / (n2 - n1) )) >"$tmp/per.$c"
done
new=$(cat "$tmp/per.new")
cont=$(( $(cat "$tmp/per.continue") - new ))
echo "conv=new: $new instructions per request"
echo "conv=continue: $cont instructions per request (iteration $(cat "$tmp/per.continue") minus a new conversation)"
