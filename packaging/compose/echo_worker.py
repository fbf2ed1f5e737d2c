"""A stand-in worker for the compose stack: answers every request with what it
received, as JSON, so the end-to-end run can see that a request routed by
atenet-router reached a worker, for the right actor and port.

    python echo_worker.py [--listen ADDRESS] [--port PORT]

The answer is 200 with {"method", "path", "headers", "body", "worker"}:
header names lowercased (a repeated header's values joined with ", "), the
body as text. Standard library only; one thread per connection.
"""

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's upstream pool expects
    server_version = "atenet-echo-worker"

    def echo(self):
        body = self.read_body()
        headers = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        answer = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "worker": "%s:%d" % self.server.server_address[:2],
        }).encode() + b"\n"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def read_body(self):
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers, up to the blank line
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = echo

    def log_message(self, format, *args):
        sys.stderr.write("echo-worker: %s %s\n" % (self.address_string(), format % args))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.listen, args.port), Echo)
    server.daemon_threads = True
    # As PID 1 in a container, SIGTERM would otherwise be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # The real port (with --port 0), for whoever started us.
    print("echo-worker listening on %s:%d" % server.server_address[:2], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
