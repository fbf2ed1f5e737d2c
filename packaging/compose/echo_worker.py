"""A stand-in worker: answers every request with what it received, as JSON,
so an end-to-end run can see that a request routed by atenet-router reached
the worker ateapi named, for the right actor and port.

    python echo_worker.py [--listen ADDRESS]... [--port PORT] [--record PATH]

--listen may be repeated: one process then stands in for many workers, one
per address (127.0.1.1, 127.0.1.2, ... on loopback), all on the same port.
With --port 0 a port free on every address is picked. The first stdout line
is `echo-worker listening on ADDR:PORT [ADDR:PORT...]`.

The answer is 200 with {"method", "path", "headers", "body", "body_sha256",
"body_length", "worker"}: header names lowercased (a repeated header's values
joined with ", "), the body as text, and "worker" the local address the
connection really reached (the accepted socket's own name, not the
configured one: that is what proves where Envoy sent it).

--record PATH appends one JSON line per request to PATH before the answer
is sent (so a client holding a 200 can already read its line): time,
worker, actor (ate-target-actor), target_port (x-ate-target-port),
request_id (the client's x-client-request-id, else null), method, path,
body_sha256, body_length. A test reads it as the truth of what each worker
received. Standard library only; one thread per connection.
"""

import argparse
import errno
import hashlib
import json
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A header a client may set to find its request in the record; Envoy passes
# it through untouched (unlike x-request-id, which it may regenerate).
REQUEST_ID_HEADER = "x-client-request-id"


class Recorder:
    """Appends JSON lines to a file, one whole line per write, thread-safe."""

    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8") if path else None
        self.lock = threading.Lock()

    def write(self, entry):
        if self.file is None:
            return
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self.lock:
            self.file.write(line)
            self.file.flush()


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's upstream pool expects
    server_version = "atenet-echo-worker"

    def echo(self):
        body = self.read_body()
        headers = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        local = self.connection.getsockname()
        worker = ("[%s]:%d" if ":" in local[0] else "%s:%d") % local[:2]
        digest = hashlib.sha256(body).hexdigest()
        self.server.recorder.write({
            "time": time.time(),
            "worker": worker,
            "actor": headers.get("ate-target-actor"),
            "target_port": headers.get("x-ate-target-port"),
            "request_id": headers.get(REQUEST_ID_HEADER),
            "method": self.command,
            "path": self.path,
            "body_sha256": digest,
            "body_length": len(body),
        })
        answer = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "body_sha256": digest,
            "body_length": len(body),
            "worker": worker,
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


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, recorder):
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.recorder = recorder
        super().__init__(address, Echo)


def bind_all(hosts, port, recorder, attempts=50):
    """One server per host, all on one port. With port 0 the first host's
    ephemeral port is tried on the others, and a fresh one when any of
    them has it taken."""
    for _ in range(attempts if port == 0 else 1):
        servers = []
        try:
            for host in hosts:
                chosen = servers[0].server_address[1] if servers else port
                servers.append(Server((host, chosen), recorder))
            return servers
        except OSError as e:
            for server in servers:
                server.server_close()
            if port != 0 or e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no port free on all of {len(hosts)} addresses")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", action="append", help="address to listen on (repeatable; default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--record", help="append one JSON line per request received to this file")
    args = parser.parse_args()
    servers = bind_all(args.listen or ["0.0.0.0"], args.port, Recorder(args.record))
    # As PID 1 in a container, SIGTERM would otherwise be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    # The real addresses (with --port 0), for whoever started us.
    names = [("[%s]:%d" if ":" in s.server_address[0] else "%s:%d") % s.server_address[:2] for s in servers]
    print("echo-worker listening on " + " ".join(names), flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
