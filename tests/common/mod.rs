//! Shared test harness: a real router and a real simulated control plane on
//! loopback, an Envoy-like ext_proc client, and a `/metrics` reader.
//!
//! Waits are bounded polls of observable state (sim call counts, flight
//! table, metrics) with generous limits, never a fixed sleep.

#![allow(dead_code)]

pub mod admin;
pub mod h2peer;
pub mod pki;
pub mod process;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::cli::config::parse_serve_args;
use atenet_router::proto::external_processor::{ProcessingRequest, ProcessingResponse};
use atenet_router::proto::EXT_PROC_PROCESS;
use atenet_router::router::Router;
use atenet_router::tools::sim::{Sim, SimConfig};
use futures::{SinkExt, StreamExt};
use grpcio::{
    CallOption, ChannelBuilder, Client, ClientDuplexReceiver, ClientDuplexSender, EnvBuilder, WriteFlags,
};
use protobuf::well_known_types::struct_::Value;

/// Generous bound for anything a test waits on.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A router and its sim.
pub struct Stack {
    pub sim: Sim,
    pub router: Option<Router>,
    pub envoy: Envoy,
}

impl Stack {
    /// Starts a scripted-only sim (no pool actors) and a router talking to it
    /// in plaintext, with `flags` added to the router's command line.
    pub fn start(flags: &[&str]) -> Stack {
        Stack::start_with(flags, "0")
    }

    /// As [`Stack::start`], with the status page on `status_port`.
    pub fn start_with(flags: &[&str], status_port: &str) -> Stack {
        Stack::start_on(empty_sim(), flags, status_port)
    }

    /// As [`Stack::start_with`], against `sim`.
    pub fn start_on(sim: Sim, flags: &[&str], status_port: &str) -> Stack {
        let address = sim.addr().to_string();
        let mut args = vec![
            "--ateapi-insecure",
            "--ateapi-address",
            &address,
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            "--status-port",
            status_port,
        ];
        args.extend_from_slice(flags);
        let config = parse_serve_args(&args).expect("valid test flags");
        let router = Router::start(&config).expect("router starts");
        let envoy = Envoy::connect(router.extproc_addr());
        Stack { sim, router: Some(router), envoy }
    }

    pub fn router(&self) -> &Router {
        self.router.as_ref().expect("router running")
    }

    /// `/metrics` as text, read over HTTP.
    pub fn metrics(&self) -> Metrics {
        Metrics(http_get(self.router().metrics_addr(), "/metrics").1)
    }

    /// Polls until `check` holds; panics with `what` after [`PATIENCE`].
    pub fn eventually(&self, what: &str, mut check: impl FnMut(&Stack) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `n` callers wait on `actor`'s flight.
    pub fn wait_for_waiters(&self, actor: &str, n: usize) {
        self.eventually(&format!("{n} callers waiting on {actor}"), |s| {
            s.router()
                .resolver()
                .flights()
                .snapshot()
                .iter()
                .any(|f| f.actor.as_str() == actor && f.callers >= n)
        });
    }

    /// B30: once traffic stops, no slot is held and no flight remains.
    pub fn assert_quiescent(&self) {
        self.eventually("flight table empty and lot at 0", |s| {
            let resolver = s.router().resolver();
            resolver.flights().is_empty() && resolver.lot().map_or(0, |l| l.active()) == 0
        });
        assert_eq!(self.metrics().value("atenet_router_parking_active", &[]), 0.0);
    }
}

impl Drop for Stack {
    /// B30 after every test: a test that passed must leave no slot held and
    /// no flight behind.
    fn drop(&mut self) {
        if self.router.is_some() && !std::thread::panicking() {
            self.assert_quiescent();
        }
        if let Some(router) = self.router.take() {
            router.stop(Duration::from_secs(5), &crossbeam_channel::never::<()>());
        }
    }
}

/// Envoy's side of ext_proc: one stream per request.
#[derive(Clone)]
pub struct Envoy {
    client: Arc<Client>,
}

/// An open ext_proc stream.
pub struct Stream {
    pub tx: ClientDuplexSender<ProcessingRequest>,
    pub rx: ClientDuplexReceiver<ProcessingResponse>,
}

impl Stream {
    pub async fn send(&mut self, request: ProcessingRequest) {
        self.tx.send((request, WriteFlags::default())).await.expect("send on ext_proc stream");
    }

    pub async fn recv(&mut self) -> ProcessingResponse {
        self.rx.next().await.expect("a reply").expect("a reply without error")
    }
}

impl Envoy {
    pub fn connect(addr: SocketAddr) -> Envoy {
        Envoy::connect_to(&addr.to_string())
    }

    /// A client of any gRPC target: `host:port`, or `unix:/path` (B98).
    pub fn connect_to(target: &str) -> Envoy {
        let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("test-envoy").build());
        let channel = ChannelBuilder::new(env).connect(target);
        Envoy { client: Arc::new(Client::new(channel)) }
    }

    pub fn open(&self) -> Stream {
        self.open_with(CallOption::default())
    }

    /// A stream whose call ends at the latest `limit` after it opened, for
    /// a test that waits for the router to end a stream: a router that never
    /// does then fails the test (DEADLINE_EXCEEDED) instead of hanging it.
    pub fn open_within(&self, limit: Duration) -> Stream {
        self.open_with(CallOption::default().timeout(limit))
    }

    fn open_with(&self, options: CallOption) -> Stream {
        let (tx, rx) = self.client.duplex_streaming(&EXT_PROC_PROCESS, options).expect("open stream");
        Stream { tx, rx }
    }

    /// Sends one message and returns its reply, then resets the stream as
    /// Envoy does. A late-serve `override_message_timeout` before the reply
    /// is skipped; [`Envoy::exchange_all`] keeps it.
    pub async fn exchange(&self, request: ProcessingRequest) -> ProcessingResponse {
        self.exchange_all(request).await.pop().expect("a reply")
    }

    /// Every message the router sends for one request, up to and including
    /// the reply.
    pub async fn exchange_all(&self, request: ProcessingRequest) -> Vec<ProcessingResponse> {
        let mut stream = self.open();
        stream.send(request).await;
        let mut replies = Vec::new();
        loop {
            let reply = stream.recv().await;
            let done = reply.response.is_some();
            replies.push(reply);
            if done {
                break;
            }
        }
        stream.tx.cancel();
        replies
    }

    /// One exchange, as [`Envoy::exchange`]; `None` when the stream was
    /// cancelled before any reply (a router shutting down, B75).
    pub fn try_exchange(&self, request: ProcessingRequest) -> Option<ProcessingResponse> {
        futures::executor::block_on(async {
            let mut stream = self.open();
            stream.tx.send((request, WriteFlags::default())).await.ok()?;
            let reply = stream.rx.next().await?.ok()?;
            stream.tx.cancel();
            Some(reply)
        })
    }

    /// A request for `actor` (via the header) with no other headers.
    pub async fn route(&self, actor: &str) -> ProcessingResponse {
        self.exchange(headers_request(&[("ate-target-actor", actor)])).await
    }

    /// Blocking form of [`Envoy::route`].
    pub fn route_now(&self, actor: &str) -> ProcessingResponse {
        futures::executor::block_on(self.route(actor))
    }
}

/// How long gRPC core (1.56) waits for the peer to answer the PING behind
/// its first GOAWAY before it lets a connection go (chttp2's
/// `GracefulGoaway`): what a stop waited for on a mute connection.
pub const GRPC_GOAWAY_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// An HTTP/2 connection to `addr` that says hello (the preface and empty
/// SETTINGS) and then nothing: it never answers a PING, as a hung peer
/// would. Returned once the server's SETTINGS came, so that gRPC holds it
/// as a connection.
pub fn mute_http2_connection(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").unwrap();
    let mut frame_header = [0u8; 9];
    stream.read_exact(&mut frame_header).unwrap();
    assert_eq!(frame_header[3], 4, "the server's first frame is SETTINGS");
    stream
}

/// Reads what `stream` gets until its peer closes or resets it: whether it
/// did within [`PATIENCE`].
pub fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("the mute connection: {e}");
                return !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
            }
        }
    }
}

/// A port nothing listens on, for a process that must be told its port in
/// advance (a hand-over's successor takes over its predecessor's). Picked at
/// random below the kernel's ephemeral range, which is where bind(0) and
/// every outgoing connection on the machine take theirs: a port picked by
/// binding to 0 could be handed to someone else between the pick and the
/// router's bind (seen with eight copies of a test binary at once). Never
/// the same port twice in one test process.
pub fn free_port() -> u16 {
    static GIVEN: parking_lot::Mutex<Vec<u16>> = parking_lot::Mutex::new(Vec::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut given = GIVEN.lock();
    for _ in 0..1000 {
        let port = fastrand::u16(10_000..ephemeral_low.max(10_001));
        if !given.contains(&port) && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in 10000..{ephemeral_low} after 1000 tries");
}

pub use atenet_router::tools::load::headers_request;

/// A simulated ateapi on loopback with no pool: it answers only the actors
/// a test scripts (any other is NotFound).
pub fn empty_sim() -> Sim {
    Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        actors: 0,
        workers: 0,
        ..SimConfig::default()
    })
    .expect("sim starts")
}

/// Adds a string attribute under the ext_proc filter's key.
pub fn with_attribute(mut request: ProcessingRequest, name: &str, value: &str) -> ProcessingRequest {
    let mut v = Value::new();
    v.set_string_value(value.into());
    request.attributes.entry("envoy.filters.http.ext_proc".into()).or_default().fields.insert(name.into(), v);
    request
}

/// The parts of an ImmediateResponse a test checks.
#[derive(Debug, PartialEq)]
pub struct Immediate {
    pub status: i32,
    pub body: String,
    pub details: String,
    pub headers: HashMap<String, String>,
}

/// Unpacks an ImmediateResponse, panicking on a routing verdict.
pub fn immediate(reply: &ProcessingResponse) -> Immediate {
    assert!(reply.has_immediate_response(), "expected an ImmediateResponse, got {reply:?}");
    let ir = reply.immediate_response();
    let headers = ir
        .headers
        .set_headers
        .iter()
        .map(|h| {
            assert!(h.header.value.is_empty(), "B10: raw_value only");
            (h.header.key.clone(), String::from_utf8(h.header.raw_value.clone()).unwrap())
        })
        .collect();
    Immediate {
        status: ir.status.code.value(),
        body: String::from_utf8(ir.body.clone()).unwrap(),
        details: ir.details.clone(),
        headers,
    }
}

/// The routing verdict: (the `ate-target-actor` it sets, if it sets one,
/// original_dst local, port). A request that carries its actor header once
/// gets no header mutation (B6).
pub fn routed(reply: &ProcessingResponse) -> (Option<String>, String, String) {
    assert!(reply.has_request_headers(), "expected a routing verdict, got {reply:?}");
    let set = &reply.request_headers().response.header_mutation.set_headers;
    assert!(set.len() <= 1, "B6: at most one header mutation: {set:?}");
    let actor = set.first().map(|option| {
        assert_eq!(option.header.key, "ate-target-actor");
        String::from_utf8(option.header.raw_value.clone()).unwrap()
    });
    let namespace = &reply.dynamic_metadata.fields["envoy.filters.listener.original_dst"];
    let fields = &namespace.struct_value().fields;
    (actor, fields["local"].string_value().to_string(), fields["port"].string_value().to_string())
}

/// Prometheus text exposition, queried by name and labels.
pub struct Metrics(pub String);

impl Metrics {
    /// The sum of every sample named `name` whose labels include `labels`.
    /// Panics when there is none: an absent metric is a failure, not a zero.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let samples = self.samples(name, labels);
        assert!(!samples.is_empty(), "no sample of {name} with labels {labels:?} in /metrics");
        samples.iter().sum()
    }

    /// Every sample named `name` whose labels include `labels`.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (metric, label_text) = match series.split_once('{') {
                    Some((m, rest)) => (m, rest.trim_end_matches('}')),
                    None => (series, ""),
                };
                if metric != name {
                    return None;
                }
                let all =
                    labels.iter().all(|(k, v)| label_text.split(',').any(|p| p == format!("{k}=\"{v}\"")));
                all.then(|| value.parse::<f64>().expect("a sample value is a number"))
            })
            .collect()
    }
}

/// A plain HTTP/1.0 GET; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to HTTP listener");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// Sends a request for `actor` on a stream of its own and waits for its
/// verdict, as Envoy does: the verdict's key (`200 routed`, `503
/// atenet_lot_full`, ...), or `no verdict` when none came within `patience`.
pub async fn verdict_within(client: &Client, actor: &str, patience: Duration) -> String {
    let call = CallOption::default().timeout(patience);
    let Ok((mut tx, mut rx)) = client.duplex_streaming(&EXT_PROC_PROCESS, call) else {
        return "open failed".into();
    };
    if tx.send((atenet_router::tools::load::request_for(actor, None), WriteFlags::default())).await.is_err() {
        return "send failed".into();
    }
    let key = loop {
        match rx.next().await {
            // A late-serve override (B49) before the verdict.
            Some(Ok(reply)) if reply.response.is_none() => continue,
            Some(Ok(reply)) => break atenet_router::tools::load::verdict_key(&reply),
            _ => break "no verdict".to_string(),
        }
    };
    tx.cancel();
    key
}
