#!/usr/bin/env bash
# Build local Debian bookworm images for machines that reach no container registry (the
# tests' machine): a base with Python 3.11 (debootstrap --variant=minbase into a
# directory, then `docker import`), which the router's Dockerfile takes as
# --build-arg BASE=IMAGE; a build image on that base with a C compiler and the Python
# headers (--build-arg BUILD_BASE=IMAGE: the compiled build's stage); and a Redis image on
# the base (Debian's redis-server 7.0, the emulated compose stack's REDIS_IMAGE).
#
#   deploy/base-image.sh [IMAGE [REDIS_IMAGE [BUILD_IMAGE]]]
#       defaults: lmroute-base:bookworm, lmroute-redis:bookworm, lmroute-build:bookworm
#
# Skips an image that exists. Needs root, debootstrap and a running dockerd; the
# Debian mirror is debootstrap's default unless DEBIAN_MIRROR is set (e.g. to the host's).
# python3-venv: the Dockerfile makes a venv; ca-certificates: TLS from inside (the GPU
# compose file's tokenizer fetch runs in the router image).
set -euo pipefail
IMAGE=${1:-lmroute-base:bookworm}
REDIS_IMAGE=${2:-lmroute-redis:bookworm}
BUILD_IMAGE=${3:-lmroute-build:bookworm}

# An image FROM the base with Debian's packages $2... added (apt inside the base reaches the
# Debian mirror through the host's network), tagged $1; skipped if it exists.
on_base() {
  local tag=$1
  shift
  if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "image $tag exists"
    return
  fi
  printf '%s\n' "FROM $IMAGE" \
    "RUN apt-get update && apt-get install -y --no-install-recommends $* \\" \
    " && rm -rf /var/lib/apt/lists/*" \
    | DOCKER_BUILDKIT=0 docker build -q --network host -t "$tag" - >/dev/null
  echo "built image $tag"
}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"
  on_base "$REDIS_IMAGE" redis-server
  on_base "$BUILD_IMAGE" gcc libc6-dev python3-dev
  exit 0
fi
ROOT=$(mktemp -d /tmp/lmroute-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOT" ${DEBIAN_MIRROR:-} >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
# Trim what a container never uses: apt lists, docs, man pages, locales.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
  "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$IMAGE"
echo "built base image $IMAGE"
on_base "$REDIS_IMAGE" redis-server
on_base "$BUILD_IMAGE" gcc libc6-dev python3-dev
