#!/usr/bin/env bash
# `make test`: the suite as two pytest sessions side by side (the lanes of tests/conftest.py), each line of output
# prefixed with its lane; exits non-zero if either lane failed. Arguments go to both sessions. Both lanes' failures
# are listed again at the end, so that the tail of a CI log (often all that is kept) names them.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
( "$BIN/pytest" --lane engines -p no:cacheprovider "$@" 2>&1 | sed -u 's/^/engines | /' | tee "$logs/engines" ) &
engines_pid=$!
"$BIN/pytest" --lane host "$@" 2>&1 | sed -u 's/^/host    | /' | tee "$logs/host"
host=$?
host_took=$((SECONDS - start))
wait "$engines_pid"
engines=$?
grep -h -E '^(engines|host   ) \| (FAILED|ERROR) ' "$logs/engines" "$logs/host"
echo "lanes: host exit $host in ${host_took} s, engines exit $engines in $((SECONDS - start)) s"
[ "$host" -eq 0 ] && [ "$engines" -eq 0 ]
