#!/usr/bin/env python3
"""An example HTTP handler: saves each job's body as a file of its own in DIR.

    python3 http_handler.py 127.0.0.1:9000 /srv/sume-jobs

    [handler]
    url = "http://127.0.0.1:9000/sume-jobs"

The receiver POSTs the delivery's body exactly as Sume sent it, with the headers x-sume-job-id,
x-sume-attempt (1, 2, ...) and x-sume-delivery-source (webhook, poll). Any 2xx answer: the job
is done. Any other status, no answer within handler.timeout, or a refused connection: the attempt
failed, and the first 2 KiB of the answer become the job's last_error.

An attempt runs again after a crash of the receiver, so the work must be safe to repeat: here
the same job always writes the same file, and a half-written file never takes its place.
Python's standard library only.
"""

import hashlib
import os
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/sume-jobs":
            self.send_error(404)
            return
        job_id = self.headers.get("x-sume-job-id", "")
        attempt = self.headers.get("x-sume-attempt", "")
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        try:
            # A job id may hold '/' or start with '.': name the file by its hash.
            name = hashlib.sha256(job_id.encode()).hexdigest() + ".json"
            fd, tmp = tempfile.mkstemp(dir=DIR, prefix=".incoming.")
            with os.fdopen(fd, "wb") as file:
                file.write(body)
            os.replace(tmp, os.path.join(DIR, name))
        except OSError as error:
            # A 5xx fails the attempt; the receiver retries it after its backoff.
            self.send_error(500, explain=str(error))
            return
        print(f"saved {job_id} (attempt {attempt}) as {name}", file=sys.stderr)
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: http_handler.py HOST:PORT DIR")
    host, port = sys.argv[1].rsplit(":", 1)
    DIR = sys.argv[2]
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
