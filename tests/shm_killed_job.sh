#!/usr/bin/env bash
# Jobs killed while they hold cgx::comm::shm segments leave nothing in /dev/shm for
# good, and the next job runs correctly:
#   1. rank 0 killed after the segment's name was unlinked: nothing of it is left;
#   2. rank 0 killed inside comm::shm's constructor, before it could unlink the name:
#      the next job's constructor reclaims it (its creator is dead);
#   3. rank 2 killed while ranks 0 and 1 wait for it inside the transport (the launcher
#      told to let survivors run: Open MPI's --enable-recovery, or MPICH's
#      -disable-auto-cleanup with each rank started through hydra_keep_survivors.sh):
#      they throw errc::transport naming it; also when rank 1 calls only after rank 0
#      has found the death and reported it (--peer-dies-late).
# A launcher that times out instead of ending the killed job is a failure.
# Usage: shm_killed_job.sh PROGRAM MPIEXEC [LAUNCHER FLAGS...]
set -u
prog="$1"; shift
launch=("$@")
out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT

# run_killed MODE: runs the job in crash mode MODE; fails unless it ended by the kill.
run_killed() {
  : >"$out"
  timeout 60 "${launch[@]}" -n 3 "$prog" "$1" "$out" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" -eq 124 ]; then echo "FAIL: the job of $1 hung (timeout), it was not ended by the kill"; exit 1; fi
  if [ "$rc" -eq 0 ]; then echo "FAIL: the job of $1 exited 0"; exit 1; fi
  if [ ! -s "$out" ]; then echo "FAIL: the job of $1 did not reach the point of the kill (exit $rc)"; exit 1; fi
  echo "$1: the killed job exited $rc"
}

# 1. Killed after the unlink: no name of rank 0's pid is left.
run_killed --crash
pid=$(cat "$out")
left=$(find /dev/shm -maxdepth 1 -regextype posix-extended -regex "/dev/shm/cgx\.([0-9]+\.)?$pid\..*" | wc -l)
echo "  segments of the killed rank 0 (pid $pid) left: $left"
if [ "$left" -ne 0 ]; then echo "FAIL: the job killed after the unlink left segments behind"; exit 1; fi

# 2. Killed inside the constructor, before the unlink.
run_killed --crash-in-constructor
name=$(cat "$out")
if [ -e "/dev/shm/$name" ]; then echo "  its segment /dev/shm/$name is still there"; else echo "  its segment /dev/shm/$name was already reclaimed"; fi

# The next job runs correctly, reclaims the killed job's segment and leaves nothing.
timeout 60 "${launch[@]}" -n 3 "$prog" || { echo "FAIL: the job after the killed ones failed"; exit 1; }
if [ -e "/dev/shm/$name" ]; then echo "FAIL: /dev/shm/$name of the job killed in the constructor is still there after the next job"; exit 1; fi

# 3. A dead peer: the survivors must not wait forever. The launchers known to let them run:
# Open MPI's (--enable-recovery) and MPICH's hydra (-disable-auto-cleanup, each rank through
# hydra_keep_survivors.sh, which says why); with another one this part is not checked.
version=$("${launch[0]}" --version 2>&1)
if echo "$version" | grep -q -E "Open MPI|OpenRTE"; then
  keep=(--enable-recovery); rank=()
elif echo "$version" | grep -q HYDRA; then
  keep=(-disable-auto-cleanup); rank=(sh "$(dirname "$0")/hydra_keep_survivors.sh")
else
  echo "  --peer-dies: not checked with this launcher"
  echo "PASS"
  exit 0
fi
# --peer-dies-late: rank 1 calls after rank 0 has reported the death, and must throw the
# same error from the report.
for mode in --peer-dies --peer-dies-late; do
  rm -f "$out".0 "$out".1
  timeout 60 "${launch[0]}" "${keep[@]}" "${launch[@]:1}" -n 3 "${rank[@]}" "$prog" "$mode" "$out" >/dev/null 2>&1
  rc=$?
  if [ "$rc" -eq 124 ]; then echo "FAIL: the survivors of a dead peer hung (timeout, $mode)"; exit 1; fi
  for r in 0 1; do
    caught=$(cat "$out.$r" 2>/dev/null)
    echo "  $mode: rank $r caught: ${caught:-nothing (it did not get there)}"
    case "$caught" in
      "transport: "*"peer rank 2 (pid"*) ;;
      *) echo "FAIL: rank $r did not report the dead peer with errc::transport ($mode)"; exit 1 ;;
    esac
  done
done
echo "PASS"
