//! The router's HTTP endpoints: `/metrics`, `/healthz` and `/readyz` on the
//! metrics listener (B31, B41), `/statusz` on its own (B42).
//!
//! These listeners face whatever can reach them, so nothing a peer does may
//! starve a probe or grow the process without bound (B61). tiny_http's
//! `Server` cannot promise that: it owns its accept loop, starts a thread per
//! connection, buffers a header line without limit, sets no timeouts, and
//! stops accepting for good on the first `accept()` error; and since it only
//! takes a listener, nothing can stand between its `accept()` and its reader
//! short of proxying every byte. So each listener here is one thread running
//! a `poll(2)` loop over non-blocking sockets, which bounds:
//!
//! - connections: at most [`Limits::max_connections`]; at the cap, a new
//!   connection evicts the oldest one, so a crowd of idle or slow peers can
//!   delay a probe by one accept, never lock it out;
//! - memory: a request head is at most [`Limits::max_head_bytes`] (a longer
//!   one is answered 431), one request per connection, and each response is
//!   a buffer the size of one page;
//! - time: the head must arrive within [`Limits::head_timeout`] and the
//!   response must be taken within [`Limits::write_timeout`];
//! - `accept()` errors (EMFILE and friends): logged, then retried with a
//!   backoff of up to a second, never fatal.
//!
//! A slow reader costs only its buffer: responses are written as the socket
//! takes them, never by blocking the thread. tiny_http still does what it is
//! good at: the message types ([`Method`], [`Header`]) and serialising each
//! response.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tiny_http::{HTTPVersion, Header, Method, Response};

use crate::telemetry::logging::Throttle;
use crate::telemetry::metrics::Metrics;

/// What a handler answers: status, content type, body.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
    }
}

/// One request, as much of it as a handler needs.
#[derive(Debug)]
pub struct Request {
    pub method: Method,
    /// The path, without the query string.
    pub path: String,
    /// The query string, without the `?`.
    pub query: String,
    pub headers: Vec<Header>,
    version: HTTPVersion,
}

impl Request {
    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &'static str) -> Option<&str> {
        self.headers.iter().find(|h| h.field.equiv(name)).map(|h| h.value.as_str())
    }
}

/// Answers one request. Runs on the listener's thread: it must be quick.
pub type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// The bounds of one listener (B61).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_head_bytes: usize,
    pub head_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            max_head_bytes: 8 * 1024,
            head_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a listener could not start.
#[derive(Debug)]
pub struct BindError {
    pub addr: SocketAddr,
    pub source: io::Error,
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot listen on {}: {}", self.addr, self.source)
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A running listener.
pub struct HttpServer {
    addr: SocketAddr,
    /// The listening socket, owned by the loop's thread until it ends.
    listener: RawFd,
    stop: Arc<AtomicBool>,
    /// Set with `stop` by a handover: the loop empties the accept queue
    /// and finishes its connections before it ends.
    finish: Arc<AtomicBool>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` and serves `handler` on one thread named `name`.
    pub fn start(
        addr: SocketAddr,
        name: &str,
        limits: Limits,
        handler: Handler,
    ) -> Result<HttpServer, BindError> {
        let bind_error = |source| BindError { addr, source };
        let listener = crate::lifecycle::listen::shared(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let (wake, woken) = UnixStream::pair().map_err(bind_error)?;
        woken.set_nonblocking(true).map_err(bind_error)?;
        let stop = Arc::new(AtomicBool::new(false));
        let finish = Arc::new(AtomicBool::new(false));
        let raw = listener.as_raw_fd();
        let looping = EventLoop {
            listener: Some(listener),
            woken,
            stop: Arc::clone(&stop),
            finish: Arc::clone(&finish),
            limits,
            handler,
            connections: VecDeque::new(),
            accept_backoff: None,
            accept_errors: Throttle::new(Duration::from_secs(10)),
        };
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || looping.run())
            .map_err(bind_error)?;
        Ok(HttpServer { addr, listener: raw, stop, finish, wake, thread: Some(thread) })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Stops serving once a successor listens beside this router (B95):
    /// new connections are steered to the successor's socket, the ones
    /// queued on this one are accepted, and every connection open is
    /// finished (within its own deadlines) before the thread ends.
    pub fn hand_over(mut self) {
        self.finish.store(true, Ordering::Release);
        self.shutdown();
    }

    /// Lifts the steering a predecessor left on this port (B95).
    pub fn lift_steering(&self) -> io::Result<()> {
        crate::lifecycle::listen::lift_steering(self.listener)
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = (&self.wake).write(&[1]);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where one connection is.
enum Phase {
    /// Reading the request head until `deadline`.
    Head { buf: Vec<u8>, deadline: Instant },
    /// Sending the response until `deadline`.
    Reply { out: Vec<u8>, sent: usize, deadline: Instant },
    /// Response sent and our side shut: reading (and dropping) what the peer
    /// still sends until it closes, so that closing with unread data does
    /// not reset the connection before the peer has read the response; at
    /// most `left` more bytes, so a peer that keeps sending is cut off.
    Linger { deadline: Instant, left: usize },
}

struct Connection {
    stream: TcpStream,
    phase: Phase,
}

/// How long a connection lingers after its response, and how much it may
/// still send meanwhile.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024;
/// Accepts per loop turn, so a flood of connects cannot starve the reads
/// and writes of connections already accepted.
const ACCEPT_BATCH: usize = 64;
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// How long a handover waits for a listener's accept queue to empty.
const QUEUE_PATIENCE: Duration = Duration::from_secs(2);

struct EventLoop {
    /// None once a handover closed it, while the loop finishes its
    /// connections.
    listener: Option<TcpListener>,
    woken: UnixStream,
    stop: Arc<AtomicBool>,
    finish: Arc<AtomicBool>,
    limits: Limits,
    handler: Handler,
    /// Oldest first, so eviction takes the front.
    connections: VecDeque<Connection>,
    /// After an `accept()` error: when to try again, and the current delay.
    accept_backoff: Option<(Instant, Duration)>,
    accept_errors: Throttle,
}

impl EventLoop {
    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            if self.stop.load(Ordering::Acquire) {
                if !self.finish.load(Ordering::Acquire) {
                    return;
                }
                if let Some(listener) = self.listener.take() {
                    self.hand_over(listener);
                }
                if self.connections.is_empty() {
                    return;
                }
            }
            let now = Instant::now();
            let listening = self.accept_backoff.is_none_or(|(at, _)| now >= at);
            fds.clear();
            fds.push(pollfd(self.woken.as_raw_fd(), libc::POLLIN));
            // poll(2) skips a negative descriptor: once handed over, only
            // the connections are watched.
            let listener = self.listener.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            fds.push(pollfd(listener, if listening { libc::POLLIN } else { 0 }));
            for c in &self.connections {
                let events = match c.phase {
                    Phase::Head { .. } | Phase::Linger { .. } => libc::POLLIN,
                    Phase::Reply { .. } => libc::POLLOUT,
                };
                fds.push(pollfd(c.stream.as_raw_fd(), events));
            }
            let timeout = self.next_deadline().map_or(1000, |at| {
                let ms = at.saturating_duration_since(now).as_millis() + 1;
                ms.min(1000) as libc::c_int
            });
            // SAFETY: `fds` is a valid, initialised array of `fds.len()`
            // pollfd structs that outlives the call.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    log::warn!("http: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            let now = Instant::now();
            // The connection states line up with fds[2..] as built above;
            // a turn handles them before accepting, so the two never drift.
            let mut index = 0;
            self.connections.retain_mut(|c| {
                let revents = fds[2 + index].revents;
                index += 1;
                step(c, revents, now, &self.limits, &self.handler)
            });
            if fds[1].revents != 0 || self.accept_backoff.is_some_and(|(at, _)| now >= at) {
                self.accept(now);
            }
            if fds[0].revents != 0 {
                let mut sink = [0u8; 16];
                let _ = self.woken.read(&mut sink);
            }
        }
    }

    /// Steers new connections to the successor, accepts what is queued
    /// until the queue stays empty, then closes the listener (B95).
    fn hand_over(&mut self, listener: TcpListener) {
        let fd = listener.as_raw_fd();
        if let Err(e) = crate::lifecycle::listen::steer_to_successor(fd, 1) {
            log::warn!("http: cannot steer new connections to the successor: {e}");
        }
        self.listener = Some(listener);
        let emptied =
            crate::lifecycle::listen::wait_emptied(fd, QUEUE_PATIENCE, || self.accept(Instant::now()));
        if !emptied {
            log::warn!("http: the accept queue did not empty within {QUEUE_PATIENCE:?}; closing it");
        }
        self.listener = None;
    }

    /// The earliest instant a connection (or the accept backoff) needs
    /// attention without an event.
    fn next_deadline(&self) -> Option<Instant> {
        let deadlines = self.connections.iter().map(|c| match &c.phase {
            Phase::Head { deadline, .. } | Phase::Reply { deadline, .. } | Phase::Linger { deadline, .. } => {
                *deadline
            }
        });
        deadlines.chain(self.accept_backoff.map(|(at, _)| at)).min()
    }

    fn accept(&mut self, now: Instant) {
        let Some(listener) = &self.listener else { return };
        for _ in 0..ACCEPT_BATCH {
            match listener.accept() {
                Ok((stream, _)) => {
                    self.accept_backoff = None;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if self.connections.len() >= self.limits.max_connections {
                        // Evict the oldest: under a crowd of idle or slow
                        // peers, a new one (a probe) still gets in.
                        self.connections.pop_front();
                    }
                    let deadline = now + self.limits.head_timeout;
                    self.connections
                        .push_back(Connection { stream, phase: Phase::Head { buf: Vec::new(), deadline } });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => {}
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection
                    // stays queued; try again later instead of spinning.
                    let delay = self
                        .accept_backoff
                        .map_or(Duration::from_millis(10), |(_, d)| (d * 2).min(MAX_ACCEPT_BACKOFF));
                    self.accept_backoff = Some((now + delay, delay));
                    if let Some(suppressed) = self.accept_errors.allow(now) {
                        let listener = listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string());
                        log::warn!(
                            listener = listener.as_str(), suppressed;
                            "http: accept on {listener} failed: {e}; retrying with backoff"
                        );
                    }
                    return;
                }
            }
        }
    }
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}

/// Moves one connection on; false when it is done and should be closed.
fn step(
    c: &mut Connection,
    revents: libc::c_short,
    now: Instant,
    limits: &Limits,
    handler: &Handler,
) -> bool {
    let failed = revents & (libc::POLLERR | libc::POLLNVAL) != 0;
    match &mut c.phase {
        Phase::Head { buf, deadline } => {
            if failed || now >= *deadline {
                return false;
            }
            if revents & (libc::POLLIN | libc::POLLHUP) == 0 {
                return true;
            }
            match read_head(&mut c.stream, buf, limits.max_head_bytes) {
                HeadRead::More => true,
                HeadRead::Closed => false,
                HeadRead::Complete(end) => {
                    let out = respond(&buf[..end], handler);
                    c.phase = Phase::Reply { out, sent: 0, deadline: now + limits.write_timeout };
                    write_reply(c, now)
                }
                HeadRead::TooLarge => {
                    let out = error_reply(431, "request header too large", HTTPVersion(1, 1));
                    c.phase = Phase::Reply { out, sent: 0, deadline: now + limits.write_timeout };
                    write_reply(c, now)
                }
            }
        }
        Phase::Reply { deadline, .. } => {
            if failed || now >= *deadline {
                return false;
            }
            if revents & (libc::POLLOUT | libc::POLLHUP) == 0 {
                return true;
            }
            write_reply(c, now)
        }
        Phase::Linger { deadline, left } => {
            if failed || now >= *deadline || revents & libc::POLLHUP != 0 {
                return false;
            }
            if revents & libc::POLLIN == 0 {
                return true;
            }
            let mut sink = [0u8; 4096];
            match c.stream.read(&mut sink) {
                Ok(n) if n > 0 && n <= *left => {
                    *left -= n;
                    true
                }
                _ => false,
            }
        }
    }
}

/// Writes what the socket takes; false when the connection is done with.
fn write_reply(c: &mut Connection, now: Instant) -> bool {
    let Phase::Reply { out, sent, .. } = &mut c.phase else { return true };
    while *sent < out.len() {
        match c.stream.write(&out[*sent..]) {
            Ok(0) => return false,
            Ok(n) => *sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let _ = c.stream.shutdown(Shutdown::Write);
    c.phase = Phase::Linger { deadline: now + LINGER, left: LINGER_BYTES };
    true
}

enum HeadRead {
    More,
    Closed,
    /// The head ends at this offset (after its blank line).
    Complete(usize),
    TooLarge,
}

fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>, max: usize) -> HeadRead {
    let mut chunk = [0u8; 2048];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return HeadRead::Closed,
            Ok(n) => {
                let searched_from = buf.len().saturating_sub(3);
                buf.extend_from_slice(&chunk[..n]);
                if let Some(end) = head_end(buf, searched_from) {
                    return if end > max { HeadRead::TooLarge } else { HeadRead::Complete(end) };
                }
                if buf.len() > max {
                    return HeadRead::TooLarge;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return HeadRead::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// The offset just past the blank line that ends a head (`\r\n\r\n`, or a
/// bare `\n\n`), searching from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if buf[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// Parses a request head; `None` when it is not one.
pub fn parse_head(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let mut request_line = lines.next()?.split(' ');
    let method: Method = request_line.next()?.parse().ok()?;
    let target = request_line.next()?;
    let version = match request_line.next()? {
        "HTTP/1.1" => HTTPVersion(1, 1),
        "HTTP/1.0" => HTTPVersion(1, 0),
        _ => return None,
    };
    if request_line.next().is_some() {
        return None;
    }
    // Absolute form (`http://host/path`) is allowed by HTTP/1.1; keep the path.
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        headers.push(line.parse::<Header>().ok()?);
    }
    Some(Request { method, path: path.to_string(), query: query.to_string(), headers, version })
}

fn respond(head: &[u8], handler: &Handler) -> Vec<u8> {
    let Some(request) = parse_head(head) else {
        return error_reply(400, "bad request", HTTPVersion(1, 1));
    };
    let head_only = request.method == Method::Head;
    if !matches!(request.method, Method::Get | Method::Head) {
        return error_reply(405, "method not allowed", request.version);
    }
    let reply = handler(&request);
    serialise(reply, request.version, &request.headers, head_only)
}

fn error_reply(status: u16, body: &str, version: HTTPVersion) -> Vec<u8> {
    serialise(Reply::text(status, body), version, &[], false)
}

fn serialise(reply: Reply, version: HTTPVersion, request_headers: &[Header], head_only: bool) -> Vec<u8> {
    let header = |name: &str, value: &str| Header::from_bytes(name, value).expect("static header is valid");
    let response = Response::from_data(reply.body)
        .with_status_code(reply.status)
        .with_header(header("Content-Type", reply.content_type))
        .with_header(header("Server", "atenet-router"));
    let mut out = Vec::new();
    // Writing to memory cannot fail.
    let _ = response.raw_print(&mut out, version, request_headers, head_only, None);
    // tiny_http keeps `Connection` for its own server loop and drops it from
    // a response's headers, so it goes in after the status line here.
    if let Some(end) = out.windows(2).position(|w| w == b"\r\n") {
        out.splice(end + 2..end + 2, b"Connection: close\r\n".iter().copied());
    }
    out
}

/// The metrics listener's routes. `sample` runs before each scrape, to set
/// gauges that are read rather than kept up to date (B58's flights).
pub fn metrics_handler(
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    sample: impl Fn() + Send + Sync + 'static,
) -> Handler {
    Arc::new(move |request: &Request| match request.path.as_str() {
        "/metrics" => {
            sample();
            Reply {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: metrics.render().into_bytes(),
            }
        }
        "/healthz" => Reply::text(200, "ok"),
        "/readyz" if ready.load(Ordering::Acquire) => Reply::text(200, "ok"),
        "/readyz" => Reply::text(503, "draining"),
        _ => Reply::text(404, "not found"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_heads() {
        let r =
            parse_head(b"GET /statusz?format=json HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n")
                .unwrap();
        assert_eq!((&r.method, r.path.as_str(), r.query.as_str()), (&Method::Get, "/statusz", "format=json"));
        assert_eq!(r.header("accept"), Some("application/json"));
        let r = parse_head(b"HEAD http://host:9090/metrics HTTP/1.0\n\n").unwrap();
        assert_eq!((&r.method, r.path.as_str()), (&Method::Head, "/metrics"));
        for bad in [
            &b"GET /\r\n\r\n"[..],
            b"GET / HTTP/2\r\n\r\n",
            b"GET / HTTP/1.1 x\r\n\r\n",
            b"\xff / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn finds_the_end_of_a_head_across_reads() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.0\n\n", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n", 0), None);
    }

    #[test]
    fn replies_close_the_connection_and_head_has_no_body() {
        let handler: Handler = Arc::new(|_| Reply::text(200, "ok"));
        let out = String::from_utf8(respond(b"GET /healthz HTTP/1.1\r\n\r\n", &handler)).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Connection: close") && out.ends_with("\r\n\r\nok"), "{out}");
        let out = String::from_utf8(respond(b"HEAD /healthz HTTP/1.1\r\n\r\n", &handler)).unwrap();
        assert!(!out.ends_with("ok"), "{out}");
        let out = String::from_utf8(respond(b"POST /healthz HTTP/1.1\r\n\r\n", &handler)).unwrap();
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        let out = String::from_utf8(respond(b"nonsense\r\n\r\n", &handler)).unwrap();
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    }
}
