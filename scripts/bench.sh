#!/bin/sh
# Regenerates the figures of BENCHMARKS.md "Windowed lanes": the mesh and raw
# NATS side by side in one run on an in-process nats-server, plus CPU
# profiles of the mesh rows. Usage: scripts/bench.sh [outdir] [benchtime]
# (run from the repository root; default outdir $TMPDIR/natsmesh-bench, benchtime 2s).
set -eu
out=${1:-${TMPDIR:-/tmp}/natsmesh-bench}
bt=${2:-2s}
mkdir -p "$out"
go test -run '^$' -bench 'Sequential$|SequentialRequest|Concurrent256|OneLane256|OneLanePipelined' -benchmem -benchtime "$bt" ./mesh/ | tee "$out/mesh.txt"
go test -run '^$' -bench 'StreamFrames' -benchtime 20000x ./mesh/syncstream/ | tee "$out/stream.txt"
for b in OneLane256/mesh Concurrent256/mesh 'Sequential/mesh'; do
	f=$(echo "$b" | tr '/' '_')
	go test -run '^$' -bench "$b" -benchtime "$bt" -cpuprofile "$out/$f.cpu" -o "$out/mesh.test" ./mesh/ >/dev/null
	go tool pprof -top -nodecount 25 "$out/mesh.test" "$out/$f.cpu" > "$out/$f.top" 2>/dev/null
done
