#!/usr/bin/env bash
# Installs the Debian packages weft needs (when missing) and builds everything into build/.
# Usage: ./setup.sh               (as root, or with sudo available)
#        ./setup.sh --no-bench    (the same without the benchmark programs: a faster build)
#        ./setup.sh --no-bench --configure-only   (installs and configures, builds nothing: for
#                                 ./test.sh --quick, which builds in two steps)
# The build is a unity build (each target's sources compiled as one file, about two fifths
# faster from scratch); WEFT_UNITY_BUILD=OFF ./setup.sh builds file by file, which rebuilds less
# after a small edit.
set -euo pipefail
cd "$(dirname "$0")"

bench=ON
build=true
for argument in "$@"; do
  case "$argument" in
    --no-bench) bench=OFF ;;
    --configure-only) build=false ;;
    *) echo "usage: ./setup.sh [--no-bench] [--configure-only]" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config git   # toolchain
  ccache                                              # rebuilds of unchanged sources from a cache
  clang libclang-rt-14-dev                            # sanitizers and libFuzzer for the test suite
  clang-format                                        # the test suite checks the formatting
  libzstd-dev libxxhash-dev nlohmann-json3-dev libcli11-dev libssl-dev
  libboost1.74-dev libcurl4-openssl-dev libyaml-cpp-dev
  doctest-dev libbenchmark-dev jq                     # jq: the end-to-end tests read reports
  pybind11-dev python3-dev libdlpack-dev              # the weft Python package (build/python)
  python3-torch python3-numpy python3-pytest          # the PyTorch trainer and the Python tests
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_BUILD_BENCH=$bench \
  -DCMAKE_UNITY_BUILD="${WEFT_UNITY_BUILD:-ON}" > /dev/null
if $build; then
  cmake --build build
  echo "setup: built build/cli/weft"
fi
