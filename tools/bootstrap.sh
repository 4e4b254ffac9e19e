#!/usr/bin/env bash
# Installs memsim's build dependencies that are missing (Debian 12 packages) and configures and
# builds ./build. Safe to run again: it installs nothing that is present and rebuilds only what
# changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ meson ninja-build pkg-config libyaml-cpp-dev libcli11-dev libeigen3-dev catch2
          libfmt-dev nlohmann-json3-dev python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build
