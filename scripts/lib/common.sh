# Shared by scripts/test and scripts/demo: install what is missing, configure, build.
# Sourced, not run.

REMAT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Which LibTorch to build against: "debian" (libtorch-dev 1.13, CPU; the default) or "pip"
# (the package index's torch==$REMAT_PIP_TORCH, a CUDA build, in a virtual environment under
# the build folder). Each has its own build folder.
REMAT_TORCH=${REMAT_TORCH:-debian}
REMAT_PIP_TORCH=${REMAT_PIP_TORCH:-2.11.0}
# torchvision of that torch (its models are exported with torch.export for the .pt2 tests).
REMAT_PIP_TORCHVISION=${REMAT_PIP_TORCHVISION:-0.26.0}
REMAT_BUILD_GIVEN=${REMAT_BUILD:-}
remat_set_build_folder() {
  if [ -n "$REMAT_BUILD_GIVEN" ]; then
    REMAT_BUILD=$REMAT_BUILD_GIVEN
  elif [ "$REMAT_TORCH" = pip ]; then
    REMAT_BUILD=$REMAT_ROOT/build-pip
  else
    REMAT_BUILD=$REMAT_ROOT/build
  fi
}
remat_set_build_folder
# Extra cmake options of remat_configure (the pip toolchain adds its own).
REMAT_CMAKE_OPTIONS=()

# Debian packages remat builds against. Missing ones are installed when running as root.
REMAT_PACKAGES=(g++ cmake make ccache pkg-config python3 catch2 nlohmann-json3-dev
                liblpsolve55-dev coinor-libcbc-dev libtorch-dev libgloo-dev python3-torch)

remat_install_missing() {
  [ "$REMAT_TORCH" = pip ] && REMAT_PACKAGES+=(python3-venv)
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

# Takes "--torch debian|pip" off the front of the arguments (sets REMAT_TORCH); the rest is
# left in REMAT_ARGS.
remat_parse_torch_option() {
  REMAT_ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --torch) [ $# -ge 2 ] || { echo "remat: --torch needs debian or pip" >&2; exit 2; }
               REMAT_TORCH=$2; shift 2 ;;
      --torch=*) REMAT_TORCH=${1#--torch=}; shift ;;
      *) REMAT_ARGS+=("$1"); shift ;;
    esac
  done
  case "$REMAT_TORCH" in
    debian|pip) ;;
    *) echo "remat: --torch $REMAT_TORCH: unknown LibTorch (debian or pip)" >&2; exit 2 ;;
  esac
  remat_set_build_folder
}

# The pip toolchain: a virtual environment in $REMAT_BUILD/venv with torch==$REMAT_PIP_TORCH
# (installed once; the wheels are cached in $REMAT_BUILD/pip-cache, so that a new venv does
# not download them again), its LibTorch and the CUDA toolkit whose major version matches the
# wheel's (docs/guide.md, "LibTorch 2.x with CUDA").
remat_setup_pip_torch() {
  local venv=$REMAT_BUILD/venv
  mkdir -p "$REMAT_BUILD"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  local have
  have=$("$venv/bin/python" -c 'import torch, torchvision; print(torch.__version__.split("+")[0], torchvision.__version__.split("+")[0])' 2>/dev/null || true)
  if [ "$have" != "$REMAT_PIP_TORCH $REMAT_PIP_TORCHVISION" ]; then
    echo "remat: installing torch==$REMAT_PIP_TORCH and torchvision==$REMAT_PIP_TORCHVISION into $venv" >&2
    PIP_CACHE_DIR=$REMAT_BUILD/pip-cache "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "torch==$REMAT_PIP_TORCH" "torchvision==$REMAT_PIP_TORCHVISION" numpy
  fi
  local info
  info=$("$venv/bin/python" - <<'PY' 2>/dev/null
import torch
print(torch.utils.cmake_prefix_path)
print(torch.version.cuda or "")
PY
)
  local prefix wheel_cuda
  prefix=$(sed -n 1p <<<"$info")
  wheel_cuda=$(sed -n 2p <<<"$info")
  # The torch folder itself leads the prefixes: TorchConfig's find_library calls look on the
  # system paths before its own folder, and where Debian's libtorch-dev is installed too they
  # would take Debian's libtorch and libc10 beside the wheel's LibTorch.
  local torch_root
  torch_root=$(cd "$prefix/../.." && pwd)
  REMAT_CMAKE_OPTIONS+=("-DCMAKE_PREFIX_PATH=$torch_root;$prefix" "-DREMAT_TORCH_PYTHON=$venv/bin/python")
  [ -n "$wheel_cuda" ] || return 0  # a CPU wheel: nothing more to find
  local toolkit
  toolkit=$(remat_cuda_toolkit "$venv" "$wheel_cuda")
  REMAT_CMAKE_OPTIONS+=("-DCUDAToolkit_ROOT=$toolkit" "-DCUDA_TOOLKIT_ROOT_DIR=$toolkit"
                        "-DCMAKE_CUDA_COMPILER=$toolkit/bin/nvcc"
                        "-DTORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}")
}

# A CUDA toolkit of the wheel's major version: the machine's (/usr/local/cuda, or
# $CUDA_HOME) when it matches, else the package index's nvcc and headers for that exact
# version, installed into the venv (cuda-toolkit[nvcc,cudart]).
remat_cuda_toolkit() {
  local venv=$1 wheel_cuda=$2
  local machine=${CUDA_HOME:-/usr/local/cuda}
  local machine_cuda=""
  [ -x "$machine/bin/nvcc" ] && machine_cuda=$("$machine/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  if [ "${machine_cuda%%.*}" = "${wheel_cuda%%.*}" ] && [ -z "${REMAT_PIP_NVCC:-}" ]; then
    echo "$machine"
    return 0
  fi
  echo "remat: the wheel is built with CUDA $wheel_cuda, the machine's nvcc is ${machine_cuda:-missing}:" \
       "using the package index's nvcc $wheel_cuda" >&2
  if ! "$venv/bin/pip" list 2>/dev/null | grep -q '^nvidia-cuda-nvcc '; then
    PIP_CACHE_DIR=$REMAT_BUILD/pip-cache "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "cuda-toolkit[nvcc,cudart]==$wheel_cuda.*" >&2
    # nvcc's compiler back end (nvvm) and headers (crt) are separate wheels that pip would take
    # at their newest version; ptxas then refuses their PTX. Pin them to nvcc's.
    local nvcc_version
    nvcc_version=$("$venv/bin/pip" show nvidia-cuda-nvcc 2>/dev/null | sed -n 's/^Version: //p')
    PIP_CACHE_DIR=$REMAT_BUILD/pip-cache "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "nvidia-nvvm==$nvcc_version" "nvidia-cuda-crt==$nvcc_version" >&2
  fi
  # The CUDA wheels of one major version share one root: nvidia/cu<major>/{bin,include,lib}.
  local nvcc_root
  nvcc_root=$("$venv/bin/python" -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu${wheel_cuda%%.*}'))")
  [ -x "$nvcc_root/bin/nvcc" ] || { echo "remat: no nvcc in $nvcc_root after installing it" >&2; exit 1; }
  echo "$nvcc_root"
}

remat_configure() {
  cmake -S "$REMAT_ROOT" -B "$REMAT_BUILD" -DCMAKE_BUILD_TYPE=Release "${REMAT_CMAKE_OPTIONS[@]}" "$@" >/dev/null
}

remat_build() {
  cmake --build "$REMAT_BUILD" -j"$(nproc)" "$@"
}
