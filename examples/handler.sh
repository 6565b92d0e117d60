#!/bin/sh
# An example command handler: saves each job's body as a file of its own in DIR.
#
#   [handler]
#   command = ["/usr/local/bin/handler.sh", "/var/lib/sume-receiver/jobs"]
#
# The receiver runs it once per attempt, with no shell in between: the delivery's body exactly as
# Sume sent it on stdin, and SUME_JOB_ID, SUME_EVENT_TYPE, SUME_ATTEMPT (1, 2, ...) and
# SUME_DELIVERY_SOURCE (webhook, poll) in the environment. Exit 0: the job is done. Any other
# exit: the attempt failed, and the last 2 KiB of stderr become the job's last_error.
#
# An attempt runs again after a crash of the receiver, so the work must be safe to repeat: here
# the same job always writes the same file, and a half-written file never takes its place.
set -eu

dir=${1:?usage: handler.sh DIR}

# A job id may hold '/' or start with '.': name the file by its hash, not by the id itself.
name=$(printf '%s' "$SUME_JOB_ID" | sha256sum | cut -c 1-64)

tmp=$(mktemp "$dir/.incoming.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat > "$tmp"
mv "$tmp" "$dir/$name.json"

# On success stderr goes to the service's log.
echo "saved ${SUME_EVENT_TYPE:-an event} $SUME_JOB_ID (attempt $SUME_ATTEMPT) as $name.json" >&2
