#!/usr/bin/env bash
# The operator's tools on a large ledger of $JOBS jobs (97 % done, 2 % dead, 1 % waiting, each
# with its attempt in the history):
# 1. the commands, as the operator runs them (the CLI's wall time, process start included):
#    `jobs list` (every state, first page and a page deep in the list), `jobs stats`,
#    `jobs show`, bulk-retry counts; p50 and p99 of $RUNS runs each;
# 2. every console page on the running service, signed in (p50 and p99 of $RUNS requests);
# 3. ingest with the console polled once a second (overview, jobs, dead letters) against
#    without: deliveries per second and the receiver's CPU time per delivery over $DURATION
#    each, alternating, $ROUNDS pairs.
# Env: JOBS (1000000), RUNS (20), DURATION (10s), ROUNDS (3), BIN (built if unset).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-1000000}; RUNS=${RUNS:-20}; DURATION=${DURATION:-10s}; ROUNDS=${ROUNDS:-3}
source bench/lib.sh
dir="$work/ledger"; mkdir -p "$dir"
admin_port=$((port + 1))
echo "bench-operator-token" > "$dir/admin_token"
write_config "$dir" "
[admin]
listen = \"127.0.0.1:$admin_port\"
token_file = \"admin_token\""
start_receiver "$dir"; stop_receiver >/dev/null   # creates and migrates the ledger
echo "filling a ledger with $JOBS jobs..." >&2
sqlite3 "$dir/ledger.sqlite3" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $JOBS)
INSERT INTO jobs (job_id, state, source, event_type, body, received_at, attempts,
                  next_attempt_at, finished_at, last_error, updated_at)
SELECT 'job-' || i,
       CASE WHEN i % 100 = 0 THEN 'retrying' WHEN i % 50 = 1 THEN 'dead' ELSE 'done' END,
       'webhook', 'job.completed',
       '{"job_id":"job-' || i || '","type":"job.completed","result":{"pad":"' || hex(zeroblob(300)) || '"}}',
       now - i * 10, 1,
       CASE WHEN i % 100 = 0 THEN now + i END,
       CASE WHEN i % 100 = 0 THEN NULL ELSE now - i * 10 + 50 END,
       CASE WHEN i % 100 = 0 OR i % 50 = 1 THEN
            CASE WHEN i % 3 = 0 THEN 'handler answered 502 Bad Gateway' ELSE 'exited with status 1' END
       END,
       now
FROM n, (SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AS now);
INSERT INTO job_attempts (job_id, number, cause, started_at, ended_at, outcome, error)
SELECT job_id, 1, 'first', received_at, received_at + 40,
       CASE state WHEN 'done' THEN 'done' WHEN 'dead' THEN 'dead' ELSE 'failed' END, last_error
FROM jobs;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
echo "  $(sqlite3 "$dir/ledger.sqlite3" 'SELECT state, count(*) FROM jobs GROUP BY state' | tr '\n' ' ')($(du -h "$dir/ledger.sqlite3" | cut -f1))" >&2
deep=$(sqlite3 "$dir/ledger.sqlite3" "SELECT received_at || ':' || job_id FROM jobs ORDER BY received_at DESC LIMIT 1 OFFSET $((JOBS / 2))")
deep_dead=$(sqlite3 "$dir/ledger.sqlite3" "SELECT finished_at || ':' || job_id FROM jobs WHERE state = 'dead' ORDER BY finished_at DESC LIMIT 1 OFFSET $((JOBS / 100))")

# time_command NAME ARGS...: p50 and p99 wall time of $RUNS runs, in ms.
time_command() {
  local name=$1; shift
  python3 - "$RUNS" "$name" "$BIN" --config "$dir/config.toml" "$@" <<'PY'
import subprocess, sys, time
runs, name, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
times = []
for _ in range(runs):
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times.append((time.perf_counter() - started) * 1000)
    if done.returncode != 0:
        sys.exit(f"{name} failed: {argv}")
times.sort()
p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
print(f"{name:<44} p50 {p(0.5):7.1f} ms   p99 {p(0.99):7.1f} ms")
PY
}
time_command "jobs list"                         jobs list
time_command "jobs list, half-way down (--after)" jobs list --after "$deep"
for state in claimed retrying running done dead; do
  time_command "jobs list --state $state"        jobs list --state "$state"
done
time_command "jobs list --state dead, deep"      jobs list --state dead --after "$deep_dead"
time_command "jobs stats"                        jobs stats
time_command "jobs show"                         jobs show job-4242
time_command "jobs retry --state dead (count)"   jobs retry --state dead --error-contains 502
time_command "jobs retry --state dead --since 1h (count)" jobs retry --state dead --since 1h
time_command "sume-receiver --version (process start)" --version

echo "the console, signed in, on the running service:" >&2
start_receiver "$dir"
python3 - "$RUNS" "$admin_port" "$deep" <<'PY'
import sys, time, urllib.parse
sys.path.insert(0, "bench")
from console_client import Console
runs, port, deep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
console = Console(port, "bench-operator-token")
pages = ["/console/", "/console/jobs", "/console/jobs?state=dead",
         "/console/jobs?after=" + urllib.parse.quote(deep), "/console/jobs/job-4242",
         "/console/dead", "/console/receipts", "/console/expected", "/console/config",
         "/console/api/jobs?state=retrying"]
for page in pages:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        answer = console.request("GET", page)
        times.append((time.perf_counter() - started) * 1000)
        if answer.status != 200:
            sys.exit(f"{page}: {answer.status}")
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    print(f"GET {page[:40]:<40} p50 {p(0.5):7.1f} ms   p99 {p(0.99):7.1f} ms")
PY
stop_receiver >/dev/null

# Ingest with and without the console polled once a second, alternating.
poll_console() {
  python3 - "$admin_port" <<'PY' &
import sys, time
sys.path.insert(0, "bench")
from console_client import Console
console = Console(int(sys.argv[1]), "bench-operator-token")
while True:
    for page in ("/console/", "/console/jobs", "/console/dead"):
        console.request("GET", page)
    time.sleep(1)
PY
  poller=$!
}
rates=()
for round in $(seq "$ROUNDS"); do
  for mode in plain polled; do
    start_receiver "$dir"
    poller=""
    [ "$mode" = polled ] && poll_console
    read -ra before <<<"$(usage "$receiver_pid")"
    report=$("$BIN" loadgen --config "$dir/config.toml" --json --requests 100000000 --duration "$DURATION" \
               --connections 64 --dup-ratio 0.3 --tag "$mode$round" --no-check)
    read -ra after <<<"$(usage "$receiver_pid")"
    [ -n "$poller" ] && kill "$poller" 2>/dev/null
    stop_receiver >/dev/null
    read -r rate cpu < <(echo "$report" | python3 -c "
import json,sys; r=json.load(sys.stdin); n=max(1,r['sent'])
print(round(r['per_second']), '%.1f' % ((${after[0]}-${before[0]})/n))")
    echo "  round $round, $mode: $rate deliveries/s, $cpu us of the receiver's CPU per delivery" >&2
    rates+=("$mode:$rate:$cpu")
  done
done
python3 - "${rates[@]}" <<'PY'
import sys
runs = {mode: [r.split(":")[1:] for r in sys.argv[1:] if r.startswith(mode + ":")] for mode in ("plain", "polled")}
plain, polled = ([int(rate) for rate, _ in runs[m]] for m in ("plain", "polled"))
plain_cpu, polled_cpu = ([float(cpu) for _, cpu in runs[m]] for m in ("plain", "polled"))
ratios = [b / a for a, b in zip(plain, polled)]
print(f"ingest with the console polled / without: {sum(polled)/len(polled):.0f} / {sum(plain)/len(plain):.0f} deliveries/s"
      f" = {sum(polled)/sum(plain):.3f} (per pair: {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.95)")
print(f"the receiver's CPU per delivery, polled / without: {sum(polled_cpu)/len(polled_cpu):.1f} / {sum(plain_cpu)/len(plain_cpu):.1f} us"
      f" = {sum(polled_cpu)/sum(plain_cpu):.3f}")
PY
