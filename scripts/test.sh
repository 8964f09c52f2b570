#!/usr/bin/env bash
# Runs every test on a fresh machine: installs what is missing (Criterion,
# pkg-config, CMake), configures, builds and runs ctest. GPU tests skip with
# their reason where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
oscar_install_build_deps criterion
oscar_configure build
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j1 "$@"
