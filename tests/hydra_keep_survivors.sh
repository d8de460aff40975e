#!/bin/sh
# Runs one rank of a job started by MPICH's launcher (hydra, mpiexec.mpich
# -disable-auto-cleanup) so that the other ranks outlive a rank killed by a signal:
#   mpiexec.mpich -disable-auto-cleanup -n 3 sh hydra_keep_survivors.sh PROGRAM [ARGS...]
# Measured with Debian 12's MPICH 4.0.2 (hydra 4.0.2, UCX 1.13.1), tests/rank_killed.cpp:
# - hydra_pmi_proxy reaps its children with waitpid(WNOHANG) while their output is open
#   and, for one that WIFSIGNALED, sends SIGKILL to the process group of every other rank
#   it started, -disable-auto-cleanup or not. Here the proxy's child is this shell, which
#   runs the program as its own child and exits with its status (137 after a SIGKILL):
#   the program still dies by the signal, the proxy sees an ordinary exit.
# - On a rank's death the proxy sends SIGUSR1 to the others' process groups (MPICH's own
#   handler only counts it): this shell must ignore it, or it dies of it.
# - UCX's transports abort a survivor that touches the dead rank: CMA (process_vm_readv)
#   with "cma_ep.c:81 process_vm_readv(pid=...) returned -1: No such process", TCP with
#   "tcp_ep.c:939 Assertion `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK' failed"
#   (UCX_TLS=^cma: 3 of 20 runs lost a survivor so), and over TCP a receive from the rank
#   that died mid-transfer can even complete as a whole message, its buffer partly
#   written (caught by plan_options::verify as errc::corrupt). Shared memory alone,
#   UCX_TLS=self,sysv,posix (one machine), unless the caller chose: 20 of 20 runs
#   with both survivors throwing errc::timeout after 3-4 s.
# Exits with the program's status.
trap '' USR1
: "${UCX_TLS:=self,sysv,posix}"
export UCX_TLS
"$@"
exit $?
