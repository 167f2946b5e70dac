#!/usr/bin/env bash
# Installs what kvserve needs to build and test, with apt, only when something is missing.
# With the argument "fuzz", also what `make fuzz` needs (clang and libFuzzer).
# Uses sudo when not root. Does nothing (and touches no network) when everything is present.
set -euo pipefail

# libzmq3-dev, libmsgpack-dev: KV-cache events; python3-zmq, -msgpack, -xxhash: the e2e event subscriber;
# python3-jsonschema: the JSON Schema validator of the constrained tool-call tests (e2e_tool_choice);
# python3-yaml: the deploy/k8s manifests' test.
pkgs=(build-essential cmake pkg-config libuv1-dev libcjson-dev libcriterion-dev node-llhttp
      libpcre2-dev libxxhash-dev libzmq3-dev libmsgpack-dev nodejs npm python3 python3-zmq python3-msgpack
      python3-xxhash python3-jsonschema python3-yaml chromium)
# Wanted but not required: without them the tests that need them say SKIPPED (chromium: the chat page's
# browser test). A failure to install them is a warning, not an error.
optional=(chromium)
# `install-deps.sh fuzz` (make fuzz): clang 14 and its sanitizer/libFuzzer runtimes as well.
if [ "${1:-}" = "fuzz" ]; then
  pkgs+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # nodejs/npm may come from somewhere other than Debian's packages: accept working binaries.
    case "$p" in
      nodejs) command -v node >/dev/null 2>&1 && continue ;;
      npm) command -v npm >/dev/null 2>&1 && continue ;;
    esac
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
required=()
wanted=()
for p in "${missing[@]}"; do
  if [[ " ${optional[*]} " == *" $p "* ]]; then wanted+=("$p"); else required+=("$p"); fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    if [ ${#required[@]} -eq 0 ]; then
      echo "install-deps: warning: ${wanted[*]} missing and not root, and no sudo: the tests needing them skip" >&2
      exit 0
    fi
    echo "install-deps: missing packages (${required[*]}) and not root, and no sudo" >&2; exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
if [ ${#required[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${required[@]}"
fi
if [ ${#wanted[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${wanted[@]}" ||
    echo "install-deps: warning: could not install ${wanted[*]}: the tests needing them skip" >&2
fi
