#!/usr/bin/env bash
# Installs what kvserve needs to build and test, with apt, only when something is missing.
# Uses sudo when not root. Does nothing (and touches no network) when everything is present.
set -euo pipefail

# libzmq3-dev, libmsgpack-dev: KV-cache events; python3-zmq, -msgpack, -xxhash: the e2e event subscriber.
pkgs=(build-essential cmake pkg-config libuv1-dev libcjson-dev libcriterion-dev node-llhttp
      libpcre2-dev libxxhash-dev libzmq3-dev libmsgpack-dev nodejs npm python3 python3-zmq python3-msgpack python3-xxhash)

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

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root, and no sudo" >&2; exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
