#!/usr/bin/env bash
# Debian packages the tests need, beyond Python: an etcd server (the etcd state
# store and the highly available scheduler pair are tested against a real one),
# Chromium and its WebDriver (the web UI's browser tests) and Graphviz (stage
# graph pictures), and iproute2 (ip, bridge, tc: the multi-host tests build a
# network of namespaces; unshare, setpriv and mount come with util-linux, which
# Debian always has). Needs root (or sudo); does nothing when all are present.
# With --containers, also what tests/containers needs: podman (with runc, netavark,
# aardvark-dns and iptables for its networks), podman-compose and debootstrap.
#
# Usage: scripts/install-system-deps.sh [--containers]
set -euo pipefail

packages=(etcd-server chromium chromium-driver graphviz iproute2)
binaries=(etcd chromium chromedriver dot ip bridge tc)
if [[ "${1:-}" == "--containers" ]]; then
    packages+=(podman runc netavark aardvark-dns iptables uidmap podman-compose debootstrap)
    binaries+=(podman runc podman-compose debootstrap)
fi

missing=false
for binary in "${binaries[@]}"; do
    if ! command -v "$binary" >/dev/null 2>&1; then
        missing=true
    fi
done
if [[ "$missing" == false ]]; then
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "scripts/install-system-deps.sh: needs root to install ${packages[*]}" >&2
        exit 1
    fi
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
for binary in "${binaries[@]}"; do
    command -v "$binary" >/dev/null 2>&1 || {
        echo "scripts/install-system-deps.sh: $binary is still missing after installing ${packages[*]}" >&2
        exit 1
    }
done
