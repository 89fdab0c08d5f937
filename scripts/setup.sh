#!/usr/bin/env bash
# Installs the Debian packages that Kuangchao's build, tests and benchmarks need.
# Idempotent: packages already present are left alone; prints what it installs.
# Nothing else is downloaded, here or at build or run time.
set -euo pipefail

PACKAGES=(
  # Toolchain and build.
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev
  # L0 base: logging, configuration, CLI, JSON.
  libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  # IDL: protobuf + gRPC code generation and runtime.
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  # L1 hal: topology probe and kernels.
  libhwloc-dev libopenblas-dev
  # L5 fault: checkpoint checksums (XXH3) and compression (zstd).
  libxxhash-dev libzstd-dev
  # L6 api: kcd's state and the audit log (SQLite), the audit chain's SHA-256 (OpenSSL), its
  # Prometheus metrics endpoint (cpp-httplib).
  libsqlite3-dev libssl-dev libcpp-httplib-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev python3 iproute2
  # Training data: a small English corpus of fortune cookies, /usr/share/games/fortunes/
  # (about 2.6 MB of text; see docs/user-guide/data.md).
  fortunes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${#missing[@]} packages"
