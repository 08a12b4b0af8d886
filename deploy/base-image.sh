#!/usr/bin/env bash
# Build a local Debian bookworm base image with Python 3.11, for machines that reach no
# container registry (the tests' machine): debootstrap --variant=minbase into a directory,
# then `docker import`. The router's Dockerfile takes it as --build-arg BASE=IMAGE.
#
#   deploy/base-image.sh [IMAGE]        default IMAGE: lmroute-base:bookworm
#
# Skips the build when IMAGE exists. Needs root, debootstrap and a running dockerd; the
# Debian mirror is debootstrap's default unless DEBIAN_MIRROR is set (e.g. to the host's).
# python3-venv: the Dockerfile makes a venv; ca-certificates: TLS from inside (tokenizer
# downloads are not done by the router, but users' images may need it).
set -euo pipefail
IMAGE=${1:-lmroute-base:bookworm}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"
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
