# scripts/lib/common.sh: shared by scripts/demo, scripts/test, scripts/bench and scripts/docs.
# Source it; it defines SPMD_ROOT, JOBS and the functions below.

SPMD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
JOBS=${SPMD_JOBS:-$(nproc 2>/dev/null || echo 2)}

# The Debian packages a build needs. Installed only when missing.
SPMD_PACKAGES=(
  build-essential cmake git python3
  libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev libopenblas-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libopenmpi-dev openmpi-bin doxygen
)

# install_packages PKG...: apt-get installs the packages of the list that are not installed.
install_packages() {
  local missing=()
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
}

install_deps() { install_packages "${SPMD_PACKAGES[@]}"; }

# The environment OpenMPI needs here: running as root, more ranks than cores, and a
# shared-memory transport that works in containers (docs/backends.md explains each).
export_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
}

# configure DIR CMAKE_ARGS...: configures DIR (ccache is used when present).
configure() {
  local dir=$1
  shift
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$SPMD_ROOT" -B "$dir" "${launcher[@]}" "$@"
}

# configure_build DIR CMAKE_ARGS...: configures DIR and builds everything in it.
configure_build() {
  configure "$@"
  cmake --build "$1" -j "$JOBS"
}
