#!/usr/bin/env bash
# The bad day: the handler's downstream is down for OUTAGE seconds while JOBS jobs arrive; then
# it comes back. Backoff compressed (1 s doubling to 8 s, max_attempts 5: a job left alone dies
# ~15 s after its first failure); every hold setting at its default. Prints a table: jobs,
# outage, dead, failed attempts counted per job, requests the downstream got during the outage,
# time from its return to the backlog drained, peak handler rate (a 1 s window) after it.
#
#   bench/outage.sh                     JOBS=300 OUTAGE=40, the build of this tree
#   BIN=/path/to/old/sume-receiver bench/outage.sh      the same scenario on another build
#   HANDLER_EXTRA='max_probe_interval = "10s"' bench/outage.sh     more [handler] keys
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-300}; OUTAGE=${OUTAGE:-40}
source bench/lib.sh

dir="$work/outage"; mkdir -p "$dir"
down_port=$((port + 1))
touch "$dir/down"
# The downstream: 500 while $dir/down exists, else 204; logs "time_ms status" per request.
python3 - "$down_port" "$dir" <<'PY' &
import http.server, os, sys, time
port, dir = int(sys.argv[1]), sys.argv[2]
log = open(os.path.join(dir, "requests.log"), "a", buffering=1)
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        status = 500 if os.path.exists(os.path.join(dir, "down")) else 204
        log.write(f"{int(time.time() * 1000)} {status}\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
PY
background_pids+=($!)

ACCESS_LOG=false write_config "$dir" "
[handler]
url = \"http://127.0.0.1:$down_port/jobs\"
backoff = \"1s\"
max_backoff = \"8s\"
max_attempts = 5
${HANDLER_EXTRA:-}"
start_receiver "$dir"
outage_start=$(date +%s%3N)
# The jobs arrive during the first quarter of the outage.
"$BIN" loadgen --config "$dir/config.toml" --requests "$JOBS" --rate $((JOBS * 4 / OUTAGE + 1)) \
  --connections 4 --dup-ratio 0 --allow-handler --no-check >/dev/null
sleep $(( (outage_start + OUTAGE * 1000 - $(date +%s%3N)) / 1000 ))
rm "$dir/down"
back=$(date +%s%3N)
waiting="SELECT count(*) FROM jobs WHERE state IN ('claimed', 'retrying', 'running')"
for _ in $(seq 1200); do
  [ "$(sqlite3 "$dir/ledger.sqlite3" "$waiting")" = 0 ] && break
  sleep 0.5
done
drained=$(sqlite3 "$dir/ledger.sqlite3" "SELECT max(finished_at) FROM jobs")
stop_receiver >/dev/null
# The journal's lines about the hold (none from a build without it).
grep -h "handler hold" "$dir/receiver.log" | cut -c1-300 || true
sqlite3 "$dir/ledger.sqlite3" \
  "SELECT count(*), sum(state = 'dead'), sum(attempts - (state = 'done')) FROM jobs" > "$dir/jobs.txt"
python3 - "$dir" "$OUTAGE" "$back" "$drained" <<'PY'
import sys
dir, outage, back, drained = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4] or 0)
jobs, dead, failed = (int(x or 0) for x in open(f"{dir}/jobs.txt").read().strip().split("|"))
requests = [(int(t), int(s)) for t, s in (l.split() for l in open(f"{dir}/requests.log"))]
during = sum(1 for t, _ in requests if t < back)
after = sorted(t for t, _ in requests if t >= back)
peak = max((sum(1 for u in after if t <= u < t + 1000) for t in after), default=0)
drain = f"{(drained - back) / 1000:.1f} s" if drained >= back else "-"
print("| jobs | outage | dead | failed attempts per job | requests during the outage | return -> drained | peak rate after |")
print("|---|---|---|---|---|---|---|")
print(f"| {jobs} | {outage} s | {dead} | {failed / max(jobs, 1):.2f} | {during} | {drain} | {peak}/s |")
PY
