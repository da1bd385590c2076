# syntax=docker/dockerfile:1
# netcm's container image: a release build on the Rust image, copied into distroless (glibc + libgcc, no
# shell, no package manager) and run as the distroless non-root user. The chart overrides the user only for
# the route-controller's host-network modes, which need root with NET_ADMIN as their only capability.
#
#   docker build -t ghcr.io/netcm/netcm:0.1.0 .
#
# Debian bookworm on both sides, so the binary's glibc matches the runtime's.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The whole workspace: cargo needs every member's manifest (e2e too) to resolve the lock file.
COPY Cargo.toml Cargo.lock ./
COPY cmd ./cmd
COPY pkg ./pkg
COPY controllers ./controllers
COPY e2e ./e2e
# jemalloc's settings are compiled in from here (cmd/netcm/src/main.rs says why jemalloc).
COPY .cargo ./.cargo
# tikv-jemalloc-sys builds jemalloc from its C sources with make, which the slim image lacks.
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p netcm --bin netcm \
    && install -D -m 0755 target/release/netcm /out/netcm

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="netcm" \
      org.opencontainers.image.description="A network controller manager for Kubernetes: pod CIDRs, flannel-format subnet leases, node routes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/netcm /usr/local/bin/netcm
# 65532 is distroless's "nonroot"; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 10271
ENTRYPOINT ["/usr/local/bin/netcm"]
