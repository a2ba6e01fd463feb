#!/usr/bin/env bash
# Runs a program under Oclgrind's OpenCL simulator with API, memory and
# data-race checks, and fails if Oclgrind reported anything (it does not change
# the program's exit status by itself).
#   oclgrind_check.sh /path/to/oclgrind program args...
set -u
oclgrind=$1; shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$oclgrind" --check-api --data-races --max-errors 20 --log "$log" "$@"
rc=$?
if [ -s "$log" ]; then
  echo "Oclgrind reported:"; head -c 20000 "$log"
  exit 1
fi
echo "oclgrind: no API, memory or data-race errors reported"
exit $rc
