#!/bin/bash
# batch.sh N RUNS OUT: alternate transports, RUNS rounds, N streams each
N=$1; R=$2; OUT=$3
cd "$(dirname "$0")"
: > "$OUT"
for r in $(seq 1 "$R"); do
  for v in grpc h2 h2:-prehandshake connect connect:-prehandshake grpchttp; do
    t=${v%%:*}; f=""; [ "$v" != "$t" ] && f=${v#*:}
    SERVER_FLAGS="$f" ./run.sh "$t" "$N" >> "$OUT" 2>&1
  done
done
