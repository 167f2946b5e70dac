# kvserve container image.
#   CPU (default):  podman build -t kvserve .
#   CUDA:           podman build -t kvserve:cuda --build-arg VARIANT=cuda \
#                     --build-arg BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#                     --build-arg RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04 .
# Models are mounted at /models:  podman run -p 8080:8080 -v ./models:/models kvserve -m /models/model.gguf
# Without -m the image serves its embedded random-weight default model (made by `kvserve mkmodel`).
ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
ARG VARIANT=cpu
ENV DEBIAN_FRONTEND=noninteractive
# msgpack-c: Debian 12 calls it libmsgpack-dev, newer releases libmsgpack-c-dev.
RUN apt-get update -qq \
 && msgpack=libmsgpack-dev; if apt-cache show libmsgpack-c-dev >/dev/null 2>&1; then msgpack=libmsgpack-c-dev; fi \
 && apt-get install -y -qq --no-install-recommends build-essential cmake pkg-config libuv1-dev libcjson-dev \
      libcriterion-dev node-llhttp libpcre2-dev libxxhash-dev libzmq3-dev $msgpack ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY cache cache
COPY engine engine
COPY cuda cuda
COPY template template
COPY grammar grammar
COPY server server
COPY tools tools
COPY bench bench
COPY tests/unit tests/unit
COPY config config
COPY web web
RUN cuda=OFF; if [ "$VARIANT" = cuda ]; then cuda=ON; fi \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVSERVE_CUDA=$cuda \
 && cmake --build build -j "$(nproc)" --target kvserve \
 && mkdir -p /out/models \
 && build/kvserve mkmodel --preset default -o /out/models/default.gguf \
 && install -m 0755 build/kvserve /out/kvserve

FROM ${RUNTIME_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && msgpack=libmsgpackc2; if apt-cache show libmsgpack-c2 >/dev/null 2>&1; then msgpack=libmsgpack-c2; fi \
 && apt-get install -y -qq --no-install-recommends libuv1 libcjson1 libpcre2-8-0 libxxhash0 libzmq5 $msgpack curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/kvserve --create-home kvserve \
 && mkdir -p /models /opt/kvserve
COPY --from=build /out/kvserve /usr/local/bin/kvserve
COPY --from=build /out/models/default.gguf /opt/kvserve/default.gguf
COPY config/kvserve.json /etc/kvserve/kvserve.json
USER kvserve
EXPOSE 8080
VOLUME ["/models"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["/usr/local/bin/kvserve", "serve", "--config", "/etc/kvserve/kvserve.json", "--host", "0.0.0.0"]
CMD ["-m", "/opt/kvserve/default.gguf"]
