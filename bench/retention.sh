#!/usr/bin/env bash
# Retention under load, two measurements:
#
#  A. churn: CHURN (1,000,000) deliveries at RATE (5,000) a second through a receiver whose
#     retention is short (ttl 2s, dedupe_ttl 10s, every 1s); prints the ledger's size as it
#     goes, and once retention has caught up, next to the size the rows it still holds need
#     (a compacted VACUUM INTO copy). The rate is one retention can keep pace with: it purges
#     and deletes as many rows as are claimed, through the same single writer.
#  B. ingest latency (C=64) on a ledger of OLD (500,000) finished jobs: once with nothing for
#     retention to do, once with all of them past dedupe_ttl, so retention purges and deletes
#     them during the load.
#
#   bench/retention.sh                              both, about 5 minutes
#   bench/retention.sh churn | latency              one of them
#   CHURN=100000 OLD=50000 bench/retention.sh       a shorter run
#
# No handler runs in A: a sqlite3 loop marks claimed jobs done once a second, standing in for
# the worker (what is measured is what retention does with finished jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
CHURN=${CHURN:-1000000}; RATE=${RATE:-5000}; OLD=${OLD:-500000}; DURATION=${DURATION:-15s}
parts=${1:-churn latency}
source bench/lib.sh

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
rows() { sqlite3 -cmd ".timeout 5000" "$1/ledger.sqlite3" 'SELECT count(*) FROM jobs'; }

churn() {
echo "A. churn: $CHURN deliveries at $RATE/s, ttl 2s, dedupe_ttl 10s, retention every 1s"
a="$work/churn"; mkdir -p "$a"
write_config "$a" '[retention]
ttl = "2s"
dedupe_ttl = "10s"
interval = "1s"'
start_receiver "$a"
( while sleep 1; do
    sqlite3 -cmd ".timeout 5000" "$a/ledger.sqlite3" "UPDATE jobs SET state = 'done',
      finished_at = $NOW_MS_SQL WHERE state = 'claimed' AND next_attempt_at IS NOT NULL" >/dev/null
  done ) & background_pids+=("$!")
( for tick in $(seq 1000); do
    sleep 10
    echo "  ledger $(mib "$(stat -c %s "$a/ledger.sqlite3")") + WAL $(mib "$(stat -c %s "$a/ledger.sqlite3-wal" 2>/dev/null || echo 0)"), $(rows "$a") rows"
    if [ "$tick" = 6 ]; then   # once, in steady state: what those rows need, compacted
      sqlite3 -cmd ".timeout 5000" "$a/ledger.sqlite3" "VACUUM INTO '$a/steady.sqlite3'"
      echo "  (steady state: the same rows compacted take $(mib "$(stat -c %s "$a/steady.sqlite3")"))"
      rm -f "$a/steady.sqlite3"
    fi
  done ) & background_pids+=("$!")
"$BIN" loadgen --config "$a/config.toml" --requests "$CHURN" --rate "$RATE" --dup-ratio 0 --connections 64 --no-check
# The last jobs finish, pass dedupe_ttl and are vacuumed: wait until no row is left (at most 5 min).
for _ in $(seq 300); do [ "$(rows "$a")" = 0 ] && break; sleep 1; done
sleep 2   # the run that deleted the last rows gives their pages back
kill "${background_pids[@]}" 2>/dev/null || true
stop_receiver >/dev/null
left=$(rows "$a")
sqlite3 "$a/ledger.sqlite3" "VACUUM INTO '$a/compact.sqlite3'"
echo "  after the churn: ledger $(mib "$(stat -c %s "$a/ledger.sqlite3")")" \
     "(+ WAL $(mib "$(stat -c %s "$a/ledger.sqlite3-wal" 2>/dev/null || echo 0)")) holding $left rows;" \
     "the same rows compacted: $(mib "$(stat -c %s "$a/compact.sqlite3")")"
}

latency() {
echo
echo "B. ingest latency (C=64, $DURATION) on a ledger of $OLD finished jobs, without and with retention at work"
for phase in recent old; do
  b="$work/$phase"; mkdir -p "$b"
  write_config "$b" '[retention]
ttl = "30d"
dedupe_ttl = "60d"
interval = "1h"'
  start_receiver "$b"; stop_receiver >/dev/null   # creates the ledger
  # recent: finished an hour ago, nothing for retention to do; old: all past dedupe_ttl.
  if [ "$phase" = recent ]; then age=3600000; else age=$((90 * 86400000)); fi
  sqlite3 "$b/ledger.sqlite3" >/dev/null <<SQL
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $OLD)
INSERT INTO jobs (job_id, state, body, received_at, attempts, finished_at, updated_at)
SELECT lower(hex(randomblob(8))) || '-old', 'done', '{"pad":"' || hex(zeroblob(450)) || '"}',
       0, 1, $NOW_MS_SQL - $age, 0 FROM n;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
  start_receiver "$b"   # retention runs at start: on "old" it works through all of them under the load
  report=$("$BIN" loadgen --config "$b/config.toml" --requests 100000000 --duration "$DURATION" --dup-ratio 0.3 --connections 64)
  stop_receiver >/dev/null
  left=$(sqlite3 "$b/ledger.sqlite3" "SELECT count(*) FROM jobs WHERE job_id LIKE '%-old'")
  echo "  $phase: $(echo "$report" | head -1 | sed 's/^tag [^:]*: //')"
  echo "      old jobs left after the run: $left of $OLD"
done
}

for part in $parts; do "$part"; done
