#!/usr/bin/env bash
# How soon work starts after the 2xx: deliveries at a moderate, steady rate to a receiver whose
# handler records when it started; prints the delay from claim (received_at) to handler start.
#
#   bench/work-latency.sh                 RATE=200 deliveries/s for DURATION=15s
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-200}; DURATION=${DURATION:-15s}
source bench/lib.sh

dir="$work/latency"; mkdir -p "$dir"
write_config "$dir" "
[handler]
command = [\"sh\", \"-c\", \"echo \\\"\$SUME_JOB_ID \$(date +%s%3N)\\\" >> $dir/starts.log; cat > /dev/null\"]
concurrency = 8"
start_receiver "$dir"
"$BIN" loadgen --config "$dir/config.toml" --rate "$RATE" --duration "$DURATION" --requests 100000000 \
  --connections 8 --dup-ratio 0 --allow-handler | head -1
sleep 2
stop_receiver >/dev/null
sqlite3 "$dir/ledger.sqlite3" "SELECT job_id, received_at FROM jobs" > "$dir/claims.txt"
python3 - "$dir/claims.txt" "$dir/starts.log" <<'PY'
import sys
received = dict(line.strip().split("|") for line in open(sys.argv[1]))
delays = sorted(int(start) - int(received[job]) for job, start in (l.split() for l in open(sys.argv[2])))
pick = lambda p: delays[min(len(delays) - 1, int(len(delays) * p))]
print(f"claim -> handler start, {len(delays)} jobs: p50 {pick(0.5)} ms, p90 {pick(0.9)} ms, "
      f"p99 {pick(0.99)} ms, max {delays[-1]} ms (aim: p99 < 50 ms)")
PY
