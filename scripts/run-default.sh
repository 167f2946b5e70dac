#!/usr/bin/env bash
# run-default.sh KVSERVE_BINARY [SERVE OPTIONS...]
# Starts kvserve with the embedded default model (`make run`). The model is a deterministic random-weight
# GGUF that `kvserve mkmodel --preset default` writes to models/default.gguf (git-ignored) the first time.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 PATH/TO/kvserve [serve options...]" >&2
    exit 2
fi
bin=$1
shift
case "$bin" in
    */*)
        if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
            echo "$0: $bin is not an executable (build first: make build)" >&2
            exit 2
        fi
        bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin") ;;  # absolute, before changing directory
    *)
        if ! command -v "$bin" >/dev/null 2>&1; then
            echo "$0: $bin is not an executable (build first: make build)" >&2
            exit 2
        fi ;;
esac

cd "$(dirname "$0")/.."
mkdir -p models
if [ ! -f models/default.gguf ]; then
    echo "creating models/default.gguf (kvserve mkmodel --preset default)" >&2
    "$bin" mkmodel --preset default -o models/default.gguf
fi
exec "$bin" serve --config config/kvserve.json -m models/default.gguf "$@"
