# The operator's image: the static `lanepool` binary and a CA bundle (for https Prometheus and
# API servers), nothing else: no shell, no package manager, no libc to patch.
#
# The build context is a directory holding the two files, prepared by images/build.sh
# (target/images/context/lanepool/): `lanepool`, built for the image's architecture with
#     RUSTFLAGS="-C target-feature=+crt-static" \
#       cargo build --release --target x86_64-unknown-linux-gnu --bin lanepool
# and `ca-certificates.crt`, the build machine's /etc/ssl/certs/ca-certificates.crt. Nothing is
# pulled, so the image builds offline, with buildah, podman or docker:
#     docker build -f images/lanepool.Dockerfile -t ghcr.io/lanepool/lanepool:0.1.0 \
#       target/images/context/lanepool
FROM scratch

ARG VERSION=unknown
LABEL org.opencontainers.image.title="lanepool" \
      org.opencontainers.image.description="The lanepool operator: sizes the reserved and shared workers of each LanePool" \
      org.opencontainers.image.source="https://github.com/lanepool/lanepool" \
      org.opencontainers.image.version="${VERSION}"

# Where rustls-native-certs (openssl-probe) looks first on Linux.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY lanepool /lanepool

# The chart's runAsUser and runAsGroup; files stay root's, so the process can change none.
USER 65532:65532
ENTRYPOINT ["/lanepool"]
CMD ["run"]
