# Shared by the bench scripts: build, a scratch directory, and one receiver at a time.
# Sourced, not run. Sets BIN, FLOORS, work, port; defines write_config, start_receiver,
# stop_receiver.

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

# jobs_per_second DIR: "done|rate": the ledger's done jobs, and the rate they finished at (from
# the first finish to the last).
jobs_per_second() {
  sqlite3 "$1/ledger.sqlite3" "SELECT count(*), count(*) * 1000.0 / max(1, max(finished_at) - min(finished_at)) FROM jobs WHERE state = 'done'"
}

# wait_until_done DIR COUNT: until the ledger holds COUNT done jobs (10 minutes at most).
wait_until_done() {
  for _ in $(seq 3000); do
    [ "$(sqlite3 "$1/ledger.sqlite3" "SELECT count(*) FROM jobs WHERE state = 'done'")" -ge "$2" ] && return 0
    sleep 0.2
  done
  echo "only $(sqlite3 "$1/ledger.sqlite3" "SELECT count(*) FROM jobs WHERE state = 'done'") of $2 jobs done" >&2; exit 1
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
