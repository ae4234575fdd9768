#!/bin/sh
# expect.sh: kv's expected verdict per cell from the runs sweep.sh -d writes
# (OUTDIR/S-N-B-L-K-D.json: every cell at several seeds K and draws D).
#
#   tools/routing-sweep/expect.sh OUTDIR
#
# One run's verdict is one draw of the policies' random choices: where kv
# and session are level in expectation, it is a coin toss. This report
# judges each cell on all its runs instead. Per run it takes kv's hit rate
# minus session's (points), kv's goodput over the best of session,
# round_robin and least_load, and the log of kv's TTFT p99 over session's.
# Per seed it averages them over the draws (the same arrivals); per cell it
# gives the mean of the seeds' means and its standard error (se: their
# standard deviation over the square root of the number of seeds), so the
# seeds' different arrivals count in the scatter. A cell misses when the
# runs show kv worse beyond it: hit mean + 3 se < 0, goodput mean + 3 se <
# 0.99, or p99 log mean - 3 se > 0 (the p99 column shows exp of the mean).
# With one seed the se is 0. Needs jq.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
ls "$1"/*-*-*-*-*-*.json >/dev/null 2>&1 || { echo "$0: no runs with draws (S-N-B-L-K-D.json) in $1" >&2; exit 2; }
jq -rn '
def cell: input_filename | split("/") | last | rtrimstr(".json") | split("-");
def pol($n): .policies[] | select(.name == $n);
def run: {hit: ((pol("kv").hit_rate - pol("session").hit_rate) * 100),
	gp: (pol("kv").goodput_rps / ([pol("session", "round_robin", "least_load").goodput_rps] | max)),
	p99: ((pol("kv").ttft_ms.p99 / pol("session").ttft_ms.p99) | log)};
def stat(f): (map(f)) as $x | ($x | length) as $n | ($x | add / $n) as $m
	| {m: $m, se: (if $n < 2 then 0 else (($x | map((. - $m) * (. - $m)) | add) / ($n - 1) / $n | sqrt) end)};
def r($k): . * $k | round / $k;
[inputs | select((cell | length) == 6) | {c: cell, r: run}]
| group_by(.c[0:4])
| sort_by(.[0].c[0], (.[0].c[1] | tonumber), (if .[0].c[2] == "0" then 0 else 100000 - (.[0].c[2] | tonumber) end), (.[0].c[3] | tonumber))
| map(. as $g | ($g | group_by(.c[4]) | map(map(.r) | {hit: (map(.hit) | add / length),
		gp: (map(.gp) | add / length), p99: (map(.p99) | add / length)})) as $rs
	| {c: $g[0].c, n: ($g | length), seeds: ($rs | length),
	   hit: ($rs | stat(.hit)), gp: ($rs | stat(.gp)), p99: ($rs | stat(.p99))}
	| .miss = [ (if .hit.m + 3 * .hit.se < 0 then "hit" else empty end),
		(if .gp.m + 3 * .gp.se < 0.99 then "goodput" else empty end),
		(if .p99.m - 3 * .p99.se > 0 then "p99" else empty end) ])
| "cells met in expectation: \(map(select(.miss == [])) | length) of \(length) (runs per cell: \(map(.n) | unique | map(tostring) | join(", ")))", "",
  "| scenario | replicas | blocks | load | runs (seeds) | hit kv - session (points), mean (se) | goodput / best, mean (se) | TTFT p99 / session, mean (se of log) | met |",
  "|---|---:|---:|---:|---:|---:|---:|---:|---|",
  (.[] | "| \(.c[0]) | \(.c[1]) | \(if .c[2] == "0" then "27,000" else .c[2] end) | \(.c[3]) | \(.n) (\(.seeds)) | "
	+ "\(.hit.m | r(1000)) (\(.hit.se | r(1000))) | \(.gp.m | r(1000)) (\(.gp.se | r(1000))) | \(.p99.m | exp | r(100)) (\(.p99.se | r(1000))) | "
	+ (if .miss == [] then "yes" else "**no**: " + (.miss | join(", ")) end) + " |")
' "$1"/*.json
