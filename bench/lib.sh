# Shared by the bench scripts: build, a scratch directory, one receiver at a time, and new
# PostgreSQL databases. Sourced, not run. Sets BIN, FLOORS, work, port, BENCH_POSTGRES_URL;
# defines write_config, start_receiver, stop_receiver, the ledger's reads, new_postgres_database.

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked --quiet --features bench
  BIN=target/release/sume-receiver
fi
# The floors, programs of their own (bench/floors: none of the receiver's code), built in the
# receiver's profile (the CI smoke runs a debug build).
if [ -z "${FLOORS:-}" ]; then
  case "$BIN" in
    */debug/*) cargo build --locked --quiet -p sume-floors; FLOORS=target/debug ;;
    *) cargo build --release --locked --quiet -p sume-floors; FLOORS=target/release ;;
  esac
fi
command -v sqlite3 >/dev/null || { echo "the benchmark needs sqlite3 (apt-get install sqlite3)" >&2; exit 1; }

work=$(mktemp -d)
receiver_pid=""
background_pids=()
cleanup() {
  for pid in $receiver_pid "${background_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# A port and the next one (for a second receiver) that nothing holds, below the kernel's
# ephemeral range (32768 and up), where an outgoing connection may hold any port: a random pick
# there once collided with one.
port=$(python3 -c '
import random, socket
for _ in range(1000):
    port = random.randrange(20000, 32000)
    try:
        for p in (port, port + 1):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
    except OSError:
        continue
    print(port)
    break
')

# write_config DIR EXTRA_TOML: a receiver on $port with its ledger in DIR; EXTRA_TOML goes in
# [database] (more sections may follow it), $SERVER_KEYS in [server].
write_config() {
  cat > "$1/config.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
${SERVER_KEYS:-}

[signature]
secrets = ["whsec_benchmark"]

[log]
access = ${ACCESS_LOG:-true}

[database]
path = "ledger.sqlite3"
$2
TOML
}

# Starts a receiver and waits until it answers /healthz: the port is bound before the ledger is
# checked and recovered, and a measurement must not include that start-up.
start_receiver() {
  "$BIN" serve --config "$1/config.toml" 2>>"$1/receiver.log" &
  receiver_pid=$!
  for _ in $(seq 1200); do
    if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
      return 0
    fi
    kill -0 "$receiver_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "receiver did not start; log:" >&2; cat "$1/receiver.log" >&2; exit 1
}

# Prints the receiver's peak RSS in KiB, then stops it.
stop_receiver() {
  local peak
  peak=$(awk '/VmHWM/ {print $2}' "/proc/$receiver_pid/status")
  kill -TERM "$receiver_pid"
  # Called as $(stop_receiver) too, where `wait` cannot wait for it: the next case must not
  # start while this receiver still holds the port or its ledger.
  while [ -e "/proc/$receiver_pid" ] && ! grep -q '^State:.*zombie' "/proc/$receiver_pid/status" 2>/dev/null; do
    sleep 0.05
  done
  wait "$receiver_pid" 2>/dev/null || true
  receiver_pid=""
  echo "$peak"
}

# Milliseconds since the epoch, in SQL that Debian's sqlite3 3.40 understands.
NOW_MS_SQL="CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"

# prefill_sql FROM TO: the INSERT of finished jobs number FROM+1 to TO, with ~1 KiB bodies and
# random job_ids, finished a day ago (inside every retention window): bench/run.sh's prefilled
# ledger, bench/startup.sh's large ones.
prefill_sql() {
  cat <<SQL
WITH RECURSIVE n(i) AS (SELECT $1 + 1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)
INSERT INTO jobs (job_id, state, source, event_type, body, received_at, attempts, finished_at, updated_at)
SELECT lower(hex(randomblob(8))) || '-prefill', 'done', 'webhook', 'job.completed',
       '{"job_id":"prefill-' || i || '","type":"job.completed","result":{"pad":"' || hex(zeroblob(450)) || '"}}',
       now - i, 1, now - i, now - i
FROM n, (SELECT $NOW_MS_SQL - 86400000 AS now);
SQL
}

# ledger_sql DIR SQL: the query's rows, columns joined by "|", from the ledger of the receiver
# in DIR: its PostgreSQL database if DIR/postgres-url names one, its SQLite file otherwise.
ledger_sql() {
  if [ -f "$1/postgres-url" ]; then
    psql "$(cat "$1/postgres-url")" -tAqc "$2"
  else
    sqlite3 "$1/ledger.sqlite3" "$2"
  fi
}

# jobs_per_second DIR: "done|rate": the ledger's done jobs, and the rate they finished at (from
# the first finish to the last).
jobs_per_second() {
  ledger_sql "$1" "SELECT count(*), count(*) * 1000.0 / (CASE WHEN max(finished_at) - min(finished_at) > 1 THEN max(finished_at) - min(finished_at) ELSE 1 END) FROM jobs WHERE state = 'done'"
}

# wait_until_done DIR COUNT: until the ledger holds COUNT done jobs (10 minutes at most). On
# PostgreSQL each look is a new session, about 9 ms of the server's CPU: it looks every 2 s,
# not every 0.2, so that a measure of the server's CPU around the wait holds little of it.
wait_until_done() {
  local interval=0.2 looks=3000
  if [ -f "$1/postgres-url" ]; then interval=2; looks=300; fi
  for _ in $(seq "$looks"); do
    [ "$(ledger_sql "$1" "SELECT count(*) FROM jobs WHERE state = 'done'")" -ge "$2" ] && return 0
    sleep "$interval"
  done
  echo "only $(ledger_sql "$1" "SELECT count(*) FROM jobs WHERE state = 'done'") of $2 jobs done" >&2; exit 1
}

# The PostgreSQL cases: a fresh database each, on the server of BENCH_POSTGRES_URL.
BENCH_POSTGRES_URL=${BENCH_POSTGRES_URL:-${SUME_TEST_POSTGRES_URL:-}}
new_postgres_database() {
  local name="sume_bench_$(date +%s%N)"
  psql "$BENCH_POSTGRES_URL" -qc "CREATE DATABASE $name" >/dev/null
  echo "$name" >> "$work/postgres-databases"
  echo "${BENCH_POSTGRES_URL%/*}/$name"
}

# postgres_case CASE-FUNCTION ARGS...: runs the case, then drops its database (a 15 s case
# leaves about 450 MB).
postgres_case() {
  "$@"
  drop_created_postgres_databases
}

# Drops every database new_postgres_database has made so far.
drop_created_postgres_databases() {
  [ -f "$work/postgres-databases" ] || return 0
  local name
  while read -r name; do drop_postgres_database "$name"; done < "$work/postgres-databases"
  : > "$work/postgres-databases"
}

# FORCE ends the database's other sessions, but only its own role's: an autovacuum worker still
# on the database after a case (a superuser's) makes the DROP fail until it is done.
drop_postgres_database() {
  local try
  for try in $(seq 30); do
    psql "$BENCH_POSTGRES_URL" -qc "DROP DATABASE $1 WITH (FORCE)" >/dev/null 2>&1 && return
    sleep 1
  done
  psql "$BENCH_POSTGRES_URL" -qc "DROP DATABASE $1 WITH (FORCE)" >/dev/null
}

# metric NAME: its value on the running receiver (the config must expose /metrics).
metric() {
  curl -s "http://127.0.0.1:$port/metrics" | awk -v name="$1" '$1 == name { print $2 }'
}

# usage PID: the process's CPU time so far in microseconds (user + system, every thread, from
# /proc/PID/stat), its context switches (voluntary and not, summed over its live threads) and
# the bytes it handed to write calls (wchar in /proc/PID/io: WAL frames, checkpoints, answers).
usage() {
  local ticks switches written
  ticks=$(awk '{ print $14 + $15 }' "/proc/$1/stat")
  switches=$(cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }')
  written=$(awk '/^wchar/ { print $2 }' "/proc/$1/io")
  echo "$(( ticks * 1000000 / $(getconf CLK_TCK) )) $switches $written"
}

# Starts the benchmark's HTTP floor (bench/floors: a bare hyper server) on $port, like
# start_receiver.
start_http_floor() {
  "$FLOORS/http-floor" "127.0.0.1:$port" 2>>"$1/receiver.log" &
  receiver_pid=$!
  for _ in $(seq 200); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "the HTTP floor did not start; log:" >&2; cat "$1/receiver.log" >&2; exit 1
}
