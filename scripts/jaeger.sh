#!/usr/bin/env bash
# Builds the Jaeger that the tracing end-to-end test (integration/jaeger_test.go)
# runs, from the tools module tools/jaeger, into the user cache path the test
# looks in (keyed by tools/jaeger/go.sum), unless it is there already. Prints
# the binary's path. The first build takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
sum=$(sha256sum tools/jaeger/go.sum | cut -c1-12)
bin="${XDG_CACHE_HOME:-$HOME/.cache}/natsmesh/jaeger-$sum/jaeger"
if [ ! -x "$bin" ]; then
  start=$(date +%s)
  (cd tools/jaeger && go mod download && go build -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger)
  echo "built in $(( $(date +%s) - start ))s" >&2
fi
echo "$bin"
