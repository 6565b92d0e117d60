#!/usr/bin/env bash
# The hardening benchmark: what strangers on the webhook port can do to memory and to a normal
# sender. Loopback only; every loop is bounded. About 2 minutes.
#
#   bench/flood.sh     three cases, each against a fresh receiver (release build, or BIN=...):
#     forged     2,000 connections at once, each POSTing 1 MiB with well-formed signature headers
#                (fresh timestamp, random digest): they pass the checks made before the body
#                is read, so this is the worst a stranger without the secret can send
#     signed     2,000 connections at once, each POSTing 1 MiB, validly signed, new job_ids
#     slowloris  1,000 connections sending their head a byte a second, the receiver started
#                with systemd's soft open-files limit (1024, hard 524288)
#   During each, a normal sender (loadgen, 50/s on 2 connections) keeps delivering 1 KiB jobs.
#   Reported: peak RSS, RSS 10 s after the flood, the flood's answers, that every 200 has its
#   row, and the normal sender's answers and p99.
#
# Knobs (environment): FLOOD (2000), SLOW (1000), BODY_BYTES (1048576), BIN, CASES (all three:
# "forged signed slowloris").
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOD=${FLOOD:-2000}; SLOW=${SLOW:-1000}; BODY_BYTES=${BODY_BYTES:-1048576}
CASES=${CASES:-forged signed slowloris}
source bench/lib.sh
ulimit -n "$(ulimit -Hn)"   # the clients' side: thousands of sockets

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$receiver_pid/status"; }
peak_kib() { awk '/VmHWM/ {print $2}' "/proc/$receiver_pid/status"; }

# normal_sender DIR SECONDS: 50 deliveries/s of 1 KiB; prints loadgen's JSON report.
normal_sender() {
  "$BIN" loadgen --config "$1/config.toml" --json --rate 50 --connections 2 --duration "$2s" \
    --requests 100000000 --body-bytes 1024 --dup-ratio 0 --no-check
}

summary() {  # summary NAME PEAK_KIB IDLE_KIB FLOOD_JSON NORMAL_JSON CHECK
  python3 - "$@" <<'PY'
import json, sys
name, peak, idle, flood, normal, check = sys.argv[1:]
f = json.loads(flood); n = json.loads(normal)
print(f"{name:<10} peak RSS {int(peak)/1024:7.1f} MiB  idle RSS {int(idle)/1024:6.1f} MiB  "
      f"flood answers {f.get('statuses', f)}  rows: {check}  "
      f"normal sender {n['statuses']} p99 {n['p99_ms']:.1f} ms")
PY
}

flood_case() {  # flood_case signed|forged
  local mode=$1 dir="$work/$1"; mkdir -p "$dir"
  write_config "$dir" ""
  start_receiver "$dir"
  normal_sender "$dir" 25 > "$dir/normal.json" &
  local normal_pid=$!
  sleep 2
  python3 bench/flood_client.py "$mode" --port "$port" --connections "$FLOOD" \
    --body-bytes "$BODY_BYTES" --acked "$dir/acked.txt" > "$dir/flood.json"
  local peak; peak=$(peak_kib)
  local idle_at=""
  for second in $(seq 10); do
    sleep 1
    if [ -z "$idle_at" ] && [ "$(rss_kib)" -lt 65536 ]; then idle_at=$second; fi
  done
  local idle; idle=$(rss_kib)
  wait "$normal_pid"
  stop_receiver >/dev/null
  local acked missing
  acked=$(grep -c . "$dir/acked.txt" || true)
  missing=$(python3 - "$dir/ledger.sqlite3" "$dir/acked.txt" <<'PY'
import sqlite3, sys
ids = [l.strip() for l in open(sys.argv[2]) if l.strip()]
db = sqlite3.connect(sys.argv[1])
print(sum(1 for i in ids if db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (i,)).fetchone() is None))
PY
)
  summary "$mode" "$peak" "$idle" "$(cat "$dir/flood.json")" "$(cat "$dir/normal.json")" \
    "$acked acknowledged, $missing missing; under 64 MiB after ${idle_at:-more than 10} s"
}

slowloris_case() {
  local dir="$work/slowloris"; mkdir -p "$dir"
  SERVER_KEYS="expose_metrics = true" write_config "$dir" ""
  # systemd's soft limit for a service (1024); its hard limit is 524288, this shell's may be lower.
  prlimit --nofile=1024:"$(ulimit -Hn)" "$BIN" serve --config "$dir/config.toml" 2>>"$dir/receiver.log" &
  receiver_pid=$!
  sleep 1
  python3 bench/flood_client.py slowloris --port "$port" --connections "$SLOW" --duration 25 \
    > "$dir/slow.json" &
  local slow_pid=$!
  sleep 5
  normal_sender "$dir" 15 > "$dir/normal.json"
  local fds; fds=$(find "/proc/$receiver_pid/fd" -mindepth 1 | wc -l)
  wait "$slow_pid"
  local peak; peak=$(peak_kib); local idle; idle=$(rss_kib)
  local shed; shed=$(metric sume_connections_shed_total)
  stop_receiver >/dev/null
  summary slowloris "$peak" "$idle" "$(cat "$dir/slow.json")" "$(cat "$dir/normal.json")" \
    "$fds descriptors at the end of the normal sender's run; $shed connections shed"
}

echo "flood benchmark: $FLOOD x $BODY_BYTES-byte POSTs, $SLOW slow connections ($BIN)" >&2
for case in $CASES; do
  case $case in
    forged|signed) flood_case "$case" ;;
    slowloris) slowloris_case ;;
    *) echo "unknown case $case (forged, signed, slowloris)" >&2; exit 2 ;;
  esac
done
