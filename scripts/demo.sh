#!/usr/bin/env bash
# The main job: builds oscar_demo and runs it. On a machine with a CUDA GPU it
# JIT-compiles the kernels for that GPU, checks them against the CPU reference
# and times them; with no GPU it says so and runs the CPU backend and a
# compile-only check instead. Extra arguments go to oscar_demo.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
oscar_install_build_deps
oscar_configure build-demo -DOSCAR_BUILD_TESTS=OFF
cmake --build build-demo -j"$(nproc)" --target oscar_demo
./build-demo/bench/oscar_demo "$@"
