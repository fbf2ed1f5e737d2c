"""Through a real Envoy (1.40.0), three findings of issue 22 since fixed:
WebSocket upgrades and CONNECT pass through to the worker (item 4, B5,
B67); a request near Envoy's header limit is routed, the router adding no
header to it (item 5, B6); and an address that is no worker is the router's
500, never a route (item 6, B8).

The clients here are raw sockets (HTTP/1.x, WebSocket frames) and a minimal
HTTP/2 client of our own (h2c, literal HPACK, enough to read a :status), all
standard library: curl 7.88 can neither speak WebSocket nor CONNECT over
h2c. The worker is the echo worker, which answers a WebSocket 101 and echoes
frames, and answers a CONNECT 200 and echoes the tunnel's bytes.
"""

import base64
import hashlib
import json
import os
import socket
import struct
import time
import urllib.request

import pytest

from envoy_stack import LOOPBACK, Stack

TIMEOUT = 60  # seconds any single exchange may take before the test fails

# The workers are 127.0.0.1-8: the echo worker listens on 127.0.0.1 too,
# the address Linux connects to for 0.0.0.0, so were an unspecified address
# routed, the worker would record it. The scripted workers are .5-.8 (the
# pool's own is .1), so a record's worker proves which assignment Envoy
# followed; 127.0.0.1 is the control of the addresses that are no worker.
NETWORK = "127.0.0.0/24"
# B8: no host's address. Each is refused by the router; were one routed,
# Envoy's connect would stay on this machine (envoy_stack.never_a_host).
NON_HOSTS = ["0.0.0.0", "::", "255.255.255.255", "224.0.0.1", "ff02::1", "::ffff:0.0.0.0",
             "::ffff:255.255.255.255"]
SCRIPT = """
demo/ws      OK 0s 127.0.0.5 true -
demo/tunnel  OK 0s 127.0.0.6 true -
demo/x       OK 0s 127.0.0.7 true -
demo/h2      OK 0s 127.0.0.8 true -
demo/local   OK 0s 127.0.0.1 true -
""" + "".join(f"demo/nohost-{i} OK 0s {ip} true -\n" for i, ip in enumerate(NON_HOSTS))
WS = ("demo/ws", "127.0.0.5")
TUNNEL = ("demo/tunnel", "127.0.0.6")
PLAIN = ("demo/x", "127.0.0.7")
H2 = ("demo/h2", "127.0.0.8")


@pytest.fixture(scope="module")
def stack():
    with Stack(script=SCRIPT, sim_flags=["--actors", "0"], workers=1, network=NETWORK, echo_hosts=8,
               script_non_hosts=True) as s:
        yield s


def ext_proc_streams(stack):
    """Envoy's count of ext_proc streams opened (one per request it asked
    the router about), from the stats listener."""
    url = f"http://{LOOPBACK}:{stack.stats_port}/stats/prometheus"
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("envoy_http_ext_proc_streams_started{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def access_entries(stack, predicate, count, timeout=15):
    """The access log's entries matching `predicate`, once there are
    `count` of them (Envoy flushes its log every 100 ms)."""
    deadline = time.monotonic() + timeout
    while len(entries := [e for e in stack.access_log() if predicate(e)]) < count:
        assert time.monotonic() < deadline, f"{len(entries)} of {count} entries after {timeout}s: {entries}"
        time.sleep(0.1)
    return entries


def record_of(stack, request_id):
    [seen] = [r for r in stack.records() if r["request_id"] == request_id]
    return seen


# -- HTTP/1.x over a raw socket ---------------------------------------------

class Conn:
    """One TCP connection to Envoy's HTTP listener, read through a buffer
    (so the bytes after a response head stay readable)."""

    def __init__(self, stack):
        self.sock = socket.create_connection((LOOPBACK, stack.http_port), timeout=TIMEOUT)
        self.file = self.sock.makefile("rb")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.file.close()
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def request(self, start_line, headers):
        """Sends a request head: `start_line` and (name, value) pairs."""
        head = start_line + "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
        self.send(head.encode())

    def head(self):
        """The response's status and headers (lowercased; repeats joined)."""
        status_line = self.file.readline().decode()
        assert status_line, "the connection closed before a response"
        status = int(status_line.split()[1])
        headers = {}
        while (line := self.file.readline().decode()) not in ("\r\n", "\n", ""):
            name, value = line.split(":", 1)
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return status, headers

    def body(self, headers):
        return self.file.read(int(headers.get("content-length", 0)))

    def exactly(self, n):
        data = self.file.read(n)
        assert len(data) == n, f"wanted {n} bytes, the peer closed after {len(data)}"
        return data


def get(stack, headers, path="/", version="HTTP/1.1"):
    """One request; (status, headers, body)."""
    with Conn(stack) as c:
        c.request(f"GET {path} {version}", [("host", "actor.example"), ("connection", "close"), *headers])
        status, head = c.head()
        return status, head, c.body(head)


# -- WebSocket frames (RFC 6455), the client's side -------------------------

def client_frame(opcode, payload, fin=True):
    """A client frame, masked as a client's must be."""
    mask = os.urandom(4)
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def read_frame(read):
    """(fin, opcode, masked, payload) from `read(n)`, which returns n bytes."""
    a, b = read(2)
    n = b & 0x7F
    if n == 126:
        n = struct.unpack("!H", read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", read(8))[0]
    masked = bool(b & 0x80)
    mask = read(4) if masked else b"\0\0\0\0"
    payload = read(n) if n else b""
    return bool(a & 0x80), a & 0x0F, masked, bytes(x ^ mask[i % 4] for i, x in enumerate(payload))


def websocket_accept(key):
    return base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()


# What a test sends and must get back: text, binary of each length encoding
# (7-bit, 16-bit, 64-bit), a fragmented text message, and a ping.
MESSAGES = [
    [(0x1, b"hello, worker", True)],
    [(0x2, bytes(range(256)) * 2, True)],
    [(0x2, os.urandom(70_000), True)],
    [(0x1, "caf\u00e9 ".encode(), False), (0x0, b"au lait", True)],
]


def exchange_websocket(send, read):
    """Every message of MESSAGES, then a ping and a close: each echoed by
    the worker, unmasked, as it was sent."""
    for message in MESSAGES:
        for opcode, payload, fin in message:
            send(client_frame(opcode, payload, fin))
        for opcode, payload, fin in message:
            assert read_frame(read) == (fin, opcode, False, payload)
    send(client_frame(0x9, b"are you there"))
    assert read_frame(read) == (True, 0xA, False, b"are you there"), "a pong with the ping's payload"
    send(client_frame(0x8, struct.pack("!H", 1000) + b"bye"))
    assert read_frame(read) == (True, 0x8, False, struct.pack("!H", 1000)), "the close, same code"


def test_websocket_upgrade_reaches_its_worker_and_echoes_frames(stack):
    """Issue 22 item 4: Envoy answered a WebSocket upgrade 403
    upgrade_failed before the router saw it. Now the router routes it
    (to the scripted worker), the worker answers 101 with the key's
    Sec-WebSocket-Accept, and frames go both ways."""
    actor, ip = WS
    key = base64.b64encode(os.urandom(16)).decode()
    with Conn(stack) as c:
        c.request("GET /chat?room=1 HTTP/1.1", [
            ("host", "actor.example"), ("upgrade", "websocket"), ("connection", "Upgrade"),
            ("sec-websocket-key", key), ("sec-websocket-version", "13"),
            ("ate-target-actor", actor), ("x-client-request-id", "ws-h1")])
        status, headers = c.head()
        assert status == 101, (status, headers, c.file.read1(4096))
        assert headers["upgrade"].lower() == "websocket" and headers["connection"].lower() == "upgrade"
        assert headers["sec-websocket-accept"] == websocket_accept(key)
        exchange_websocket(c.send, c.exactly)
        assert c.file.read(1) == b"", "the worker ends the connection after the close"
    seen = record_of(stack, "ws-h1")
    assert (seen["worker"], seen["actor"], seen["target_port"]) == (f"{ip}:{stack.worker_port}", actor, "80")
    assert (seen["method"], seen["path"], seen["upgrade"]) == ("GET", "/chat?room=1", "websocket")
    assert seen["websocket_key"] == key
    entry = stack.wait_access_log(lambda e: e["path"] == "/chat?room=1")
    assert (entry["response_code"], entry["upstream_host"]) == (101, f"{ip}:{stack.worker_port}")


# -- a minimal HTTP/2 client (h2c, prior knowledge) --------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x8  # RFC 8441
WINDOW = 1 << 30  # what we let Envoy send us, on the connection and each stream


def hpack_int(value, prefix, first=0):
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes(out + [value])


def hpack_read_int(block, i, prefix):
    limit = (1 << prefix) - 1
    value, i = block[i] & limit, i + 1
    shift = 0
    while value >= limit:
        byte, i = block[i], i + 1
        value += (byte & 127) << shift
        shift += 7
        if not byte & 128:
            break
    return value, i


# RFC 7541 Appendix B, the digits: all a :status needs.
HUFFMAN_DIGITS = {"00000": "0", "00001": "1", "00010": "2", "011001": "3", "011010": "4", "011011": "5",
                  "011100": "6", "011101": "7", "011110": "8", "011111": "9"}
STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}


def huffman_digits(data):
    bits, out, code = "".join(f"{b:08b}" for b in data), "", ""
    for bit in bits:
        code += bit
        if code in HUFFMAN_DIGITS:
            out, code = out + HUFFMAN_DIGITS[code], ""
    assert set(code) <= {"1"} and len(code) < 8, f"not a Huffman-coded number: {data!r}"
    return out


def response_status(block):
    """The :status of an HPACK header block (Envoy's first on a connection:
    indexed from the static table, or a literal on :status's name)."""
    i = 0
    while i < len(block):
        byte = block[i]
        if byte & 0x80:  # indexed
            index, i = hpack_read_int(block, i, 7)
            if index in STATIC_STATUS:
                return STATIC_STATUS[index]
            continue
        if byte & 0xE0 == 0x20:  # a table size update
            _, i = hpack_read_int(block, i, 5)
            continue
        index, i = hpack_read_int(block, i, 6 if byte & 0x40 else 4)
        if index == 0:
            n, i = hpack_read_int(block, i, 7)
            i += n
        huffman = block[i] & 0x80
        n, i = hpack_read_int(block, i, 7)
        value, i = block[i:i + n], i + n
        if index in STATIC_STATUS:  # the name :status
            return int(huffman_digits(value) if huffman else value)
    raise AssertionError(f"no :status in {block!r}")


class H2Conn:
    """One HTTP/2 connection to Envoy, one stream at a time in use:
    literal header fields, no Huffman; DATA within the peer's windows."""

    def __init__(self, stack):
        self.sock = socket.create_connection((LOOPBACK, stack.http_port), timeout=TIMEOUT)
        self.file = self.sock.makefile("rb")
        self.settings, self.send_window, self.stream_windows = {}, 65535, {}
        self.status, self.inbox, self.ended, self.reset = {}, {}, set(), {}
        self.sock.sendall(PREFACE + self.frame(SETTINGS, 0, 0, struct.pack("!HI", 0x4, WINDOW))
                          + self.frame(WINDOW_UPDATE, 0, 0, struct.pack("!I", WINDOW - 65535)))
        while not self.settings:
            self.pump()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()
        self.sock.close()

    @staticmethod
    def frame(kind, flags, stream, payload):
        return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream) + payload

    def exactly(self, n):
        data = self.file.read(n)
        assert len(data) == n, "Envoy closed the connection"
        return data

    def pump(self):
        """Reads one frame and keeps what it says."""
        head = self.exactly(9)
        n, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:], "big") & 0x7FFFFFFF
        payload = self.exactly(n)
        if kind == SETTINGS and not flags & 0x1:
            for j in range(0, len(payload), 6):
                key, value = struct.unpack("!HI", payload[j:j + 6])
                if key == 0x4:
                    delta = value - self.settings.get(0x4, 65535)
                    self.stream_windows = {s: w + delta for s, w in self.stream_windows.items()}
                self.settings[key] = value
            self.settings.setdefault(0, 0)  # seen, even when empty
            self.sock.sendall(self.frame(SETTINGS, 0x1, 0, b""))
        elif kind == PING and not flags & 0x1:
            self.sock.sendall(self.frame(PING, 0x1, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack("!I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += increment
            else:
                self.stream_windows[stream] = self.stream_windows.get(stream, 0) + increment
        elif kind == GOAWAY:
            raise AssertionError(f"GOAWAY {payload!r}")
        elif kind == RST_STREAM:
            self.reset[stream] = struct.unpack("!I", payload)[0]
        elif kind in (HEADERS, CONTINUATION):
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            block, end_stream = payload, flags & END_STREAM
            while not flags & END_HEADERS:
                more = self.exactly(9)
                flags = more[4]
                block += self.exactly(int.from_bytes(more[:3], "big"))
            if stream not in self.status:  # the response head, not trailers
                self.status[stream] = response_status(block)
            if end_stream:
                self.ended.add(stream)
        elif kind == DATA:
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            self.inbox[stream] = self.inbox.get(stream, b"") + payload
            if flags & END_STREAM:
                self.ended.add(stream)

    def headers(self, stream, pairs, end_stream=False):
        block = b"".join(b"\x00" + hpack_int(len(n), 7) + n.encode() + hpack_int(len(v), 7) + v.encode()
                         for n, v in pairs)
        self.stream_windows[stream] = self.settings.get(0x4, 65535)
        self.sock.sendall(self.frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block))

    def response(self, stream):
        while stream not in self.status and stream not in self.reset:
            self.pump()
        assert stream not in self.reset, f"stream reset, error {self.reset[stream]}"
        return self.status[stream]

    def send(self, stream, data):
        most = self.settings.get(0x5, 16384)
        while data:
            n = min(len(data), most, self.send_window, self.stream_windows[stream])
            if n <= 0:
                self.pump()
                continue
            self.sock.sendall(self.frame(DATA, 0, stream, data[:n]))
            self.send_window -= n
            self.stream_windows[stream] -= n
            data = data[n:]

    def read(self, stream, n):
        """n bytes of the stream's DATA."""
        while len(self.inbox.get(stream, b"")) < n:
            assert stream not in self.ended and stream not in self.reset, \
                f"stream {stream} ended with {self.inbox.get(stream, b'')!r}"
            self.pump()
        data, self.inbox[stream] = self.inbox[stream][:n], self.inbox[stream][n:]
        return data


def tunnel_bytes(send, read):
    """Bytes both ways through an echoing tunnel: a line, binary with every
    byte value, and 100 kB, each read back exactly."""
    for chunk in [b"ping through the tunnel\n", bytes(range(256)), os.urandom(100_000)]:
        send(chunk)
        assert read(len(chunk)) == chunk


@pytest.mark.parametrize("authority", ["x-host:8443", "[::1]:8443"])
def test_connect_over_http1_is_a_tunnel_to_the_worker(stack, authority):
    """Issue 22 item 4: a CONNECT was resumed by the router, then answered
    404 route_not_found by Envoy. Now it reaches the worker as a CONNECT
    with B5's port (the authority's) as X-Ate-Target-Port; the worker's 200
    opens the tunnel and bytes go both ways."""
    actor, ip = TUNNEL
    request_id = f"connect-h1-{authority}"
    with Conn(stack) as c:
        c.request(f"CONNECT {authority} HTTP/1.1", [("host", authority), ("ate-target-actor", actor),
                                                    ("x-client-request-id", request_id)])
        status, headers = c.head()
        assert status == 200, (status, headers, c.file.read1(4096))
        tunnel_bytes(c.send, c.exactly)
    seen = record_of(stack, request_id)
    assert (seen["worker"], seen["actor"], seen["target_port"]) == (f"{ip}:{stack.worker_port}", actor, "8443")
    assert (seen["method"], seen["path"], seen["upgrade"]) == ("CONNECT", authority, "connect")


def test_connect_with_an_actor_in_the_authority_is_envoys_400(stack):
    """An authority of the form atespace/name:port is no authority: Envoy's
    codec refuses it before the router sees it."""
    with Conn(stack) as c:
        c.request("CONNECT demo/x-host:8443 HTTP/1.1", [("host", "demo/x-host:8443"),
                                                        ("ate-target-actor", TUNNEL[0]),
                                                        ("x-client-request-id", "connect-slash")])
        status, headers = c.head()
    assert status == 400, (status, headers)
    assert "x-atenet-reason" not in headers
    entry = stack.wait_access_log(lambda e: e["response_code_details"] == "http1.invalid_url")
    assert (entry["response_code"], entry["upstream_host"]) == (400, None)
    assert [r for r in stack.records() if r["request_id"] == "connect-slash"] == []


def test_http10_is_envoys_426(stack):
    """HTTP/1.0 is refused by Envoy's codec (426 Upgrade Required, its
    default without accept_http_10), before the router: kept so."""
    before = ext_proc_streams(stack)
    status, headers, _ = get(stack, [("ate-target-actor", PLAIN[0]), ("x-client-request-id", "http10")],
                             path="/http10", version="HTTP/1.0")
    assert status == 426, (status, headers)
    assert "x-atenet-reason" not in headers
    # A codec error: the access log has no method or path, only the details.
    entry = stack.wait_access_log(lambda e: e["response_code"] == 426)
    assert (entry["response_code_details"], entry["response_flags"]) == ("low_version", "DPE")
    assert entry["upstream_host"] is None
    assert ext_proc_streams(stack) == before, "the router was never asked"
    assert [r for r in stack.records() if r["request_id"] == "http10"] == []


def test_h2_connect_is_a_tunnel_to_the_worker(stack):
    """A plain HTTP/2 CONNECT (:authority only, RFC 9113 8.5; it takes
    upgrade_type CONNECT, not allow_connect): Envoy sends it to the worker
    as an HTTP/1.1 CONNECT with B5's port; the worker's 200 is the stream's
    :status 200 and DATA goes both ways."""
    actor, ip = H2
    with H2Conn(stack) as c:
        c.headers(1, [(":method", "CONNECT"), (":authority", "x-host:8443"), ("ate-target-actor", actor),
                      ("x-client-request-id", "connect-h2")])
        assert c.response(1) == 200
        tunnel_bytes(lambda data: c.send(1, data), lambda n: c.read(1, n))
    seen = record_of(stack, "connect-h2")
    assert (seen["worker"], seen["actor"], seen["target_port"]) == (f"{ip}:{stack.worker_port}", actor, "8443")
    assert (seen["method"], seen["path"], seen["upgrade"]) == ("CONNECT", "x-host:8443", "connect")


def test_h2_extended_connect_websocket_reaches_its_worker(stack):
    """RFC 8441: Envoy offers SETTINGS_ENABLE_CONNECT_PROTOCOL, takes a
    CONNECT with :protocol websocket, and sends it to the worker as an
    HTTP/1.1 upgrade (GET, Upgrade: websocket); the worker's 101 is the
    stream's :status 200 and the WebSocket frames go both ways in DATA."""
    actor, ip = H2
    with H2Conn(stack) as c:
        assert c.settings.get(SETTINGS_ENABLE_CONNECT_PROTOCOL) == 1, c.settings
        c.headers(1, [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                      (":path", "/chat/h2"), (":authority", "actor.example"), ("sec-websocket-version", "13"),
                      ("ate-target-actor", actor), ("x-client-request-id", "ws-h2")])
        assert c.response(1) == 200
        exchange_websocket(lambda data: c.send(1, data), lambda n: c.read(1, n))
    seen = record_of(stack, "ws-h2")
    assert (seen["worker"], seen["actor"], seen["target_port"]) == (f"{ip}:{stack.worker_port}", actor, "80")
    assert (seen["method"], seen["path"], seen["upgrade"]) == ("GET", "/chat/h2", "websocket")
    # Envoy 1.40 makes up no Sec-WebSocket-Key for the HTTP/1.1 side: a
    # worker that insists on one (RFC 6455 says it must) refuses the bridge.
    assert seen["websocket_key"] is None


def before_the_fix(config):
    """The bootstrap as it was before issue 22 item 4: no upgrade_configs,
    no allow_connect, no CONNECT route."""
    for block, rest in [("          upgrade_configs:\n          - upgrade_type: websocket\n          - upgrade_type: CONNECT\n",
                         ""),
                        ("          http2_protocol_options:\n            allow_connect: true\n",
                         "          http2_protocol_options:\n")]:
        assert block in config, block
        config = config.replace(block, rest)
    start = config.index("              - match: { connect_matcher: {} }\n")
    return config[:start] + config[config.index('              - match: { prefix: "/" }\n'):]


def test_before_the_fix_envoy_refused_websocket_and_connect():
    """Why the bootstrap has upgrade_configs, allow_connect and the CONNECT
    route: without them Envoy 1.40 answers a WebSocket upgrade 403
    upgrade_failed before the router is asked, a CONNECT (HTTP/1.1 or
    HTTP/2) 404 route_not_found after the router resumed the actor, and an
    extended CONNECT is a protocol error (no SETTINGS_ENABLE_CONNECT_PROTOCOL
    offered; the connection is closed)."""
    with Stack(script=SCRIPT, sim_flags=["--actors", "0"], workers=1, network=NETWORK, echo_hosts=8,
               script_non_hosts=True, edit_config=before_the_fix) as s:
        streams = ext_proc_streams(s)
        with Conn(s) as c:
            c.request("GET /ws-refused HTTP/1.1", [
                ("host", "actor.example"), ("upgrade", "websocket"), ("connection", "Upgrade"),
                ("sec-websocket-key", base64.b64encode(os.urandom(16)).decode()), ("sec-websocket-version", "13"),
                ("ate-target-actor", WS[0])])
            assert c.head()[0] == 403
        entry = s.wait_access_log(lambda e: e["path"] == "/ws-refused")
        assert entry["response_code_details"] == "upgrade_failed"
        assert ext_proc_streams(s) == streams, "refused before the router"
        with Conn(s) as c:
            c.request("CONNECT x-host:8443 HTTP/1.1", [("host", "x-host:8443"), ("ate-target-actor", TUNNEL[0])])
            assert c.head()[0] == 404
        with H2Conn(s) as c:
            c.headers(1, [(":method", "CONNECT"), (":authority", "x-host:8443"), ("ate-target-actor", H2[0])])
            assert c.response(1) == 404
        refused = access_entries(s, lambda e: e["method"] == "CONNECT", 2)
        assert [(e["response_code_details"], e["response_flags"]) for e in refused] == [("route_not_found", "NR")] * 2
        assert ext_proc_streams(s) == streams + 2, "the router was asked, and resumed the actor, for nothing"
        with H2Conn(s) as c:
            assert c.settings.get(SETTINGS_ENABLE_CONNECT_PROTOCOL, 0) == 0
            c.headers(1, [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                          (":path", "/ws-h2-refused"), (":authority", "actor.example"),
                          ("ate-target-actor", H2[0])])
            with pytest.raises(AssertionError, match="Envoy closed the connection"):
                c.response(1)
        assert s.records() == []


# -- Envoy's header limit (issue 22 item 5, B6) -----------------------------

LIMIT = 100  # Envoy's default max_headers_count; a request's header lines, Host included
# What Envoy adds to a routed HTTP/1.1 request (use_remote_address, the
# route): none of them counts against the limit.
ENVOY_ADDS = {"x-forwarded-for", "x-forwarded-proto", "x-envoy-internal", "x-request-id",
              "x-envoy-expected-rq-timeout-ms", "x-ate-target-port"}


def with_headers(stack, total, request_id, actor_lines=1):
    """A GET of exactly `total` header lines (Host, Connection and
    `actor_lines` ate-target-actor included, the rest x-fill-N):
    (status, headers, body)."""
    fixed = [("ate-target-actor", PLAIN[0])] * actor_lines + [("x-client-request-id", request_id)]
    fill = [(f"x-fill-{i}", "v") for i in range(total - 2 - len(fixed))]
    return get(stack, fixed + fill, path=f"/limit/{request_id}")


@pytest.mark.parametrize("total", [90, 95, 96, 99, LIMIT])
def test_up_to_envoys_limit_a_request_is_routed_with_its_target_port(stack, total):
    """The request carries its actor header once, so the router sends no
    header mutation (B6). Up to Envoy's limit of 100 header lines it is
    routed. (Before B6 the router always set the header: with this
    bootstrap, from 95 lines on, Envoy answered 500
    header_mutation_result_exceeds_limit.) The route's X-Ate-Target-Port
    still reaches the worker at the limit: headers Envoy adds itself are
    not held to it."""
    status, _, body = with_headers(stack, total, f"limit-{total}")
    assert status == 200, (status, body)
    seen = json.loads(body)["headers"]
    assert seen["x-ate-target-port"] == "80" and seen["ate-target-actor"] == PLAIN[0]
    # The client's lines but the hop-by-hop Connection, and Envoy's own on
    # top, the route's X-Ate-Target-Port among them: at the limit, 105.
    assert len(seen) == total - 1 + len(ENVOY_ADDS), sorted(set(seen) - {f"x-fill-{i}" for i in range(total)})
    assert ENVOY_ADDS <= set(seen)
    record = record_of(stack, f"limit-{total}")
    assert (record["worker"], record["target_port"]) == (f"{PLAIN[1]}:{stack.worker_port}", "80")


def test_over_envoys_limit_is_envoys_431_before_the_router(stack):
    before = ext_proc_streams(stack)
    status, headers, body = with_headers(stack, LIMIT + 1, "limit-over")
    assert (status, body) == (431, b"Request Header Fields Too Large"), (status, headers, body)
    assert "x-atenet-reason" not in headers
    assert ext_proc_streams(stack) == before, "the router was never asked"
    assert [r for r in stack.records() if r["request_id"] == "limit-over"] == []


# Measured: with the router's mutation (the actor header repeated), the
# first header count Envoy refuses.
MUTATION_LIMIT = 96


@pytest.mark.parametrize("total", [MUTATION_LIMIT - 1, MUTATION_LIMIT, LIMIT])
def test_a_repeated_actor_header_near_the_limit(stack, total):
    """With ate-target-actor twice the router must set it (B6), and Envoy
    applies that mutation against its limit: up to 95 header lines the
    worker gets one canonical header; from 96 to 100 Envoy answers
    header_mutation_result_exceeds_limit itself, 503 by the bootstrap's
    status_on_error (500 before it), with no x-atenet-reason, and nothing
    reaches the worker. (101 and more: the 431 above.)"""
    request_id = f"twice-{total}"
    status, headers, body = with_headers(stack, total, request_id, actor_lines=2)
    if total < MUTATION_LIMIT:
        assert status == 200, (status, body)
        assert json.loads(body)["headers"]["ate-target-actor"] == PLAIN[0], "one header, not two"
        return
    assert (status, body, headers.get("x-atenet-reason")) == (503, b"", None), (status, headers, body)
    entry = stack.wait_access_log(lambda e: e["path"] == f"/limit/{request_id}")
    assert entry["response_code_details"] == "header_mutation_result_exceeds_limit"
    assert entry["upstream_host"] is None
    assert [r for r in stack.records() if r["request_id"] == request_id] == []


# -- addresses that are no worker (issue 22 item 6, B8) ---------------------

@pytest.mark.parametrize("ip", NON_HOSTS)
def test_an_address_that_is_no_worker_is_the_routers_500(stack, ip):
    """ateapi naming 0.0.0.0 was routed (Envoy connected to its own host:
    here, the echo worker on 127.0.0.1), and 255.255.255.255 or :: got
    Envoy's 503 with no reason. Now each is the router's 500 routing
    failed, and the worker sees nothing."""
    actor = f"demo/nohost-{NON_HOSTS.index(ip)}"
    request_id = f"nohost-{ip}"
    status, headers, body = get(stack, [("ate-target-actor", actor), ("x-client-request-id", request_id)],
                                path=f"/nohost/{ip}")
    assert (status, headers.get("x-atenet-reason")) == (500, "atenet_routing_failed"), (status, headers, body)
    assert body == f"actor {actor} routing failed".encode()
    entry = stack.wait_access_log(lambda e: e["path"] == f"/nohost/{ip}")
    assert (entry["response_code_details"], entry["upstream_host"]) == ("atenet_routing_failed", None)
    assert [r for r in stack.records() if r["request_id"] == request_id] == []


def test_the_control_127_0_0_1_is_routed(stack):
    """The address Linux connects to for 0.0.0.0 is a worker here: routed
    and recorded, so the test above would see a routed 0.0.0.0."""
    status, _, body = get(stack, [("ate-target-actor", "demo/local"), ("x-client-request-id", "local")])
    assert status == 200, (status, body)
    assert record_of(stack, "local")["worker"] == f"127.0.0.1:{stack.worker_port}"
