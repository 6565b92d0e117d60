#!/usr/bin/env bash
# Prints N [[route]]s for bench/outside.sh's RECEIVER_CONFIG: N-1 that the benchmark's
# deliveries (job.completed) walk past, each with a field condition, then one that takes them.
# The walk over the routes is what a claim pays for having many.
set -euo pipefail
count=${1:-20}
for i in $(seq 1 $((count - 1))); do
  printf '[[route]]\nname = "skipped-%d"\nevent_types = ["job.failed-%d", "job.other.*"]\nfields = { queue = ["q%d", "r%d"] }\n[route.handler]\ncommand = ["true"]\n\n' "$i" "$i" "$i" "$i"
done
printf '[[route]]\nname = "taken"\nevent_types = ["job.*"]\n[route.handler]\ncommand = ["true"]\n'
