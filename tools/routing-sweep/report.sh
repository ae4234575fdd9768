#!/bin/sh
# report.sh: kv's verdict per cell and seed from the JSON files sweep.sh
# writes (OUTDIR/S-N-B-L-K.json).
#
#   tools/routing-sweep/report.sh OUTDIR [BEFORE_OUTDIR]
#
# A cell is met when kv's hit rate is at least session's, its goodput at
# least 0.99x the best of session, round_robin and least_load, and its TTFT
# p99 at most session's. A miss names what failed: hit (kv's hit rate minus
# session's, in points), goodput (kv's over the best baseline's), p99 (kv's
# over session's). "mean" applies the same rule to the metrics averaged over
# the seeds. With BEFORE_OUTDIR, each cell's row is preceded by that
# directory's (marked "before"). Needs jq.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [BEFORE_OUTDIR]" >&2; exit 2; }
jq -rn --arg before "${2:-}" '
def cell: input_filename | split("/") | last | rtrimstr(".json") | split("-");
def pol($n): .policies[] | select(.name == $n);
def m: {hit: (pol("kv").hit_rate), shit: (pol("session").hit_rate),
	gp: (pol("kv").goodput_rps),
	best: ([pol("session", "round_robin", "least_load").goodput_rps] | max),
	p99: (pol("kv").ttft_ms.p99), sp99: (pol("session").ttft_ms.p99)};
def verdict: [ (if .hit < .shit then "hit \((.hit - .shit) * 100 * 100 | round / 100)" else empty end),
	(if .gp < 0.99 * .best then "goodput \(.gp / .best * 1000 | round / 1000)x" else empty end),
	(if .p99 > .sp99 then "p99 \(.p99 / .sp99 * 100 | round / 100)x" else empty end) ]
	| if length == 0 then "yes" else "**no**: " + join(", ") end;
def avg(f): (map(f) | add / length);
[inputs | {c: cell, m: m}]
| group_by(.c[4]) as $byseed
| ($byseed | map("seed \(.[0].c[4]): \(map(select(.m | verdict == "yes")) | length) of \(length) met") | join("; ")) as $counts
| group_by(.c[0:4])
| sort_by(.[0].c[0], (.[0].c[1] | tonumber), (if .[0].c[2] == "0" then 0 else 100000 - (.[0].c[2] | tonumber) end), (.[0].c[3] | tonumber))
| map(. as $g | ($g | sort_by(.c[4] | tonumber)) as $s
	| ($s | map(.m) | {hit: avg(.hit), shit: avg(.shit), gp: avg(.gp), best: avg(.best), p99: avg(.p99), sp99: avg(.sp99)}) as $mean
	| "| \($g[0].c[0]) | \($g[0].c[1]) | \(if $g[0].c[2] == "0" then "27,000" else $g[0].c[2] end) | \($g[0].c[3]) | "
	  + ($s | map(.m | verdict) | join(" | "))
	  + " | \($mean.hit * 10000 | round / 100) / \($mean.shit * 10000 | round / 100) | \($mean.gp / $mean.best * 1000 | round / 1000)x | \($mean.p99 / $mean.sp99 * 100 | round / 100)x | \($mean | verdict) |")
| ("cells met: " + $counts), "",
  "| scenario | replicas | blocks | load | " + ([range(0; ($byseed | length))] | map("seed \(. + 1)") | join(" | ")) + " | mean hit kv / session (%) | mean goodput / best | mean p99 / session | mean met |",
  "|---|---:|---:|---:|" + ([range(0; ($byseed | length))] | map("---") | join("|")) + "|---|---|---|---|",
  .[]
' "$1"/*.json
