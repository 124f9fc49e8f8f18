# Shared by scripts/test and scripts/demo: install what is missing, configure, build.
# Sourced, not run.

REMAT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REMAT_BUILD=${REMAT_BUILD:-$REMAT_ROOT/build}

# Debian packages remat builds against. Missing ones are installed when running as root.
REMAT_PACKAGES=(g++ cmake make ccache pkg-config python3 catch2 nlohmann-json3-dev
                liblpsolve55-dev coinor-libcbc-dev libtorch-dev python3-torch)

remat_install_missing() {
  local missing=()
  local pkg
  for pkg in "${REMAT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "remat: missing Debian packages: ${missing[*]}" >&2
    echo "remat: run as root, or: sudo apt-get install ${missing[*]}" >&2
    return 1
  fi
  echo "remat: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

remat_configure() {
  cmake -S "$REMAT_ROOT" -B "$REMAT_BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
}

remat_build() {
  cmake --build "$REMAT_BUILD" -j"$(nproc)" "$@"
}
