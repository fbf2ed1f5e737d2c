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

Three request headers shape the answer, for tests of what Envoy does with
a worker's failures: `x-echo-status: N` answers with status N instead of
200 (200 to 599, but 204 and 304, which carry no body); `x-echo-grpc-status:
N` adds the response header `grpc-status: N` (0 to 16), as a gRPC server's
trailers-only answer carries it; and `x-echo-delay-ms: N` waits N
milliseconds (at most 60000) after recording the request and before
answering. Any other value is ignored.

--record PATH appends one JSON line per request to PATH before the answer
is sent (so a client holding a 200 can already read its line): time,
worker, actor (ate-target-actor), target_port (x-ate-target-port),
request_id (the client's x-client-request-id, else null), method, path,
body_sha256, body_length. A test reads it as the truth of what each worker
received. Standard library only; one thread per connection.

Upgrades and tunnels, as Envoy passes them through:
- A GET with `Upgrade: websocket` is answered 101 (RFC 6455: the
  Sec-WebSocket-Accept of its Sec-WebSocket-Key; without a key, as an
  HTTP/2 extended CONNECT bridged to HTTP/1.1 may arrive, none is sent),
  then every text, binary or continuation frame is echoed back as it came
  (unmasked), a ping is answered with a pong, and a close with a close of
  the same code, which ends the connection. An unmasked client frame gets
  close 1002.
- A CONNECT (path = the authority) is answered 200 and every byte that
  follows is echoed back through the tunnel until the peer closes: a stand-in
  for a worker that would tunnel to the target port (x-ate-target-port).
Both are recorded like any request (empty body) with one more field,
"upgrade": "websocket" or "connect" (other records have none), and a
WebSocket's record also "websocket_key" (its Sec-WebSocket-Key, or null).
"""

import argparse
import base64
import errno
import hashlib
import http.client
import json
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A header a client may set to find its request in the record; Envoy passes
# it through untouched (unlike x-request-id, which it may regenerate).
REQUEST_ID_HEADER = "x-client-request-id"
# http.server refuses a request of more than 100 headers (431), as many as
# Envoy's own default limit: with Envoy's additions on top, that would be
# the limit a test through Envoy measured. A worker stand-in takes more.
http.client._MAXHEADERS = 1000
# Headers a test sets to have the worker fail or be slow (see the docstring).
STATUS_HEADER = "x-echo-status"
GRPC_STATUS_HEADER = "x-echo-grpc-status"
DELAY_HEADER = "x-echo-delay-ms"
MAX_DELAY_MS = 60000
# RFC 6455 section 1.3: the GUID appended to Sec-WebSocket-Key.
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


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

    def merged_headers(self):
        headers = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return headers

    def local_worker(self):
        local = self.connection.getsockname()
        return ("[%s]:%d" if ":" in local[0] else "%s:%d") % local[:2]

    def record(self, headers, worker, digest, length, upgrade=None, **more):
        entry = {
            "time": time.time(),
            "worker": worker,
            "actor": headers.get("ate-target-actor"),
            "target_port": headers.get("x-ate-target-port"),
            "request_id": headers.get(REQUEST_ID_HEADER),
            "method": self.command,
            "path": self.path,
            "body_sha256": digest,
            "body_length": length,
        }
        if upgrade:
            entry["upgrade"] = upgrade
        entry.update(more)
        self.server.recorder.write(entry)

    def echo(self):
        body = self.read_body()
        headers = self.merged_headers()
        worker = self.local_worker()
        digest = hashlib.sha256(body).hexdigest()
        self.record(headers, worker, digest, len(body))
        status, delay_ms = asked_status(headers), asked_delay_ms(headers)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        answer = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "body_sha256": digest,
            "body_length": len(body),
            "worker": worker,
        }).encode() + b"\n"
        self.send_response(status)
        grpc_status = asked_grpc_status(headers)
        if grpc_status is not None:
            self.send_header("grpc-status", str(grpc_status))
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

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = echo

    def do_GET(self):
        if self.headers.get("upgrade", "").strip().lower() == "websocket":
            self.websocket()
        else:
            self.echo()

    # -- WebSocket (RFC 6455, the server's side) ---------------------------

    def websocket(self):
        headers = self.merged_headers()
        key = headers.get("sec-websocket-key")
        self.record(headers, self.local_worker(), hashlib.sha256(b"").hexdigest(), 0, "websocket",
                    websocket_key=key)
        self.close_connection = True
        self.send_response(101, "Switching Protocols")
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        if key:
            accept = base64.b64encode(hashlib.sha1((key.strip() + WEBSOCKET_GUID).encode()).digest())
            self.send_header("sec-websocket-accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            frame = self.read_frame()
            if frame is None:
                return  # the peer went away without a close
            fin, opcode, masked, payload = frame
            if not masked:
                self.write_frame(True, 0x8, struct.pack("!H", 1002))
                return
            if opcode in (0x0, 0x1, 0x2):  # continuation, text, binary: as they came
                self.write_frame(fin, opcode, payload)
            elif opcode == 0x9:  # ping
                self.write_frame(True, 0xA, payload)
            elif opcode == 0x8:  # close: the same code back, then the end
                self.write_frame(True, 0x8, payload[:2])
                return
            elif opcode != 0xA:  # a pong needs nothing; anything else is a protocol error
                self.write_frame(True, 0x8, struct.pack("!H", 1002))
                return

    def read_exactly(self, n):
        data = self.rfile.read(n)
        return data if len(data) == n else None

    def read_frame(self):
        """(fin, opcode, masked, unmasked payload), or None at EOF."""
        head = self.read_exactly(2)
        if head is None:
            return None
        fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
        masked, length = bool(head[1] & 0x80), head[1] & 0x7F
        if length == 126:
            extra = self.read_exactly(2)
            length = struct.unpack("!H", extra)[0] if extra else None
        elif length == 127:
            extra = self.read_exactly(8)
            length = struct.unpack("!Q", extra)[0] if extra else None
        if length is None:
            return None
        mask = self.read_exactly(4) if masked else b"\0\0\0\0"
        payload = self.read_exactly(length) if length else b""
        if mask is None or payload is None:
            return None
        if masked:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return fin, opcode, masked, payload

    def write_frame(self, fin, opcode, payload):
        """A server frame: never masked."""
        first = (0x80 if fin else 0) | opcode
        if len(payload) < 126:
            head = struct.pack("!BB", first, len(payload))
        elif len(payload) < 1 << 16:
            head = struct.pack("!BBH", first, 126, len(payload))
        else:
            head = struct.pack("!BBQ", first, 127, len(payload))
        self.wfile.write(head + payload)
        self.wfile.flush()

    # -- CONNECT: a tunnel that echoes -------------------------------------

    def do_CONNECT(self):
        headers = self.merged_headers()
        self.record(headers, self.local_worker(), hashlib.sha256(b"").hexdigest(), 0, "connect")
        self.close_connection = True
        self.send_response(200, "Connection Established")
        self.end_headers()
        self.wfile.flush()
        while True:
            data = self.rfile.read1(65536)
            if not data:
                break
            self.wfile.write(data)
            self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def log_message(self, format, *args):
        sys.stderr.write("echo-worker: %s %s\n" % (self.address_string(), format % args))


def asked_status(headers):
    """The status `x-echo-status` asks for, else 200."""
    try:
        status = int(headers.get(STATUS_HEADER, "200"))
    except ValueError:
        return 200
    return status if 200 <= status <= 599 and status not in (204, 304) else 200


def asked_grpc_status(headers):
    """The grpc-status `x-echo-grpc-status` asks for, else None."""
    try:
        status = int(headers.get(GRPC_STATUS_HEADER, ""))
    except ValueError:
        return None
    return status if 0 <= status <= 16 else None


def asked_delay_ms(headers):
    """The delay `x-echo-delay-ms` asks for, else 0."""
    try:
        delay = int(headers.get(DELAY_HEADER, "0"))
    except ValueError:
        return 0
    return delay if 0 <= delay <= MAX_DELAY_MS else 0


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5. A burst of parked requests
    # served at once opens that many connections from Envoy together; on a
    # loaded host the accept loop falls behind, the kernel drops the
    # handshake's last ACK of the overflow, and Envoy, whose side of such a
    # connection is open, waits on it while the kernel retries its SYN-ACK
    # for about a minute (seen: 19 of 100 clients timed out after 60 s).
    request_queue_size = 1024

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
