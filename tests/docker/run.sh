#!/usr/bin/env bash
# Builds the kvserve image with podman and smoke-tests the running container (make test-docker; make test
# runs it with --auto).
# No Docker engine here and no image registry: the Debian base image is made locally with debootstrap
# (minbase bookworm, from the mirror apt already uses) and imported into podman.
#   --auto   when this machine cannot run containers at all (no root for debootstrap and podman's chroot
#            isolation, packages that cannot be installed, podman that cannot start a container), say so and
#            exit 0 instead of failing; once a container runs, every failure of the image build or of the
#            smoke test fails. KVSERVE_SKIP_DOCKER=1 skips it on purpose.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
auto=0
[ "${1:-}" = --auto ] && auto=1
skip() {
  if [ "$auto" = 1 ]; then echo "test-docker: SKIPPED: $*" >&2; exit 0; fi
  echo "test-docker: $*" >&2
  exit 1
}
[ "${KVSERVE_SKIP_DOCKER:-0}" = 1 ] && skip "KVSERVE_SKIP_DOCKER=1"
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, podman with chroot isolation); run make test-docker as root"
steplog=$(mktemp /tmp/kvserve-docker-step.XXXXXX) # the output of the set-up steps below, removed once they are done
trap 'rm -f "$steplog"' EXIT

need=()
for c in podman buildah debootstrap runc curl; do command -v "$c" >/dev/null 2>&1 || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${need[@]}" >/dev/null; } || skip "cannot install ${need[*]} with apt"
fi

# podman as it can run here: chroot isolation, runc, cgroupfs, host network, lowered ulimits.
PODMAN=(podman --cgroup-manager cgroupfs --runtime runc)
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

if ! "${PODMAN[@]}" image exists localhost/debian:bookworm; then
  rootfs=$(mktemp -d /tmp/kvserve-rootfs.XXXXXX)
  echo "test-docker: debootstrap minbase bookworm from $mirror" >&2
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$steplog" 2>&1 \
    || { tail -20 "$steplog" >&2; rm -rf "$rootfs"; skip "debootstrap failed (log above)"; }
  tar -C "$rootfs" -c . | "${PODMAN[@]}" import - localhost/debian:bookworm >/dev/null \
    || { rm -rf "$rootfs"; skip "podman cannot import an image here"; }
  rm -rf "$rootfs"
fi
# Can this machine start a container at all?
"${PODMAN[@]}" run --rm --network host "${LIMITS[@]}" localhost/debian:bookworm true >"$steplog" 2>&1 \
  || { tail -5 "$steplog" >&2; skip "podman cannot start a container on this machine"; }
rm -f "$steplog"
"${PODMAN[@]}" tag localhost/debian:bookworm localhost/debian:bookworm-slim

echo "test-docker: building the image" >&2
"${PODMAN[@]}" build --format docker --isolation chroot --network host \
  "${LIMITS[@]}" \
  --build-arg BUILD_IMAGE=localhost/debian:bookworm --build-arg RUNTIME_IMAGE=localhost/debian:bookworm-slim \
  -t localhost/kvserve:test -f Dockerfile .

port=$((20000 + RANDOM % 20000))
name=kvserve-smoke-$$
cleanup() { "${PODMAN[@]}" rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"${PODMAN[@]}" run -d --name "$name" --network host "${LIMITS[@]}" \
  localhost/kvserve:test -m /opt/kvserve/default.gguf --port "$port" >/dev/null

for _ in $(seq 1 120); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$port/health"; echo

# The end-to-end smoke test: the official openai client against the container.
KVSERVE_URL="http://127.0.0.1:$port" node "$root/tests/docker/smoke.mjs"
user=$("${PODMAN[@]}" exec "$name" id -u)
[ "$user" != 0 ] || { echo "test-docker: container runs as root" >&2; exit 1; }
echo "test-docker: 1 passed, 0 failed"
