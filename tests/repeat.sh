#!/bin/sh
# repeat.sh N CMD...: runs CMD N times in a row (fresh processes each time) and fails at
# the first run that fails. For tests whose point is that something never happens (a
# hang, a rank that returns from a failed call): one run is not enough to show it.
n="$1"
shift
i=1
while [ "$i" -le "$n" ]; do
  "$@" || { echo "repeat.sh: run $i of $n failed"; exit 1; }
  i=$((i + 1))
done
echo "repeat.sh: all $n runs passed"
