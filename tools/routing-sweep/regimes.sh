#!/bin/sh
# regimes.sh: kv against round_robin, least_load and session in every other
# regime of docs/routing.md, at the scenarios' default loads.
#
#   tools/routing-sweep/regimes.sh [-b KVROUTER] [-r ROUTING.yaml] [-s "1"] [-j 2] OUTDIR
#
# Each regime (8 replicas unless named):
#
#   kvrouter sim --scenario S [--replicas N] --seed K \
#     --policies round_robin,least_load,session,kv --pooled-bound=false --json
#
# for mooncake (8 and 32 replicas), saturation, unique, hot_prefix,
# scale_out, lora_mix, long_prompt, shared_prefix and multi_turn, and the
# P/D arrangements (--scenario mooncake --pd-prefill 4, kv routing). Prints
# per regime and seed kv's hit rate and goodput and its goodput over the
# best baseline's (P/D: each arrangement's goodput). Runs -j at a time under
# nice -n 19, one JSON file per run in OUTDIR, the summary in
# OUTDIR/report.txt. Needs jq.
set -eu
bin= routing= seeds=1 jobs=2
while getopts b:r:s:j: o; do
	case $o in
	b) bin=$OPTARG ;;
	r) routing=$OPTARG ;;
	s) seeds=$OPTARG ;;
	j) jobs=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "usage: $0 [-b KVROUTER] [-r ROUTING.yaml] [-s SEEDS] [-j JOBS] OUTDIR" >&2; exit 2; }
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
	for r in mooncake:8 mooncake:32 saturation:8 unique:8 hot_prefix:8 scale_out:8 lora_mix:8 \
		long_prompt:8 shared_prefix:8 multi_turn:8 pd:8; do
		echo "${r%%:*} ${r##*:} $k"
	done
done | xargs -P "$jobs" -L 1 sh -c '
	out=$0 bin=$1 extra=$2 s=$3 n=$4 k=$5
	f="$out/$s-$n-$k.json"
	if [ "$s" = pd ]; then
		set -- --scenario mooncake --pd-prefill 4
	else
		set -- --scenario "$s" --policies round_robin,least_load,session,kv
	fi
	nice -n 19 "$bin" sim --replicas "$n" --seed "$k" --pooled-bound=false --json $extra "$@" >"$f.tmp" &&
		mv "$f.tmp" "$f"' "$out" "$bin" "$extra"
jq -rn '
def pol($n): .policies[] | select(.name == $n);
[inputs | {f: (input_filename | split("/") | last | rtrimstr(".json")), r: .}]
| sort_by(.f)[]
| if (.f | startswith("pd-")) then
	"\(.f): " + (.r.policies | map("\(.name) \(.goodput_rps * 100 | round / 100) req/s, hit \(.hit_rate * 10000 | round / 100) %") | join("; "))
  else (.r | [pol("session", "round_robin", "least_load")] | max_by(.goodput_rps)) as $b
	| (.r | pol("kv")) as $kv
	| "\(.f): kv hit \($kv.hit_rate * 10000 | round / 100) %, goodput \($kv.goodput_rps * 100 | round / 100) req/s, best baseline \($b.name) \($b.goodput_rps * 100 | round / 100): \($kv.goodput_rps / $b.goodput_rps * 10000 | round / 10000)x"
  end' "$out"/*.json | tee "$out/report.txt"
