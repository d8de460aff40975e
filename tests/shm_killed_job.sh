#!/usr/bin/env bash
# A job killed while it holds cgx::comm::shm segments leaves nothing in /dev/shm, and
# the next job runs correctly.  Usage: shm_killed_job.sh PROGRAM MPIEXEC [LAUNCHER FLAGS...]
set -u
prog="$1"; shift
launch=("$@")
count() { find /dev/shm -maxdepth 1 -name 'cgx.*' 2>/dev/null | wc -l; }
before=$(count)
timeout 60 "${launch[@]}" -n 3 "$prog" --crash >/dev/null 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then echo "FAIL: the killed job exited 0"; exit 1; fi
after=$(count)
echo "killed job exited $rc; cgx segments in /dev/shm before: $before, after: $after"
if [ "$after" -gt "$before" ]; then echo "FAIL: the killed job left segments behind"; exit 1; fi
timeout 60 "${launch[@]}" -n 3 "$prog" || { echo "FAIL: the job after the killed one failed"; exit 1; }
if [ "$(count)" -gt "$before" ]; then echo "FAIL: the normal job left segments behind"; exit 1; fi
echo "PASS"
