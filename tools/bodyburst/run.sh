#!/bin/bash
# run.sh KVROUTER_BINARY PORT SIZE [BODYBURST FLAGS]: start "kvrouter serve"
# on 127.0.0.1:PORT (one unreachable engine: bodies are read before any
# engine is asked), run bodyburst with 64 uploads of SIZE bytes against it
# (further flags, e.g. -n 32 -send 60, override), stop it.
set -e
bin=$1; port=$2; size=$3
dir=$(cd "$(dirname "$0")" && pwd)
"$bin" serve --listen 127.0.0.1:$port --model m --engine http://127.0.0.1:1 --tokenizer none --log-level error &
pid=$!
for i in $(seq 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
echo "== $bin size=$size pid=$pid"
go run "$dir" -addr 127.0.0.1:$port -n 64 -size $size -pid $pid "${@:4}"
kill $pid; wait $pid || true
