#!/usr/bin/env bash
# What an idle receiver costs, and how soon it picks up work after idling.
#
#   bench/idle.sh       IDLE=60 seconds of idling after SETTLE=5, then PICKUPS=5 of each pick-up
#
# 1. Idle: a receiver with a handler, a ledger of LEDGER_JOBS (10000) finished jobs and nothing
#    to do. Over IDLE seconds: wake-ups per second (voluntary context switches summed over its
#    threads, from /proc/PID/task/*/status), CPU per hour, bytes handed to write calls per hour
#    (wchar), and then, over another IDLE seconds under strace (if installed), the file-lock calls
#    (fcntl F_SETLK*) its threads make: SQLite's locks on the ledger's files.
# 2. Pick-up, each after a few seconds of idling, in milliseconds: a delivery (sent -> its
#    handler starts), a retry coming due (the failed attempt's next_attempt_at -> the second
#    attempt starts; backoff 2s) and `jobs retry` from the command line (the command started ->
#    the handler starts: includes the command's own start-up, ~10 ms).
#
# Env: IDLE, SETTLE, PICKUPS, LEDGER_JOBS, BIN (a prebuilt sume-receiver; default: build release).
set -euo pipefail
cd "$(dirname "$0")/.."
IDLE=${IDLE:-60}; SETTLE=${SETTLE:-5}; PICKUPS=${PICKUPS:-5}; LEDGER_JOBS=${LEDGER_JOBS:-10000}
source bench/lib.sh

dir="$work/idle"; mkdir -p "$dir"
write_config "$dir" "
[handler]
command = [\"sh\", \"-c\", \"echo \\\"\$SUME_JOB_ID \$SUME_ATTEMPT \$(date +%s%3N)\\\" >> $dir/starts.log; case \$SUME_JOB_ID in fail-*) [ \$SUME_ATTEMPT -ge 2 ];; esac\"]
concurrency = 4
max_attempts = 3
backoff = \"2s\"
max_backoff = \"2s\""
start_receiver "$dir"; stop_receiver >/dev/null   # creates and migrates the ledger
sqlite3 "$dir/ledger.sqlite3" >/dev/null <<SQL
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $LEDGER_JOBS)
INSERT INTO jobs (job_id, state, source, event_type, body, received_at, attempts, finished_at, updated_at)
SELECT 'old-' || i, 'done', 'webhook', 'job.completed', '{"job_id":"old-' || i || '"}', now - i, 1, now - i, now - i
FROM n, (SELECT $NOW_MS_SQL - 86400000 AS now);
PRAGMA wal_checkpoint(TRUNCATE);
SQL
start_receiver "$dir"
sleep "$SETTLE"

# switches PID: "TID COUNT" per live thread (voluntary context switches).
switches() {
  for status in /proc/"$1"/task/*/status; do
    awk -v tid="$(basename "$(dirname "$status")")" '/^voluntary_ctxt_switches/ { print tid, $2 }' "$status" 2>/dev/null || true
  done
}
before_switches=$(switches "$receiver_pid")
read -ra before <<<"$(usage "$receiver_pid")"
sleep "$IDLE"
read -ra after <<<"$(usage "$receiver_pid")"
after_switches=$(switches "$receiver_pid")
# Threads that started meanwhile count from zero; one that ended is missed (none should).
wakeups=$(python3 -c '
import sys
before = dict(line.split() for line in sys.argv[1].splitlines() if line)
after = dict(line.split() for line in sys.argv[2].splitlines() if line)
print(sum(int(count) - int(before.get(tid, 0)) for tid, count in after.items()))
' "$before_switches" "$after_switches")
threads=$(ls /proc/"$receiver_pid"/task | wc -l)
locks=n/a
if command -v strace >/dev/null; then
  timeout -s INT "$IDLE" strace -f -qq -e trace=fcntl -p "$receiver_pid" -o "$dir/strace.log" 2>/dev/null || true
  locks=$(grep -c 'F_SETLK\|F_OFD_SETLK' "$dir/strace.log" || true)
fi
python3 - "$IDLE" "$wakeups" "$threads" "$locks" "${before[@]}" "${after[@]}" <<'PY'
import sys
idle, wakeups, threads, locks = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
cpu0, _, written0, cpu1, _, written1 = map(int, sys.argv[5:11])
hour = 3600 / idle
print(f"idle {idle:.0f} s, {threads} threads: {wakeups / idle:.2f} wake-ups/s, "
      f"CPU {(cpu1 - cpu0) / 1e6 * hour:.2f} s/hour, written {(written1 - written0) * hour / 1024:.0f} KiB/hour, "
      f"file-lock calls {locks} in {idle:.0f} s")
PY

# now_ms: the clock as the receiver stamps it.
now_ms() { date +%s%3N; }
# started_at JOB ATTEMPT [NTH]: when the handler began that attempt (ms) for the NTH time (1),
# waiting for it up to 10 s.
started_at() {
  for _ in $(seq 1000); do
    local at; at=$(awk -v job="$1" -v attempt="$2" '$1 == job && $2 == attempt { print $3 }' "$dir/starts.log" 2>/dev/null | sed -n "${3:-1}p")
    [ -n "$at" ] && { echo "$at"; return; }
    sleep 0.01
  done
  echo "job $1 attempt $2 did not start" >&2; exit 1
}
# deliver JOB: sends a signed delivery; prints when it was sent (ms), taken in the client itself
# (python's own start-up is not the receiver's).
deliver() {
  python3 - "$port" "$1" <<'PY'
import hashlib, hmac, json, sys, time, urllib.request
port, job_id = sys.argv[1], sys.argv[2]
body = json.dumps({"job_id": job_id, "type": "job.completed"}).encode()
timestamp = str(int(time.time()))
digest = hmac.new(b"whsec_benchmark", timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
request = urllib.request.Request(f"http://127.0.0.1:{port}/sume/webhook", data=body, headers={
    "content-type": "application/json", "x-sume-webhook-timestamp": timestamp,
    "x-sume-webhook-signature": f"sume-v1={digest}"})
sent = time.time_ns() // 1_000_000
assert urllib.request.urlopen(request, timeout=5).status == 200
print(sent)
PY
}
sql() { sqlite3 -cmd ".timeout 5000" "$dir/ledger.sqlite3" "$1"; }

delivery=() retry_due=() cli_retry=()
for i in $(seq "$PICKUPS"); do
  sleep "$(( 2 + i % 3 )).$(( RANDOM % 10 ))"
  sent=$(deliver "ok-$i")
  delivery+=($(( $(started_at "ok-$i" 1) - sent )))

  deliver "fail-$i" >/dev/null
  started_at "fail-$i" 1 >/dev/null
  due=""
  for _ in $(seq 500); do
    due=$(sql "SELECT next_attempt_at FROM jobs WHERE job_id = 'fail-$i' AND state = 'retrying'")
    [ -n "$due" ] && break
    sleep 0.01
  done
  retry_due+=($(( $(started_at "fail-$i" 2) - due )))

  sleep "$(( 2 + i % 3 )).$(( RANDOM % 10 ))"
  for _ in $(seq 500); do
    [ "$(sql "SELECT state FROM jobs WHERE job_id = 'ok-$i'")" = done ] && break
    sleep 0.01
  done
  sent=$(now_ms)
  "$BIN" jobs --config "$dir/config.toml" retry "ok-$i" >/dev/null
  cli_retry+=($(( $(started_at "ok-$i" 1 2) - sent )))
done
summary() { printf '%s' "$1:"; shift; printf ' %s' "$@"; printf ' ms\n'; }
summary "pick-up of a delivery       " "${delivery[@]}"
summary "pick-up of a retry coming due" "${retry_due[@]}"
summary "pick-up of a CLI jobs retry " "${cli_retry[@]}"
stop_receiver >/dev/null
