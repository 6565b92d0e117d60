#!/usr/bin/env bash
# Retention under load, two measurements:
#
#  A. churn: 1,000,000 deliveries through a receiver whose retention is short (ttl 2s,
#     dedupe_ttl 10s, every 1s); prints the ledger's size as it goes and at the end, next to the
#     size the live rows alone need (a VACUUM INTO copy).
#  B. ingest latency with and without a retention run working through 500,000 old jobs.
#
#   bench/retention.sh              (about 3 minutes)
#   CHURN=100000 OLD=50000 bench/retention.sh      a shorter run
#
# No handler runs in A: a sqlite3 loop marks claimed jobs done once a second, standing in for
# the worker (what is measured is what retention does with finished jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
CHURN=${CHURN:-1000000}; OLD=${OLD:-500000}; DURATION=${DURATION:-15s}
if [ -z "${BIN:-}" ]; then cargo build --release --locked --quiet; BIN=target/release/sume-receiver; fi
command -v sqlite3 >/dev/null || { echo "needs sqlite3 (apt-get install sqlite3)" >&2; exit 1; }

work=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))

write_config() {  # DIR RETENTION_TOML
  cat > "$1/config.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[signature]
secrets = ["whsec_benchmark"]
[database]
path = "ledger.sqlite3"
[retention]
$2
TOML
}
start() {
  "$BIN" serve --config "$1/config.toml" 2>>"$1/receiver.log" & receiver=$!; pids+=("$receiver")
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0; sleep 0.05; done
  cat "$1/receiver.log" >&2; exit 1
}
stop() { kill -TERM "$receiver"; wait "$receiver" || true; }
size() { du -cb "$1"/ledger.sqlite3* 2>/dev/null | tail -1 | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

echo "A. churn: $CHURN deliveries, ttl 2s, dedupe_ttl 10s, retention every 1s"
a="$work/churn"; mkdir -p "$a"
write_config "$a" 'ttl = "2s"
dedupe_ttl = "10s"
interval = "1s"'
start "$a"
( while sleep 1; do
    sqlite3 "$a/ledger.sqlite3" "PRAGMA busy_timeout = 5000;
      UPDATE jobs SET state = 'done', finished_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
      WHERE state IN ('claimed', 'retrying') AND next_attempt_at IS NOT NULL" 2>/dev/null || true
  done ) & pids+=("$!")
( while sleep 5; do echo "  ledger $(mib "$(size "$a")"), $(sqlite3 "$a/ledger.sqlite3" 'PRAGMA busy_timeout=5000; SELECT count(*) FROM jobs' 2>/dev/null) rows"; done ) & pids+=("$!")
"$BIN" loadgen --config "$a/config.toml" --requests "$CHURN" --dup-ratio 0 --connections 64 --no-check
peak=$(size "$a")
sleep 14   # let the last jobs finish, pass dedupe_ttl and be vacuumed
kill "${pids[@]:1}" 2>/dev/null || true
stop
rows=$(sqlite3 "$a/ledger.sqlite3" 'SELECT count(*) FROM jobs')
sqlite3 "$a/ledger.sqlite3" "VACUUM INTO '$a/live.sqlite3'"
echo "  after the churn: ledger $(mib "$(size "$a")") holding $rows rows; the same rows compacted: $(mib "$(stat -c %s "$a/live.sqlite3")")"

echo
echo "B. ingest latency (C=64, $DURATION) on a ledger of $OLD finished jobs, without and with retention at work"
for phase in recent old; do
  b="$work/$phase"; mkdir -p "$b"
  write_config "$b" 'ttl = "30d"
dedupe_ttl = "60d"
interval = "1h"'
  start "$b"; stop   # create the ledger
  # recent: finished an hour ago, nothing for retention to do; old: all past dedupe_ttl.
  if [ "$phase" = recent ]; then age=3600000; else age=$((90 * 86400000)); fi
  sqlite3 "$b/ledger.sqlite3" >/dev/null <<SQL
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $OLD)
INSERT INTO jobs (job_id, state, body, received_at, attempts, finished_at, updated_at)
SELECT lower(hex(randomblob(8))) || '-old', 'done', '{"pad":"' || hex(zeroblob(450)) || '"}',
       0, 1, CAST(unixepoch() * 1000 AS INTEGER) - $age, 0 FROM n;
COMMIT;
SQL
  start "$b"   # retention runs at start: on "old" it works through all of them under the load
  report=$("$BIN" loadgen --config "$b/config.toml" --requests 100000000 --duration "$DURATION" --dup-ratio 0.3 --connections 64)
  stop
  left=$(sqlite3 "$b/ledger.sqlite3" "SELECT count(*) FROM jobs WHERE job_id LIKE '%-old'")
  echo "  $phase: $(echo "$report" | head -1 | sed 's/^tag [^:]*: //')"
  echo "        old jobs left after the run: $left of $OLD; $(grep -o 'retention removed.*' "$b/receiver.log" | tail -1)"
done
