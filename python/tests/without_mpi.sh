#!/usr/bin/env bash
# python/tests/without_mpi.sh CMD [ARGS...]: runs CMD on this machine as if no MPI were
# installed. As root where `unshare -m` works: in a private mount namespace in which
# Debian's Open MPI and MPICH are hidden (their libraries, plugin folders and compiler
# wrappers: /dev/null and empty read-only folders mounted over them), checked by trying to
# load libmpi (it must fail). Elsewhere CMD runs as it is and the line says so (the
# tests then still check that no MPI library is loaded into their processes).
set -uo pipefail
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
lib=/usr/lib/$multiarch
if [[ "${CGX_WITHOUT_MPI_INNER:-0}" == 1 ]]; then
  for d in "$lib/openmpi" "$lib/mpich" "/usr/include/$multiarch/mpich" "$lib/pmix2" "$lib/pmix"; do
    [[ -d "$d" ]] && mount -t tmpfs -o ro,size=4k cgx-no-mpi "$d"
  done
  for f in "$lib"/libmpi*.so* "$lib"/libmpich*.so* "$lib"/libopen-pal*.so* "$lib"/libopen-rte*.so* "$lib"/libpmix*.so* \
           /usr/bin/mpicc* /usr/bin/mpicxx* /usr/bin/mpic++* /usr/bin/mpiCC* /usr/bin/mpif* /usr/bin/mpiexec* \
           /usr/bin/mpirun* /usr/bin/orte* /usr/bin/orted /usr/bin/ompi* /usr/bin/opal* /usr/bin/hydra* /usr/bin/mpiexec.hydra; do
    [[ -f "$f" && ! -L "$f" ]] && mount --bind /dev/null "$f"
  done
  if python3 -c 'import ctypes, sys
for n in ("libmpi.so.40", "libmpi.so", "libmpich.so.12"):
    try:
        ctypes.CDLL(n)
        sys.exit(n + " still loads")
    except OSError:
        pass' 2>/dev/null; then
    echo "without_mpi: Open MPI and MPICH hidden in this mount namespace (libmpi cannot be loaded)"
  else
    echo "without_mpi: MPI could not be hidden (a libmpi still loads)"
    exit 1
  fi
  unset CGX_WITHOUT_MPI_INNER
  exec "$@"
fi
if [[ $(id -u) == 0 ]] && unshare -m --propagation private true 2>/dev/null; then
  CGX_WITHOUT_MPI_INNER=1 exec unshare -m --propagation private "$0" "$@"
fi
echo "without_mpi: cannot hide MPI here (not root, or unshare -m refused): running with it installed"
exec "$@"
