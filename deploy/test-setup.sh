#!/usr/bin/env bash
# What `make test-deploy` needs before its tests: Docker and docker-compose (Debian's
# packages, installed when missing), a running dockerd, the local base, build and Redis
# images (deploy/base-image.sh), the wheels for an offline build (deploy/wheels.sh) and
# the router image itself, compiled, tagged IMAGE (default lmroute:test). Needs root
# (apt, dockerd).
# Prints the seconds each step took.
#
#   deploy/test-setup.sh [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-lmroute:test}
step() { local t=$SECONDS; "$@"; echo "test-setup: $* ($((SECONDS - t)) s)"; }

# dockerd comes from Debian's Docker engine package: the one docker-compose recommends,
# read from apt's metadata.
install_packages() {
  local missing=() updated=0
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if ! command -v dockerd >/dev/null; then
    apt-get update -q >/dev/null && updated=1
    missing+=("$(apt-cache show docker-compose | sed -n 's/^Recommends: \([^ ,(]*\).*/\1/p' | head -1)")
  fi
  if ((${#missing[@]})); then
    ((updated)) || apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  fi
}

start_dockerd() {
  docker info >/dev/null 2>&1 && return
  mkdir -p out
  nohup dockerd >out/dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 1; done
  echo "dockerd did not start; see out/dockerd.log" >&2
  exit 1
}

build_router() {
  DOCKER_BUILDKIT=0 docker build -q --build-arg BASE=lmroute-base:bookworm \
    --build-arg BUILD_BASE=lmroute-build:bookworm \
    --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels -t "$IMAGE" . >/dev/null
}

step install_packages
step start_dockerd
step deploy/base-image.sh
step deploy/wheels.sh
step build_router
