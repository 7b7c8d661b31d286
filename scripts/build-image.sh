#!/usr/bin/env bash
# Build the container image of deploy/Dockerfile with podman, from Debian's packages alone.
#
# The Dockerfile starts FROM python:3.11-slim-bookworm. Where no registry serves that
# image, this script makes one: debootstrap of Debian 12 (bookworm, whose python3.11 is
# the project's Python) with python3.11 and pip, imported under that name, the tarball
# kept in .cache/container-base/ for the next build. Then it builds the image, pip
# installing the project and its pinned wheels from the package index pip reaches on
# this host (the build runs on the host's network, with its CA bundle).
#
# Usage: scripts/build-image.sh [TAG]       (default localhost/mangonel:latest)
# Needs root, podman, and debootstrap for the first base image
# (scripts/install-system-deps.sh --containers installs them).
set -euo pipefail

cd "$(dirname "$0")/.."
tag="${1:-localhost/mangonel:latest}"
base="docker.io/library/python:3.11-slim-bookworm"
cache=".cache/container-base"
tarball="$cache/python-3.11-slim-bookworm.tar"

if ! podman image exists "$base"; then
    if [[ ! -s "$tarball" ]]; then
        mkdir -p "$cache"
        root="$(mktemp -d "$cache/rootfs.XXXXXX")"
        trap 'rm -rf "$root"' EXIT
        echo "scripts/build-image.sh: making $base with debootstrap (a few minutes, once)" >&2
        debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-pip,ca-certificates \
            bookworm "$root" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 || {
            echo "scripts/build-image.sh: debootstrap failed; see $cache/debootstrap.log" >&2
            exit 1
        }
        # As the python image has them: python and pip on the PATH, and pip free to
        # install into the system's Python (the image is the environment).
        ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python"
        ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python3"
        rm -f "$root/usr/lib/python3.11/EXTERNALLY-MANAGED"
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        tar -C "$root" -cf "$tarball.part" .
        mv "$tarball.part" "$tarball"
    fi
    podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$base" >/dev/null
fi

ca_bundle=/etc/ssl/certs/ca-certificates.crt
podman build --pull=never --network host --format docker \
    -v "$ca_bundle:$ca_bundle:ro" \
    -f deploy/Dockerfile -t "$tag" .
