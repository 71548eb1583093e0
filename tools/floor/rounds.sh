#!/usr/bin/env bash
# rounds.sh MUSTER DATA FLOORDIR OUT [ROUNDS]: muster bench and the floor
# client alternated, new then kept connections, ROUNDS rounds (default 3),
# each a JSON file in OUT with the load average in OUT/load.txt. Both
# servers must be running: "MUSTER authority --data DATA --listen
# 127.0.0.1:0" and "./floor server -dir FLOORDIR". Then
# "python3 summarize.py OUT" prints the table. Each run: concurrency 16,
# 3,000 renewals; muster's kept runs in batches of 1,500.
set -euo pipefail
muster=$1 data=$2 fdir=$3 out=$4 rounds=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
ulimit -n 20000
load() { echo "$1 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"; }
m() { local name=$1; shift; load "$name"; "$muster" bench --data "$data" --op renew --concurrency 16 --requests 3000 "$@" -o json > "$out/$name.json" 2> "$out/$name.err"; }
f() { local name=$1; shift; load "$name"; "$here/floor" client -dir "$fdir" -c 16 -n 3000 "$@" -o json > "$out/$name.json" 2> "$out/$name.err"; }
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then
    f f-new-$r -conn new; m m-new-$r
    f f-kept1-$r -conn kept -conns 3000; f f-kept-$r -conn kept; m m-kept-$r --connection kept --batch 1500
  else
    m m-new-$r; f f-new-$r -conn new
    m m-kept-$r --connection kept --batch 1500; f f-kept1-$r -conn kept -conns 3000; f f-kept-$r -conn kept
  fi
done
