# Shared by scripts/*.sh: install build dependencies and configure CMake.
oscar_install_build_deps() {
  local need=()
  command -v cmake >/dev/null 2>&1 || need+=(cmake)
  command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
  command -v cc >/dev/null 2>&1 || need+=(build-essential)
  if [[ "${1:-}" == criterion ]] && ! pkg-config --exists criterion 2>/dev/null; then
    need+=(libcriterion-dev)
  fi
  # LAPACK (opened at run time by the CPU calibration path); the tests that fit rotations skip without it
  if [[ "${1:-}" == criterion ]] && ! ldconfig -p 2>/dev/null | grep -q 'liblapack.so.3'; then
    need+=(liblapack3)
  fi
  if ((${#need[@]})); then
    local sudo=""
    [[ "$(id -u)" -ne 0 ]] && sudo=sudo
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
  fi
  if [[ -z "${CUDA_HOME:-}" && -d /usr/local/cuda ]]; then export CUDA_HOME=/usr/local/cuda; fi
  if [[ -z "${CUDA_HOME:-}" ]] && ! command -v nvcc >/dev/null 2>&1; then
    echo "error: the CUDA toolkit (headers and NVRTC) was not found: install it or set CUDA_HOME" >&2
    exit 1
  fi
}
oscar_configure() {
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CUDA_HOME:+-DCUDAToolkit_ROOT=$CUDA_HOME} "$@" >/dev/null
}
