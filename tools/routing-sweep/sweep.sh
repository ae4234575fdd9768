#!/bin/sh
# sweep.sh: the routing sweep of docs/routing.md ("Conversations and cache
# pressure") at several seeds, with kv's verdict per cell and seed.
#
#   tools/routing-sweep/sweep.sh [-b KVROUTER] [-r ROUTING.yaml] [-k BASE_OUTDIR] [-s "1 2 3"] [-d "1 2 3 4"] [-j 2] OUTDIR
#
# Runs every cell (multi_turn and shared_prefix; 4 and 8 replicas; the
# profile's cache, 4,000 and 2,000 blocks; loads 0.5, 1, 1.5) at every seed:
#
#   kvrouter sim --scenario S --replicas N --num-gpu-blocks B --load L --seed K \
#     --policies round_robin,least_load,session,kv --pooled-bound=false --json
#
# -j at a time under nice -n 19, one JSON file per run in OUTDIR, then prints the
# report of report.sh (OUTDIR/report.md). A -r file (routing.Config YAML)
# goes to every run; it changes kv (the baselines take no kv weights).
# With -k, only kv runs (--policies kv, a third of the CPU) and each file
# takes round_robin, least_load and session from BASE_OUTDIR's file of the
# same cell and seed (an earlier full sweep): the simulator runs each policy
# on its own fleet from the same arrivals, so kv's numbers do not depend on
# which other policies ran. With -d, every cell and seed runs at each draw
# D listed (kvrouter sim --draw D: the same arrivals with other tie-breaks
# and conversation ids; draw 0 is the seed's own run; files
# S-N-B-L-K-D.json; not with -k) and the report is expect.sh's, which
# judges each cell on expected values. Without -b it builds ./cmd/kvrouter
# into OUTDIR.
set -eu
bin= routing= seeds="1 2 3" jobs=2 base= draws=
while getopts b:r:k:s:d:j: o; do
	case $o in
	b) bin=$OPTARG ;;
	r) routing=$OPTARG ;;
	k) base=$OPTARG ;;
	s) seeds=$OPTARG ;;
	d) draws=$OPTARG ;;
	j) jobs=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "usage: $0 [-b KVROUTER] [-r ROUTING.yaml] [-k BASE_OUTDIR] [-s SEEDS] [-d DRAWS] [-j JOBS] OUTDIR" >&2; exit 2; }
[ -z "$draws" ] || [ -z "$base" ] || { echo "$0: -d and -k do not combine" >&2; exit 2; }
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ -z "$bin" ]; then
	export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
	(cd "$here/../.." && go build -o "$out/kvrouter" ./cmd/kvrouter)
	bin=$out/kvrouter
fi
extra=
[ -z "$routing" ] || extra="--routing $routing"
for k in $seeds; do
	for s in multi_turn shared_prefix; do
		for n in 4 8; do
			for b in 0 4000 2000; do
				for l in 0.5 1 1.5; do
					if [ -z "$draws" ]; then
						echo "$s $n $b $l $k"
					else
						for d in $draws; do echo "$s $n $b $l $k $d"; done
					fi
				done
			done
		done
	done
done | xargs -P "$jobs" -L 1 sh -c '
	c="$4-$5-$6-$7-$8${9:+-$9}"
	f="$0/$c.json"
	if [ -z "$3" ]; then
		nice -n 19 "$1" sim --scenario "$4" --replicas "$5" --num-gpu-blocks "$6" --load "$7" --seed "$8" \
			--draw "${9:-0}" --policies round_robin,least_load,session,kv --pooled-bound=false --json $2 >"$f.tmp" &&
			mv "$f.tmp" "$f"
	else
		nice -n 19 "$1" sim --scenario "$4" --replicas "$5" --num-gpu-blocks "$6" --load "$7" --seed "$8" \
			--policies kv --pooled-bound=false --json $2 >"$f.kv" &&
			jq -s ".[0] * {policies: ([.[0].policies[] | select(.name != \"kv\")] + .[1].policies)}" \
				"$3/$c.json" "$f.kv" >"$f.tmp" && rm "$f.kv" && mv "$f.tmp" "$f"
	fi' "$out" "$bin" "$extra" "$base"
if [ -z "$draws" ]; then
	"$here/report.sh" "$out" | tee "$out/report.md"
else
	"$here/expect.sh" "$out" | tee "$out/report.md"
fi
