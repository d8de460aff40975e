#!/bin/sh
# Runs a command with a private, empty /dev/shm of SIZE (a tmpfs in a new mount
# namespace; needs root). Exits 77 (ctest: skipped) where that cannot be made.
# Usage: private_devshm.sh SIZE COMMAND [ARGS...]
size="$1"; shift
unshare -m true 2>/dev/null || { echo "private_devshm: unshare -m not permitted: skipped"; exit 77; }
exec unshare -m sh -c 'mount -t tmpfs -o size="$0" tmpfs /dev/shm || exit 77; exec "$@"' "$size" "$@"
