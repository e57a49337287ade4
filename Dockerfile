# tccd in a container: built with the project's own scripts, run as a
# non-root user with the kernel cache on a volume.
#
#   docker build -t tccd .
#   docker run -p 7311:7311 -v tccd-cache:/var/cache/tccd tccd
#
# ---- build stage: scripts/setup installs the toolchain and builds build/
FROM debian:12 AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates sudo \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN rm -rf build build-* .venv && scripts/setup \
    && meson install -C build --destdir /staging --no-rebuild >/dev/null

# ---- runtime stage: the daemon, the CLI, and a C compiler for CPU kernels
FROM debian:12
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        gcc libc6-dev libopenblas-dev libdnnl-dev libgomp1 libgrpc29 libprotobuf-c1 libuv1 libsqlite3-0 libsodium23 libcjson1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/tccd --shell /usr/sbin/nologin tccd \
    && mkdir -p /var/cache/tccd && chown tccd:tccd /var/cache/tccd
COPY --from=build /staging/usr/local /usr/local
USER tccd
ENV TCCD_LISTEN=0.0.0.0:7311 \
    TCCD_CACHE_DIR=/var/cache/tccd
VOLUME ["/var/cache/tccd"]
EXPOSE 7311
HEALTHCHECK --interval=30s --timeout=5s CMD ["tcctl", "--addr", "127.0.0.1:7311", "health"]
ENTRYPOINT ["tccd"]
