# syntax=docker/dockerfile:1
#
# The natsmesh image: meshd (the entrypoint) and meshctl on distroless.
#
#   docker build -t natsmesh/meshd:dev .
#   docker run --rm natsmesh/meshd:dev --help
#
# compose.yaml builds this image for its mesh-N services. The project's CI
# machine has no Docker engine, so this file is never built there;
# cmd/meshd/compose_test.go checks it only as text (that it builds
# ./cmd/meshd and ./cmd/meshctl, that ENTRYPOINT is meshd, and that EXPOSE
# matches the --http port compose.yaml uses). Build it on a workstation.

# Build on the builder's own platform and cross-compile (pure Go, no cgo),
# so multi-platform builds (docker buildx --platform ...) need no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/meshd ./cmd/meshctl

# static-debian12 has CA certificates, tzdata and /etc/passwd, and no shell:
# there is nothing to run a Docker HEALTHCHECK with, so probe meshd's
# /healthz and /readyz on port 7070 from outside (compose, Kubernetes).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/meshd /out/meshctl /usr/local/bin/
# In a container the HTTP server must listen beyond loopback (meshd's own
# default is 127.0.0.1:7070). The embedded NATS server, used only without
# --nats-url, keeps its store under the nonroot user's home.
ENV MESHD_HTTP=0.0.0.0:7070 \
    MESHD_DATA_DIR=/home/nonroot/meshd-data
USER nonroot:nonroot
WORKDIR /home/nonroot
# /metrics, /healthz, /readyz
EXPOSE 7070
ENTRYPOINT ["/usr/local/bin/meshd"]
