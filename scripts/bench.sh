#!/bin/sh
# Regenerates the figures of BENCHMARKS.md "Windowed lanes" and "Hot path":
# the mesh and raw NATS side by side in one run on an in-process nats-server,
# CPU and allocation profiles of the mesh rows, and the two-process run
# (meshctl bench --baseline against a separate meshd).
#
# The p50 ratios of sequential Deliver and Request are read from
# BenchmarkPaired (mesh and raw interleaved call by call, so both see the
# same load); Sequential and SequentialRequest give allocations and each
# side's own run.
#
# Usage: scripts/bench.sh [outdir] [benchtime] [before-rev] [round1-rev]
# (run from the repository root; default outdir $TMPDIR/natsmesh-bench,
# benchtime 2s). With before-rev (e.g. a commit before a change), the
# benchmarks of that revision run interleaved with the working tree's, three
# rounds each, so that both see the same load on a shared machine. With
# round1-rev (the round-1 code, dd9f7c0), its StreamFrames runs in each
# round too: the sync-stream row is a ratio to it in the same minutes.
set -eu
out=${1:-${TMPDIR:-/tmp}/natsmesh-bench}
bt=${2:-2s}
before=${3:-}
round1=${4:-}
mkdir -p "$out"
benches='Sequential$|SequentialRequest|Paired|Concurrent256|OneLane256|OneLanePipelined'

go test -c -o "$out/mesh.test" ./mesh/
go test -c -o "$out/stream.test" ./syncstream/
if [ -n "$before" ]; then
	rm -rf "$out/before-src"
	mkdir -p "$out/before-src"
	git archive "$before" | tar -x -C "$out/before-src"
	# A revision from before BenchmarkPaired gets the working tree's
	# benchmarks file, so that its p50 ratios are measured the same way.
	grep -q 'func BenchmarkPaired' "$out/before-src/mesh/bench_test.go" || cp mesh/bench_test.go "$out/before-src/mesh/bench_test.go"
	(cd "$out/before-src" && go test -c -o "$out/mesh-before.test" ./mesh/ && go test -c -o "$out/stream-before.test" ./syncstream/)
fi
if [ -n "$round1" ]; then
	rm -rf "$out/round1-src"
	mkdir -p "$out/round1-src"
	git archive "$round1" | tar -x -C "$out/round1-src"
	(cd "$out/round1-src" && go test -c -o "$out/stream-round1.test" ./syncstream/)
fi

run() { # run <label> <binary> <args...>
	label=$1
	shift
	echo "== $label $(uptime)"
	"$@"
}
rounds=1
[ -n "$before" ] && rounds=3
i=0
while [ $i -lt $rounds ]; do
	i=$((i + 1))
	for v in after before; do
		[ "$v" = before ] && [ -z "$before" ] && continue
		m="$out/mesh.test" s="$out/stream.test"
		[ "$v" = before ] && m="$out/mesh-before.test" s="$out/stream-before.test"
		run "$v mesh round $i" "$m" -test.run '^$' -test.bench "$benches" -test.benchmem -test.benchtime "$bt"
		run "$v stream round $i" "$s" -test.run '^$' -test.bench 'StreamFrames$' -test.benchtime 200000x
		run "$v cold round $i" "$m" -test.run '^$' -test.bench ColdActivationConcurrent -test.benchtime 20000x
	done
	if [ -n "$round1" ]; then
		run "round-1 stream round $i" "$out/stream-round1.test" -test.run '^$' -test.bench 'StreamFrames$' -test.benchtime 20000x
	fi
done 2>&1 | tee "$out/bench.txt"

# Profiles of the after code: CPU for every row, allocations for the
# sequential one.
for b in 'Sequential$/mesh' 'SequentialRequest/mesh' 'Concurrent256/mesh' 'OneLane256/mesh' 'ColdActivationConcurrent'; do
	f=$(echo "$b" | tr -d '$' | tr '/' '_')
	bt2=$bt
	[ "$b" = ColdActivationConcurrent ] && bt2=20000x
	"$out/mesh.test" -test.run '^$' -test.bench "$b" -test.benchtime "$bt2" -test.cpuprofile "$out/$f.cpu" >/dev/null
	go tool pprof -top -nodecount 30 "$out/mesh.test" "$out/$f.cpu" >"$out/$f.top" 2>/dev/null
done
"$out/mesh.test" -test.run '^$' -test.bench 'Sequential$/mesh' -test.benchtime 20000x -test.memprofile "$out/seq.mem" -test.memprofilerate 1 >/dev/null
go tool pprof -sample_index=alloc_objects -top -nodecount 40 "$out/mesh.test" "$out/seq.mem" >"$out/seq.alloc.top" 2>/dev/null
"$out/stream.test" -test.run '^$' -test.bench 'StreamFrames$' -test.benchtime 200000x -test.cpuprofile "$out/stream.cpu" >/dev/null
go tool pprof -top -nodecount 30 "$out/stream.test" "$out/stream.cpu" >"$out/stream.top" 2>/dev/null

# Two processes: meshd (embedded NATS server, membership) and meshctl bench
# with its in-process raw responder as the baseline.
go build -o "$out/meshd" ./cmd/meshd
go build -o "$out/meshctl" ./cmd/meshctl
port=${BENCH_PORT:-14322}
rm -rf "$out/meshd-data"
"$out/meshd" --name bench --listen "127.0.0.1:$port" --http "" --data-dir "$out/meshd-data" --log-level warn >"$out/meshd.log" 2>&1 &
meshd=$!
trap 'kill $meshd 2>/dev/null || true' EXIT
n=0
until "$out/meshctl" -s "nats://127.0.0.1:$port" nodes >/dev/null 2>&1; do
	n=$((n + 1))
	[ $n -gt 100 ] && { echo "meshd did not start" >&2; exit 1; }
	sleep 0.1
done
{
	echo "== two processes $(uptime)"
	"$out/meshctl" -s "nats://127.0.0.1:$port" bench -n 20000 -c 1 --baseline
	"$out/meshctl" -s "nats://127.0.0.1:$port" bench -n 100000 -c 256 --baseline
} 2>/dev/null | tee "$out/two-process.txt"
kill $meshd
wait $meshd 2>/dev/null || true
