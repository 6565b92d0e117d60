#!/usr/bin/env bash
# What tracing costs a delivery: the receiver's CPU time per delivery (user + system, every
# thread) with tracing off, on at sample_ratio 1.0, on at 0.01, and on at 1.0 with the
# collector down (every export refused: spans dropped and counted). The cases run in ROUNDS
# interleaved rounds, so that a neighbour's load spreads over all of them. The collector is a
# sink that answers 200 to every export (python3's http.server).
#
#   bench/traces.sh
#
# Knobs (environment): REQUESTS (20000 a case and round), CONNECTIONS (16), ROUNDS (3),
# CASES (which of the four, space-separated), BIN (a prebuilt sume-receiver; default: build
# release), BASELINE (a release binary built
# with `--features bench` from before tracing existed: adds its case, "before", to compare
# with "off").
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-20000}; CONNECTIONS=${CONNECTIONS:-16}; ROUNDS=${ROUNDS:-3}
export ACCESS_LOG=false
source bench/lib.sh

sink_port=$((port + 1))
python3 - "$sink_port" <<'PY' 2>/dev/null &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
background_pids+=($!)

tracing_toml() {  # ENDPOINT_PORT RATIO
  printf '\n[tracing]\nendpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\n' "$1" "$2"
}

declare -A cpu_us delivered
read -ra cases <<<"${CASES:-off on-1.0 on-0.01 on-1.0-collector-down}"
[ -n "${BASELINE:-}" ] && cases=(before "${cases[@]}")
for round in $(seq "$ROUNDS"); do
  for name in "${cases[@]}"; do
    dir="$work/$name-$round"; mkdir -p "$dir"
    bin=$BIN
    case $name in
      before) extra=""; bin=$BASELINE ;;
      off) extra="" ;;
      on-1.0) extra=$(tracing_toml "$sink_port" 1.0) ;;
      on-0.01) extra=$(tracing_toml "$sink_port" 0.01) ;;
      # Port 9 (discard) refuses on loopback: every export fails at once.
      on-1.0-collector-down) extra=$(tracing_toml 9 1.0) ;;
    esac
    write_config "$dir" "$extra"
    BIN=$bin start_receiver "$dir"
    read -ra before <<<"$(usage "$receiver_pid")"
    report=$("$bin" loadgen --config "$dir/config.toml" --json --connections "$CONNECTIONS" \
      --requests "$REQUESTS" --dup-ratio 0)
    read -ra after <<<"$(usage "$receiver_pid")"
    stop_receiver >/dev/null
    ok=$(echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['statuses'].get('200', 0))")
    cpu_us[$name]=$(( ${cpu_us[$name]:-0} + after[0] - before[0] ))
    delivered[$name]=$(( ${delivered[$name]:-0} + ok ))
    echo "  round $round $name: $ok deliveries answered 200, $(( (after[0] - before[0]) / (ok > 0 ? ok : 1) )) us CPU each" >&2
    rm -rf "$dir"
  done
done
echo "CPU per delivery (receiver, user + system), $ROUNDS rounds of $REQUESTS at C = $CONNECTIONS:"
for name in "${cases[@]}"; do
  python3 -c "print('  %-24s %6.1f us  (%d deliveries)' % ('$name', ${cpu_us[$name]} / max(1, ${delivered[$name]}), ${delivered[$name]}))"
done
