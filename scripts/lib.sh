# Shared by scripts/demo, scripts/test, scripts/gpu-rehearsal and python/tests/without_mpi.sh:
# Debian packages, launcher environment, hiding the system MPI.
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

# The folders of Debian's Open MPI and MPICH (libraries, plugins, MPICH's headers).
cgx_mpi_dirs() {
  local ma
  ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  echo "/usr/lib/$ma/openmpi /usr/lib/$ma/mpich /usr/include/$ma/mpich"
}

# The system's MPI compiler wrappers and launchers (most are links through
# /etc/alternatives: hiding a link hides what it points to).
cgx_mpi_wrappers() {
  local w
  for w in /usr/bin/mpicc* /usr/bin/mpicxx* /usr/bin/mpic++* /usr/bin/mpiCC* /usr/bin/mpif* /usr/bin/mpiexec* \
           /usr/bin/mpirun*; do
    [[ -e "$w" ]] && echo "$w"
  done
}

# cgx_hide PATH...: in a private mount namespace (unshare -m, as root), hides each path
# that exists: a folder under an empty read-only tmpfs, a file under /dev/null.
cgx_hide() {
  local x
  for x in "$@"; do
    if [[ -d "$x" ]]; then
      mount -t tmpfs -o ro,size=4k cgx-hidden "$x"
    elif [[ -e "$x" ]]; then
      mount --bind /dev/null "$x"
    fi
  done
}

# cgx_debian_source PKG VERSION DIR: downloads Debian's source package PKG=VERSION (the
# .dsc, the upstream tarball, Debian's changes) into DIR, unless DIR already holds its
# .dsc. It uses a private apt setup under DIR/.apt (deb-src entries made from the
# system's own deb entries, its own package lists): the system's apt configuration is
# not changed, and no root is needed. apt checks the files against the signed lists.
# Three tries.
cgx_debian_source() {
  local pkg="$1" ver="$2" dir="$3"
  [ -f "$dir/${pkg}_${ver#*:}.dsc" ] && return 0
  command -v apt-get >/dev/null 2>&1 || { echo "cgx: apt-get is needed to download $pkg's source" >&2; return 1; }
  mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || return 1
  local a="$dir/.apt"
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/sources.list.d" "$a/preferences.d" || return 1
  : > "$a/sources.list"; : > "$a/preferences"
  local f n=0
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed -E 's/^Types:.*/Types: deb-src/' "$f" > "$a/sources.list.d/src$n.sources"; n=$((n + 1))
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -nE 's/^deb[[:space:]]+/deb-src /p' "$f" > "$a/sources.list.d/src$n.list"; n=$((n + 1))
  done
  local opts=(-q -o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=$a/sources.list.d"
              -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o "Dir::Etc::Preferences=$a/preferences"
              -o "Dir::Etc::PreferencesParts=$a/preferences.d" -o "Debug::NoLocking=1"
              -o "APT::Sandbox::User=$(id -un)")
  local try
  for try in 1 2 3; do  # a network that fails once is tried again
    apt-get "${opts[@]}" update > "$a/update.log" 2>&1 &&
      (cd "$dir" && apt-get "${opts[@]}" source --download-only "$pkg=$ver") > "$a/source.log" 2>&1 && break
    [ "$try" -lt 3 ] && sleep 5
  done
  [ -f "$dir/${pkg}_${ver#*:}.dsc" ] ||
    { cat "$a/update.log" "$a/source.log" >&2 2>/dev/null; echo "cgx: apt-get source $pkg=$ver failed (3 tries)" >&2; return 1; }
}
