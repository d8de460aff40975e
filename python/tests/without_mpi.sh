#!/usr/bin/env bash
# python/tests/without_mpi.sh CMD [ARGS...]: runs CMD on this machine as if no MPI were
# installed. As root where `unshare -m` works: in a private mount namespace in which
# Debian's Open MPI and MPICH are hidden (their libraries, plugin folders and compiler
# wrappers: /dev/null and empty read-only folders mounted over them), checked by trying to
# load libmpi (it must fail). Elsewhere CMD runs as it is and the line says so (the
# tests then still check that no MPI library is loaded into their processes).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
if [[ "${CGX_WITHOUT_MPI_INNER:-0}" == 1 ]]; then
  lib=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  # the MPI folders and wrappers, and the libraries and launchers outside them
  # shellcheck disable=SC2046
  cgx_hide $(cgx_mpi_dirs) "$lib/pmix2" "$lib/pmix" $(cgx_mpi_wrappers) "$lib"/libmpi*.so* "$lib"/libmpich*.so* \
    "$lib"/libopen-pal*.so* "$lib"/libopen-rte*.so* "$lib"/libpmix*.so* /usr/bin/orte* /usr/bin/orted /usr/bin/ompi* \
    /usr/bin/opal* /usr/bin/hydra* /usr/bin/mpiexec.hydra
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
