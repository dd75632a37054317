# The operator's image built from a checkout by a builder alone, nothing prepared on the machine:
# a Rust stage compiles the static `lanepool` binary, and the runtime stage is BASE with that
# binary and nothing else of the build. The repository's root is the context (.dockerignore
# sends only the sources):
#     docker build -f images/lanepool-from-source.Dockerfile --build-arg VERSION=0.1.0 \
#       -t registry.example.com/lanepool/lanepool:0.1.0 .
#     podman build -f images/lanepool-from-source.Dockerfile ... .
#     buildah bud -f images/lanepool-from-source.Dockerfile ... .
# images/build.sh builds the released image another way (images/lanepool.Dockerfile: the binary
# compiled on the machine, FROM scratch); both run as the chart runs them.
#
# BUILDER is the Rust toolchain (its gcc and libc for the static link; cargo fetches the crates of
# Cargo.lock, so the build needs crates.io). BASE is what the operator runs on: the binary is
# static, so any base works, but the operator trusts the CA bundle it finds at
# /etc/ssl/certs/ca-certificates.crt for an https Prometheus: distroless/static has one, scratch
# has none (put yours there, or use BASE=scratch only with a plain-http Prometheus).
ARG BUILDER=docker.io/library/rust:1.95-slim-bookworm
ARG BASE=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILDER} AS build
WORKDIR /src
# The workspace's manifests (testenv is a member: cargo reads it, and builds none of it here) and
# the operator's sources.
COPY Cargo.toml Cargo.lock ./
COPY testenv/Cargo.toml testenv/Cargo.toml
COPY testenv/src testenv/src
COPY src src
# Static for the builder's own target (the gnu target with crt-static, as images/build.sh builds
# it; a musl toolchain is static already), stripped: it runs on any BASE, scratch included.
RUN target=$(rustc -vV | sed -n 's/^host: //p') \
 && RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_RELEASE_STRIP=symbols \
      cargo build --release --locked --target "$target" --bin lanepool \
 && cp "target/$target/release/lanepool" /lanepool

FROM ${BASE}

ARG VERSION=unknown
LABEL org.opencontainers.image.title="lanepool" \
      org.opencontainers.image.description="The lanepool operator: sizes the reserved and shared workers of each LanePool" \
      org.opencontainers.image.source="https://github.com/lanepool/lanepool" \
      org.opencontainers.image.version="${VERSION}"

COPY --from=build /lanepool /lanepool

# The chart's runAsUser and runAsGroup, whatever BASE says; the binary stays root's, so the
# process can change nothing of it.
USER 65532:65532
ENTRYPOINT ["/lanepool"]
CMD ["run"]
