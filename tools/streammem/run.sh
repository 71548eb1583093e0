#!/bin/bash
# usage: [SERVER_FLAGS="-prehandshake"] [BIN=./streammem] ./run.sh TRANSPORT N [PROFILE_OUT]
# Starts the server (GOGC=100) and a separate client process holding N streams,
# prints the server's own per-stream figures, then stops both.
set -u
T=$1; N=$2; PROF=${3:-}
BIN=${BIN:-./streammem}
ulimit -n 20000
cd "$(dirname "$0")"
W=$(mktemp -d)
P=$((17000 + RANDOM % 2000)); D=$((P+3000))
GOGC=100 $BIN -mode server -transport "$T" ${SERVER_FLAGS:-} -addr 127.0.0.1:$P -debug 127.0.0.1:$D 2>$W/server.log &
SP=$!
sleep 0.5
$BIN -mode client -addr 127.0.0.1:$P -n "$N" -c 64 >$W/client.out 2>$W/client.log &
CP=$!
for i in $(seq 1 600); do grep -q ESTABLISHED $W/client.out 2>/dev/null && break; sleep 0.5; done
for i in $(seq 1 60); do a=$(curl -s 127.0.0.1:$D/active); [ "$a" -ge "$N" ] 2>/dev/null && break; sleep 0.5; done
sleep 2
echo "$(tr '\n' ' ' < $W/client.out) $(curl -s "127.0.0.1:$D/stats?n=$N")"
if [ -n "$PROF" ]; then curl -s "127.0.0.1:$D/debug/pprof/heap?gc=1" -o "$PROF"; curl -s "127.0.0.1:$D/debug/pprof/goroutine?debug=1" -o "$PROF.goroutines.txt"; fi
if [ -n "${HOOK:-}" ]; then eval "$HOOK"; fi
kill $CP; wait $CP 2>/dev/null
kill $SP; wait $SP 2>/dev/null
rm -rf $W
