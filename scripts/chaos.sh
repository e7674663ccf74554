#!/bin/sh
# Runs the nemesis (integration.TestNemesis, issue 21) with a seed for a
# duration: a 3-server NATS cluster and three test-node processes under a
# fault schedule generated from SEED (node SIGKILL, SIGSTOP/SIGCONT past the
# fencing delay, lame-duck restarts and SIGKILLs of NATS servers, link cuts,
# slow links, route cuts that isolate a server),
# a recorded workload of Deliver/Request lanes and kv registers, then every
# history checker of internal/nemesis. The same seed replays the same
# schedule. Exits non-zero when any check fails; the history (and the
# Porcupine visualization of a non-linearizable kv address) is left in
# OUTDIR, or in a temporary directory the failure names, with every NATS
# server's and node process's log in its logs/ folder, one file a start
# (e.g. logs/mesh-0.2.log: server mesh-0's second start).
#
# Usage: scripts/chaos.sh SEED DURATION [OUTDIR]
#   SEED      an unsigned integer (CI runs 2104 for 44s)
#   DURATION  how long faults are injected, as a Go duration: 90s, 30m
# Environment: NATSMESH_CHAOS_FAULTS (comma-separated fault kinds, default
# all: node-kill,node-freeze,server-lame-duck,server-kill,link-cut,
# leader-kill,node-drain,link-slow,route-cut),
# NATSMESH_CHAOS_IDLE (the nodes' idle timeout, a Go duration, e.g. 30ms:
# activations are collected between deliveries, racing each collection's
# claim release against the next delivery's claim; default 5 min),
# NATSMESH_CHAOS_TIMEOUT (go test -timeout, default 4h),
# NATSMESH_PLANT (comma-separated bugs of internal/plant, e.g. skip-dedupe:
# the run builds with the natsmesh_plant tag, nodes and sender alike, and
# the checks that guard those bugs are expected to fail — RELIABILITY.md,
# "Proof the checkers bite").
#
# Faults come in rounds, each a shuffled list of every kind asked for, so a
# run covers all nine kinds once its schedule holds nine faults: the ninth
# starts 34–60 s in, depending on the seed (the test prints the schedule
# before it starts; CI's seed 2104 needs 44 s).
#
# Run from the repository root.
set -eu
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
	echo "usage: $0 SEED DURATION [OUTDIR]" >&2
	exit 2
fi
NATSMESH_CHAOS_SEED=$1
NATSMESH_CHAOS_DURATION=$2
export NATSMESH_CHAOS_SEED NATSMESH_CHAOS_DURATION
if [ $# -eq 3 ]; then
	NATSMESH_CHAOS_OUT=$3
	export NATSMESH_CHAOS_OUT
fi
if [ -n "${NATSMESH_PLANT:-}" ]; then
	exec go test -tags natsmesh_plant ./integration -run '^TestNemesis$' -count=1 -v -timeout "${NATSMESH_CHAOS_TIMEOUT:-4h}"
fi
exec go test ./integration -run '^TestNemesis$' -count=1 -v -timeout "${NATSMESH_CHAOS_TIMEOUT:-4h}"
