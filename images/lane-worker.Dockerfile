# The example lane worker's image (examples/lane_worker.rs, the image examples/lanepool.yaml
# runs): the static binary alone. It speaks plain HTTP to its queue, so it carries no CA bundle.
#
# The build context is a directory holding `lane-worker`, prepared by images/build.sh
# (target/images/context/lane-worker/) from
#     RUSTFLAGS="-C target-feature=+crt-static" \
#       cargo build --release --target x86_64-unknown-linux-gnu --example lane_worker
# and builds offline with buildah, podman or docker:
#     docker build -f images/lane-worker.Dockerfile -t ghcr.io/lanepool/lane-worker:0.1.0 \
#       target/images/context/lane-worker
FROM scratch

ARG VERSION=unknown
LABEL org.opencontainers.image.title="lane-worker" \
      org.opencontainers.image.description="lanepool's example lane worker: takes jobs from its lanes in order, finishes the one it holds on SIGTERM" \
      org.opencontainers.image.source="https://github.com/lanepool/lanepool" \
      org.opencontainers.image.version="${VERSION}"

COPY lane-worker /lane-worker

USER 65532:65532
ENTRYPOINT ["/lane-worker"]
