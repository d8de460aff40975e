#!/usr/bin/env python3
"""env_launch.py N SCRIPT [ARGS...]: starts N processes of SCRIPT with the environment
torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: a free port on the loopback; TORCHELASTIC_RUN_ID), as an env:// launcher
(Slurm, a job script) would. Used where torchrun itself fails: Debian 12's torch 1.13
torchrun raises AttributeError in torch.distributed.elastic (to_map) under Python 3.11.
Exit status: 0 when every process exited 0, else the first non-zero status."""
import os
import socket
import subprocess
import sys


def main():
    n, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="env_launch")
        procs.append(subprocess.Popen([sys.executable, script, *args], env=env))
    codes = [p.wait() for p in procs]
    bad = [c for c in codes if c != 0]
    sys.exit(bad[0] if bad else 0)


if __name__ == "__main__":
    main()
