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
    && meson install -C build --destdir /staging --no-rebuild >/dev/null \
    && mkdir -p .deps/cuda   # empty when NVRTC could not be installed: no CUDA target

# ---- runtime stage: the daemon, the CLI, a C compiler for CPU kernels
# (with the headers and libraries generated kernels link: OpenBLAS,
# oneDNN, OpenMP) and NVRTC for CUDA targets. Every shared library tccd
# and tcctl load must come from the packages below
# (tests/integration/test_container.py checks it without docker).
FROM debian:12
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        gcc libc6-dev libopenblas-dev libdnnl-dev libgomp1 libgrpc29 libprotobuf-c1 libuv1 libsqlite3-0 \
        libsodium23 libcjson1 libhiredis0.14 libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/tccd --shell /usr/sbin/nologin tccd \
    && mkdir -p /var/cache/tccd && chown tccd:tccd /var/cache/tccd
COPY --from=build /staging/usr/local /usr/local
# NVRTC from PyPI (scripts/setup-cuda), at the path the build recorded
COPY --from=build /src/.deps/cuda /src/.deps/cuda
COPY --from=build /src/scripts/tccd-healthcheck /usr/local/bin/tccd-healthcheck
USER tccd
ENV TCCD_LISTEN=0.0.0.0:7311 \
    TCCD_CACHE_DIR=/var/cache/tccd
VOLUME ["/var/cache/tccd"]
EXPOSE 7311
# tcctl health with the daemon's own TLS settings from the environment
# (see scripts/tccd-healthcheck); Health/Check needs no token.
HEALTHCHECK --interval=30s --timeout=5s CMD ["tccd-healthcheck"]
ENTRYPOINT ["tccd"]
