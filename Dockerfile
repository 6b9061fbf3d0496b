# coderq on Debian 12: build with CMake, run with Debian's librdkafka,
# libpq, libzmq and the Python kernel stack. Configuration comes only from
# the environment (see docs/CONFIGURATION.md); docker-compose.yml runs
# `coderq migrate` once and then `coderq worker`.
#
# Kernels run sandboxed: the worker runs as root inside the container so
# each kernel drops to a uid of its own (CODERQ_SANDBOX_UIDS) under
# bubblewrap, and with CODERQ_SANDBOX=on it refuses to start when the
# sandbox does not work. The container needs user namespaces and a fresh
# /proc for bubblewrap: see the worker's security_opt in
# docker-compose.yml, and `docker run ... coderq doctor` to check.
# fonts-noto-cjk: kernels' figures fall back to Noto Sans CJK for Chinese,
# Japanese and Korean text
# (docs/DEPLOYING.md#chinese-japanese-and-korean-text-in-figures).
FROM debian:12 AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
        build-essential cmake pkg-config ca-certificates \
        librdkafka-dev libcurl4-openssl-dev libjansson-dev libpq-dev \
        libzmq3-dev libssl-dev check libsubunit-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DCQ_WERROR=ON \
    && cmake --build /build -j"$(nproc)" --target coderq

FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        librdkafka1 libcurl4 libjansson4 libpq5 libzmq5 libssl3 \
        ca-certificates tini bubblewrap \
        python3 python3-ipykernel python3-jupyter-client python3-numpy \
        python3-pandas python3-matplotlib python3-nbformat python3-scipy \
        fonts-noto-cjk \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/coderq
COPY --from=build /build/coderq /usr/local/bin/coderq
# The migration runner reads the folder at the path it was built with.
COPY --from=build /src/migrations /src/migrations
# Fail closed: never run model code unsandboxed unless told to.
ENV CODERQ_SANDBOX=on CODERQ_SANDBOX_UIDS=auto
WORKDIR /var/lib/coderq
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/coderq"]
CMD ["worker"]
