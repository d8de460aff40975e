# Shared by scripts/demo and scripts/test: Debian packages, launcher environment.
# shellcheck shell=bash

CGX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Where the CUDA toolkit usually lives on these machines.
if [ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# cgx_need_packages PKG...: installs the missing Debian packages when run as root,
# otherwise names them and exits.
cgx_need_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "cgx: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || { echo "cgx: apt-get update failed" >&2; exit 1; }
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      { echo "cgx: apt-get install ${missing[*]} failed" >&2; exit 1; }
  else
    echo "cgx: please install these Debian packages first (as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
}

# Open MPI refuses to run as root and to oversubscribe unless told; containers block CMA.
cgx_openmpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_rmaps_base_oversubscribe=1
}

cgx_generator() {
  if command -v ninja >/dev/null 2>&1; then echo "-G Ninja"; fi
}

# cgx_tbf_burst RATE: the bucket size for tc tbf at RATE (e.g. 1gbit, 500mbit): 256 KiB,
# or 2 ms of traffic when that is more. A bucket smaller than what the rate delivers
# per timer tick throttles far below the rate (10 Gbit/s with 256 KiB: 4 KiB messages
# took 75 ms).
cgx_tbf_burst() {
  local r="$1" bps
  case "$r" in
    *gbit) bps=$(( ${r%gbit} * 1000000000 )) ;;
    *mbit) bps=$(( ${r%mbit} * 1000000 )) ;;
    *kbit) bps=$(( ${r%kbit} * 1000 )) ;;
    *) echo 256kb; return ;;
  esac
  local bytes=$(( bps / 8 / 500 ))
  [ "$bytes" -lt 262144 ] && bytes=262144
  echo "$bytes"
}
