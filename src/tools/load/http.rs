//! `parkload --http`: the load generator's HTTP/1.1 client, for driving a
//! deployment through its Envoy listener rather than the router's ext_proc
//! port.
//!
//! Written by hand over `std::net::TcpStream` because what a load generator
//! needs is small and must be exact: one GET per request with the actor in
//! `ate-target-actor`, keep-alive connections (one per request in flight, so
//! the concurrency is the number of connections, as with wrk), a response
//! read to its end (Content-Length, chunked, or to the close), and a
//! deadline over the whole exchange. HTTP/2 is not spoken: Envoy's listener
//! takes HTTP/1.1, and every request costs it the same ext_proc stream either
//! way. Plain `http://` only; TLS is not there either.
//!
//! Nothing a server sends can panic this: a head longer than
//! [`MAX_HEAD_BYTES`], a status line or header that does not parse, a chunk
//! size that does not parse, or a connection that closes mid-response is an
//! [`HTTP_ERROR`] verdict, and the connection is dropped.

use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How the verdict keys of requests that failed at the HTTP level begin
/// (no response, or one that does not parse).
pub const HTTP_ERROR: &str = "http-error";
/// How a verdict key begins when no connection could be made.
pub const CONNECT_FAILED: &str = "http-error connect:";

/// The longest response head (status line and headers) read; a longer one
/// fails the request.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The header a router's own answer carries its machine reason in (B10).
const REASON: &str = "x-atenet-reason";

/// Where `--http` sends: the address to connect to, and the `Host` and path
/// of every request.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpTarget {
    pub addr: SocketAddr,
    /// `host[:port]` as the URL gave it, sent as `Host`.
    pub authority: String,
    /// The path and query, `/` when the URL has none.
    pub path: String,
    /// The URL as given, for reports.
    pub url: String,
}

impl HttpTarget {
    /// Parses `http://host[:port][/path]` and resolves its host.
    pub fn parse(url: &str) -> Result<HttpTarget, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            if url.starts_with("https://") {
                format!("{url:?}: https is not supported, only http://")
            } else {
                format!("{url:?}: want http://host[:port][/path]")
            }
        })?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, String::from("/")),
        };
        if authority.is_empty() || authority.contains(['@', ' ', '#']) {
            return Err(format!("{url:?}: want http://host[:port][/path]"));
        }
        if path.contains(|c: char| c.is_ascii_whitespace() || c.is_ascii_control() || c == '#') {
            return Err(format!("{url:?}: the path may not hold spaces, control characters or #"));
        }
        // A bracketed IPv6 literal keeps its colons; a port follows the last `]`.
        let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
        let with_port = if has_port { authority.to_string() } else { format!("{authority}:80") };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| format!("{url:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url:?}: {authority} resolves to nothing"))?;
        Ok(HttpTarget { addr, authority: authority.to_string(), path, url: url.to_string() })
    }
}

/// One keep-alive connection to the target.
pub struct Connection {
    reader: BufReader<TcpStream>,
    /// Whether a request has already had its response on it: a failure
    /// before the first byte of the next one may be the server closing an
    /// idle connection, and is retried once on a fresh one.
    reused: bool,
}

/// How an exchange ended short of a verdict.
enum Failure {
    /// The deadline came first.
    Timeout,
    /// The connection failed or the response did not parse; `early` when
    /// no byte of the response had come.
    Broken { what: String, early: bool },
}

/// A response read to its end.
struct Response {
    status: u16,
    reason: Option<String>,
    /// Whether the connection may carry the next request.
    keep_alive: bool,
}

/// Sends one GET for `actor` on `conn` (connecting first if it is `None`)
/// and reads the response to its end before `deadline`. Returns the
/// verdict key: `<status> <x-atenet-reason>`, or `<status>` for a response
/// without one (the worker's own answer, or Envoy's); `http-error <what>`
/// when no response came or it did not parse; `None` at the deadline. The
/// connection is kept for the next request only when the response allows
/// it.
pub fn request(
    conn: &mut Option<Connection>,
    target: &HttpTarget,
    actor: &str,
    grpc_timeout: Option<&str>,
    deadline: Instant,
) -> Option<String> {
    let head = request_head(target, actor, grpc_timeout);
    let mut attempt = exchange(conn, target, &head, deadline);
    if let Err(Failure::Broken { early: true, .. }) = &attempt {
        if conn.as_ref().is_some_and(|c| c.reused) {
            *conn = None;
            attempt = exchange(conn, target, &head, deadline);
        }
    }
    match attempt {
        Ok(response) => {
            if let Some(c) = conn.as_mut().filter(|_| response.keep_alive) {
                c.reused = true;
            } else {
                *conn = None;
            }
            Some(match response.reason {
                Some(reason) => format!("{} {reason}", response.status),
                None => response.status.to_string(),
            })
        }
        Err(failure) => {
            *conn = None;
            match failure {
                Failure::Timeout => None,
                Failure::Broken { what, .. } => Some(format!("{HTTP_ERROR} {what}")),
            }
        }
    }
}

fn request_head(target: &HttpTarget, actor: &str, grpc_timeout: Option<&str>) -> Vec<u8> {
    let mut head = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: parkload\r\nAccept: */*\r\nate-target-actor: {actor}\r\n",
        target.path, target.authority
    );
    if let Some(value) = grpc_timeout {
        head.push_str(&format!("grpc-timeout: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Connects if need be, writes `head` and reads the response.
fn exchange(
    conn: &mut Option<Connection>,
    target: &HttpTarget,
    head: &[u8],
    deadline: Instant,
) -> Result<Response, Failure> {
    let c = match conn.take() {
        Some(c) => conn.insert(c),
        None => {
            let stream = TcpStream::connect_timeout(&target.addr, remaining(deadline)?)
                .map_err(|e| failure(e, "connect", true))?;
            let _ = stream.set_nodelay(true);
            conn.insert(Connection { reader: BufReader::with_capacity(16 * 1024, stream), reused: false })
        }
    };
    let stream = c.reader.get_mut();
    stream.set_write_timeout(Some(remaining(deadline)?)).map_err(|e| failure(e, "send", true))?;
    stream.write_all(head).map_err(|e| failure(e, "send", true))?;
    read_response(&mut c.reader, deadline)
}

/// Time left before `deadline`, never zero (a zero socket timeout means none).
fn remaining(deadline: Instant) -> Result<Duration, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Failure::Timeout);
    }
    Ok(left)
}

fn failure(e: io::Error, during: &str, early: bool) -> Failure {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Failure::Timeout,
        ErrorKind::UnexpectedEof => Failure::Broken { what: format!("{during}: connection closed"), early },
        _ => Failure::Broken { what: format!("{during}: {}", e.kind()), early },
    }
}

fn broken(what: &str) -> Failure {
    Failure::Broken { what: what.to_string(), early: false }
}

/// Reads one line (to `\n`) into `line`, as bytes; `false` at a clean EOF
/// before any byte.
fn read_line(
    reader: &mut BufReader<TcpStream>,
    line: &mut Vec<u8>,
    limit: usize,
    deadline: Instant,
) -> Result<bool, Failure> {
    line.clear();
    loop {
        reader
            .get_ref()
            .set_read_timeout(Some(remaining(deadline)?))
            .map_err(|e| failure(e, "read", false))?;
        let available = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(failure(e, "read", line.is_empty())),
        };
        if available.is_empty() {
            return Ok(!line.is_empty());
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if line.len() + take > limit {
            return Err(broken("response head too long"));
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            return Ok(true);
        }
    }
}

/// How the body of a response is delimited.
enum Body {
    None,
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    ToClose,
}

fn read_response(reader: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Response, Failure> {
    let mut budget = MAX_HEAD_BYTES;
    loop {
        let head = read_head(reader, &mut budget, deadline)?;
        // An interim response (100 Continue) precedes the real one.
        if head.status / 100 == 1 {
            continue;
        }
        let body = if head.status == 204 || head.status == 304 {
            Body::None
        } else if head.chunked {
            Body::Chunked
        } else if let Some(n) = head.length {
            Body::Length(n)
        } else {
            Body::ToClose
        };
        let to_close = matches!(body, Body::ToClose);
        read_body(reader, body, deadline)?;
        return Ok(Response {
            status: head.status,
            reason: head.reason,
            keep_alive: !head.close && !to_close,
        });
    }
}

/// A response's status line and the headers that matter here.
struct Head {
    status: u16,
    length: Option<u64>,
    chunked: bool,
    /// The server will close the connection after this response.
    close: bool,
    reason: Option<String>,
}

/// Reads a status line and headers, within `budget` bytes (shared by the
/// interim responses before the real one).
fn read_head(
    reader: &mut BufReader<TcpStream>,
    budget: &mut usize,
    deadline: Instant,
) -> Result<Head, Failure> {
    let mut line = Vec::new();
    if !read_line(reader, &mut line, *budget, deadline)? {
        return Err(Failure::Broken { what: String::from("read: connection closed"), early: true });
    }
    *budget = budget.saturating_sub(line.len());
    let text = std::str::from_utf8(&line).map_err(|_| broken("status line is not UTF-8"))?;
    let mut parts = text.trim_end().splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let status: u16 = match (version.starts_with("HTTP/1."), parts.next().map(str::parse)) {
        (true, Some(Ok(status))) if (100..=999).contains(&status) => status,
        _ => return Err(broken("malformed status line")),
    };
    let mut head = Head { status, length: None, chunked: false, close: version == "HTTP/1.0", reason: None };
    loop {
        if !read_line(reader, &mut line, *budget, deadline)? {
            return Err(broken("read: connection closed in the head"));
        }
        *budget = budget.saturating_sub(line.len());
        let header = line.strip_suffix(b"\n").unwrap_or(&line);
        let header = header.strip_suffix(b"\r").unwrap_or(header);
        if header.is_empty() {
            return Ok(head);
        }
        let text = String::from_utf8_lossy(header);
        let Some((name, value)) = text.split_once(':') else {
            return Err(broken("malformed header"));
        };
        let value = value.trim();
        let tokens = || value.split(',').map(|t| t.trim().to_ascii_lowercase());
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                let n: u64 = value.parse().map_err(|_| broken("malformed content-length"))?;
                if head.length.is_some_and(|l| l != n) {
                    return Err(broken("conflicting content-length"));
                }
                head.length = Some(n);
            }
            "transfer-encoding" => head.chunked = tokens().next_back().is_some_and(|t| t == "chunked"),
            "connection" if tokens().any(|t| t == "close") => head.close = true,
            "connection" if tokens().any(|t| t == "keep-alive") => head.close = false,
            REASON => head.reason = Some(value.to_string()),
            _ => {}
        }
    }
}

/// Reads and discards a body.
fn read_body(reader: &mut BufReader<TcpStream>, body: Body, deadline: Instant) -> Result<(), Failure> {
    match body {
        Body::None => Ok(()),
        Body::Length(n) => discard(reader, Some(n), deadline),
        Body::ToClose => discard(reader, None, deadline),
        Body::Chunked => {
            let mut line = Vec::new();
            loop {
                if !read_line(reader, &mut line, MAX_HEAD_BYTES, deadline)? {
                    return Err(broken("read: connection closed in a chunked body"));
                }
                let text = std::str::from_utf8(&line).map_err(|_| broken("malformed chunk size"))?;
                let size = text.trim_end().split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(size, 16).map_err(|_| broken("malformed chunk size"))?;
                if size == 0 {
                    // Trailers, to the empty line.
                    loop {
                        if !read_line(reader, &mut line, MAX_HEAD_BYTES, deadline)? {
                            return Err(broken("read: connection closed in the trailers"));
                        }
                        if line == b"\r\n" || line == b"\n" {
                            return Ok(());
                        }
                    }
                }
                discard(reader, Some(size), deadline)?;
                if !read_line(reader, &mut line, 2, deadline)? || (line != b"\r\n" && line != b"\n") {
                    return Err(broken("malformed chunk"));
                }
            }
        }
    }
}

/// Discards `n` bytes, or (`None`) everything to the close.
fn discard(reader: &mut BufReader<TcpStream>, n: Option<u64>, deadline: Instant) -> Result<(), Failure> {
    let mut left = n.unwrap_or(u64::MAX);
    while left > 0 {
        reader
            .get_ref()
            .set_read_timeout(Some(remaining(deadline)?))
            .map_err(|e| failure(e, "read", false))?;
        let available = match reader.fill_buf() {
            Ok(buf) => buf.len(),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(failure(e, "read", false)),
        };
        if available == 0 {
            return match n {
                None => Ok(()),
                Some(_) => Err(broken("read: connection closed in the body")),
            };
        }
        let take = available.min(usize::try_from(left).unwrap_or(usize::MAX));
        reader.consume(take);
        left -= take as u64;
    }
    Ok(())
}

/// A response read from `bytes`, for the parser's unit tests.
#[cfg(test)]
fn parse(bytes: &[u8]) -> Result<(u16, Option<String>, bool), String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = bytes.to_vec();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.write_all(&bytes);
    });
    let stream = TcpStream::connect(addr).unwrap();
    let mut reader = BufReader::new(stream);
    let result = read_response(&mut reader, Instant::now() + Duration::from_secs(30));
    server.join().unwrap();
    match result {
        Ok(r) => Ok((r.status, r.reason, r.keep_alive)),
        Err(Failure::Timeout) => Err("timeout".into()),
        Err(Failure::Broken { what, .. }) => Err(what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = HttpTarget::parse("http://127.0.0.1:8080/a/b?c=d").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!((t.authority.as_str(), t.path.as_str()), ("127.0.0.1:8080", "/a/b?c=d"));
        let t = HttpTarget::parse("http://127.0.0.1").unwrap();
        assert_eq!((t.addr.port(), t.path.as_str()), (80, "/"));
        assert_eq!(HttpTarget::parse("http://[::1]:81/").unwrap().addr, "[::1]:81".parse().unwrap());
        assert_eq!(HttpTarget::parse("http://127.0.0.1:9?x").unwrap().path, "/?x");
        for bad in ["https://127.0.0.1/", "127.0.0.1:80", "http://", "http://a b/", "http://127.0.0.1/a b"] {
            assert!(HttpTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_each_kind_of_body() {
        let reason = |r: &str| Some(r.to_string());
        assert_eq!(
            parse(b"HTTP/1.1 503 Service Unavailable\r\nx-atenet-reason: atenet_flights_full\r\ncontent-length: 3\r\n\r\nabc"),
            Ok((503, reason("atenet_flights_full"), true))
        );
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na;x=y\r\nabcdefghij\r\n0\r\nT: 1\r\n\r\n"),
            Ok((200, None, true))
        );
        assert_eq!(
            parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"),
            Ok((204, None, true))
        );
        assert_eq!(parse(b"HTTP/1.0 200 OK\r\n\r\nto the close"), Ok((200, None, false)));
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"),
            Ok((200, None, false))
        );
    }

    #[test]
    fn refuses_what_does_not_parse() {
        for bytes in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/1.1 abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\n",
        ] {
            assert!(parse(bytes).is_err(), "{:?}", String::from_utf8_lossy(bytes));
        }
        let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(long.as_bytes()), Err("response head too long".to_string()));
    }
}
