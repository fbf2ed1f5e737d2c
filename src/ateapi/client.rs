//! The ateapi client: asynchronous `ResumeActor` calls over one connection,
//! with credentials that follow the files on disk.
//!
//! An attempt is a unary call whose completion is a future spawned on the
//! channel's completion queue, so no thread is blocked per attempt and the
//! thread count does not grow with the number of parked requests. There is
//! one channel per completion queue (sharing gRPC core's one connection),
//! and an attempt takes the channel of the thread that starts it: the
//! answer then wakes the waiting stream on its own thread, where a channel
//! on another queue would hand it over (a kick and a wake-up). Attempts
//! carry no client deadline (B15): the control plane's own server-side
//! deadline bounds them, and abandoning one would strand the worker it
//! claimed.
//!
//! Credentials rotate without a restart: [`AteapiClient::refresh`] (run
//! every second by the router) re-reads the CA file, the client bundle and
//! the token file, and when one changed, builds new channels for new
//! attempts; attempts already running finish on the old ones. The token is
//! sent as `authorization: Bearer ...` and is never logged or shown.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use grpcio::{
    CallOption, Channel, ChannelBuilder, ChannelCredentialsBuilder, Client, Environment, MetadataBuilder,
};
use parking_lot::{Mutex, RwLock};

use crate::actor::resume::{AttemptResult, Code, ResumeError, Resumed};
use crate::actor::target::ActorId;
use crate::cli::config::AteapiTransport;
use crate::parking::flight::{AttemptDone, Resumer};
use crate::proto::ateapi::{ObjectRef, ResumeActorRequest, ResumeActorResponse};
use crate::proto::ATEAPI_RESUME_ACTOR;
use crate::telemetry::metrics::{CertificateRole, Metrics};
pub use crate::tls::files::CredentialsError;
use crate::tls::files::{named, read};
use crate::tls::pem;
use crate::unary::{self, Failure};

/// The credential files as last read.
#[derive(Clone, Default, PartialEq, Eq)]
struct Files {
    ca: Vec<u8>,
    bundle: Vec<u8>,
    token: Vec<u8>,
}

/// What a new attempt uses.
struct Live {
    /// One client per completion queue, with the thread that serves it.
    clients: Vec<(ThreadId, Arc<Client>)>,
    /// `Bearer <token>`, when a token file is configured.
    authorization: Option<Arc<str>>,
    files: Files,
    /// The client certificate's notAfter, Unix seconds.
    client_cert_expiry: Option<i64>,
}

impl Live {
    /// Sets the client certificate's expiry gauge, when there is one.
    fn publish_expiry(&self, metrics: &Metrics) {
        if let Some(not_after) = self.client_cert_expiry {
            metrics.certificate_expiry(CertificateRole::AteapiClient).set(not_after);
        }
    }
}

/// A ResumeActor client.
pub struct AteapiClient {
    env: Arc<Environment>,
    address: String,
    transport: AteapiTransport,
    token_file: Option<PathBuf>,
    /// How long one connection attempt may take.
    connect_timeout: Duration,
    live: RwLock<Live>,
    metrics: Metrics,
    health: Arc<Health>,
    /// Serialises refreshes, so two never rebuild the channel at once; holds
    /// the problem last logged, so a bad file is reported once.
    refreshing: Mutex<Option<String>>,
}

impl AteapiClient {
    /// Reads the credential files and opens a channel to `address`. The
    /// connection itself is lazy: a control plane that is down shows up as
    /// `Unavailable` attempts, which park.
    pub fn connect(
        env: Arc<Environment>,
        address: &str,
        transport: &AteapiTransport,
        token_file: Option<&Path>,
        connect_timeout: Duration,
        metrics: Metrics,
    ) -> Result<AteapiClient, CredentialsError> {
        let files = read_files(transport, token_file)?;
        let live = build(&env, address, transport, token_file, connect_timeout, files)?;
        live.publish_expiry(&metrics);
        Ok(AteapiClient {
            env,
            address: address.to_string(),
            transport: transport.clone(),
            token_file: token_file.map(Path::to_path_buf),
            connect_timeout,
            live: RwLock::new(live),
            metrics,
            health: Arc::new(Health::default()),
            refreshing: Mutex::new(None),
        })
    }

    /// Re-reads the credential files; when any changed, new attempts use a
    /// channel built from the new contents. A file that cannot be read (a
    /// rotation in progress) keeps the current credentials.
    pub fn refresh(&self) {
        let mut rejected = self.refreshing.lock();
        let files = read_files(&self.transport, self.token_file.as_deref());
        if files.as_ref().is_ok_and(|files| *files == self.live.read().files) {
            *rejected = None;
            return;
        }
        let problem = match files.and_then(|files| {
            build(
                &self.env,
                &self.address,
                &self.transport,
                self.token_file.as_deref(),
                self.connect_timeout,
                files,
            )
        }) {
            Ok(live) => {
                live.publish_expiry(&self.metrics);
                *self.live.write() = live;
                *rejected = None;
                log::info!("ateapi credentials changed on disk: reloaded");
                return;
            }
            Err(e) => e,
        };
        let (level, problem) = (problem.rotation_level(), problem.to_string());
        // Checked every second: say it once, not every second (B60).
        if rejected.as_deref() != Some(problem.as_str()) {
            log::log!(level, "ateapi credentials not reloaded, keeping the last good ones: {problem}");
            *rejected = Some(problem);
        }
    }

    /// The channels' state, without triggering a connection attempt: the
    /// channels share one connection, but a channel no attempt has used yet
    /// stays IDLE, so the state shown is the most telling of theirs (READY,
    /// then TRANSIENT_FAILURE, CONNECTING, IDLE, SHUTDOWN).
    pub fn connectivity(&self) -> &'static str {
        use grpcio::ConnectivityState as S;
        let rank = |state: &S| match state {
            S::GRPC_CHANNEL_READY => 0,
            S::GRPC_CHANNEL_TRANSIENT_FAILURE => 1,
            S::GRPC_CHANNEL_CONNECTING => 2,
            S::GRPC_CHANNEL_IDLE => 3,
            S::GRPC_CHANNEL_SHUTDOWN => 4,
        };
        let live = self.live.read();
        let states = live.clients.iter().map(|(_, client)| client.channel().check_connectivity_state(false));
        match states.min_by_key(rank).unwrap_or(S::GRPC_CHANNEL_SHUTDOWN) {
            S::GRPC_CHANNEL_IDLE => "IDLE",
            S::GRPC_CHANNEL_CONNECTING => "CONNECTING",
            S::GRPC_CHANNEL_READY => "READY",
            S::GRPC_CHANNEL_TRANSIENT_FAILURE => "TRANSIENT_FAILURE",
            S::GRPC_CHANNEL_SHUTDOWN => "SHUTDOWN",
        }
    }
}

fn read_files(transport: &AteapiTransport, token_file: Option<&Path>) -> Result<Files, CredentialsError> {
    let mut files = Files::default();
    if let AteapiTransport::Tls { ca_file, client_cert, .. } = transport {
        files.ca = read("--ateapi-ca-file", ca_file)?;
        if let Some(bundle) = client_cert {
            files.bundle = read("--ateapi-client-cert", bundle)?;
        }
    }
    if let Some(path) = token_file {
        files.token = read("--ateapi-token-file", path)?;
    }
    Ok(files)
}

fn build(
    env: &Arc<Environment>,
    address: &str,
    transport: &AteapiTransport,
    token_file: Option<&Path>,
    connect_timeout: Duration,
    files: Files,
) -> Result<Live, CredentialsError> {
    // Everything is checked before gRPC sees it: gRPC panics on some bad
    // input and silently fails every handshake on other (B60).
    let authorization = match token_file {
        Some(path) => {
            let token = bearer_token(&files.token).map_err(|reason| CredentialsError::Token {
                flag: "--ateapi-token-file",
                path: path.to_path_buf(),
                reason,
            })?;
            Some(Arc::from(format!("Bearer {token}")))
        }
        None => None,
    };
    let tls = match transport {
        AteapiTransport::Insecure => None,
        AteapiTransport::Tls { ca_file, client_cert, server_name } => Some(ChannelTls {
            ca: named("--ateapi-ca-file", ca_file, pem::certificates(&files.ca))?,
            // The CA file's dates are not checked: which of its certificates
            // matter depends on the chain ateapi sends (B106).
            client: match client_cert {
                Some(path) => Some(named(
                    "--ateapi-client-cert",
                    path,
                    pem::split_bundle(&files.bundle, pem::unix_now()),
                )?),
                None => None,
            },
            server_name: server_name.clone(),
        }),
    };
    let queues = env.completion_queues();
    let mut clients = Vec::with_capacity(queues.len());
    for _ in queues {
        // pick_cq hands queues out in turn, and connecting picks the next
        // one: the queue after the one picked here. Channels with the same
        // arguments share gRPC core's connection, so N channels are one
        // connection to ateapi. A guess spoilt by a concurrent pick costs a
        // hand-off between threads, never a wrong answer.
        let before = env.pick_cq().worker_id();
        let at = queues.iter().position(|q| q.worker_id() == before).unwrap_or(0);
        let thread = queues[(at + 1) % queues.len()].worker_id();
        let channel = channel(env, address, tls.as_ref(), connect_timeout);
        clients.push((thread, Arc::new(Client::new(channel))));
    }
    let client_cert_expiry = tls.and_then(|tls| tls.client).map(|(_, _, not_after)| not_after);
    Ok(Live { clients, authorization, files, client_cert_expiry })
}

/// A channel's TLS credentials, each checked (B60, B106).
struct ChannelTls {
    ca: Vec<u8>,
    /// The client certificate chain and key as PEM, and the certificate's
    /// notAfter.
    client: Option<(Vec<u8>, Vec<u8>, i64)>,
    server_name: Option<String>,
}

/// One channel to ateapi, over TLS with `tls`, else plaintext.
fn channel(
    env: &Arc<Environment>,
    address: &str,
    tls: Option<&ChannelTls>,
    connect_timeout: Duration,
) -> Channel {
    let builder = ChannelBuilder::new(Arc::clone(env))
        .primary_user_agent(concat!("atenet-router/", env!("CARGO_PKG_VERSION")))
        // Room for a long status message from ateapi: gRPC core's default
        // (8 KiB soft, 16 KiB hard) refuses one locally and reports that as
        // a ResourceExhausted of its own, which would be retried as if the
        // pool were full. Soft = hard: no random refusals in between.
        .raw_cfg_int(CString::new("grpc.max_metadata_size").expect("no NUL"), MAX_ANSWER_METADATA)
        .raw_cfg_int(CString::new("grpc.absolute_max_metadata_size").expect("no NUL"), MAX_ANSWER_METADATA)
        .keepalive_time(std::time::Duration::from_secs(30))
        .keepalive_timeout(std::time::Duration::from_secs(10))
        // gRPC core gives a connection attempt at least this long (20 s by
        // default), a whole budget and more for a peer that accepts TCP and
        // never finishes TLS (B82).
        .raw_cfg_int(
            CString::new("grpc.min_reconnect_backoff_ms").expect("no NUL"),
            i32::try_from(connect_timeout.as_millis()).unwrap_or(i32::MAX),
        );
    let Some(tls) = tls else { return builder.connect(address) };
    let mut creds = ChannelCredentialsBuilder::new().root_cert(tls.ca.clone());
    if let Some((chain, key, _)) = &tls.client {
        creds = creds.cert(chain.clone(), key.clone());
    }
    let mut builder = builder.set_credentials(creds.build());
    if let Some(name) = &tls.server_name {
        builder = builder.override_ssl_target(name.clone());
    }
    builder.connect(address)
}

/// The longest token accepted (B60). gRPC refuses to send request metadata
/// beyond its limit (16 KiB by default, counting every header) and fails
/// the call locally with ResourceExhausted, which would read as a pool at
/// capacity; 8 KiB leaves room for the other headers.
pub const MAX_TOKEN: usize = 8 * 1024;

/// The token of a token file: one line of RFC 6750's `b64token` characters
/// (letters, digits, `-._~+/`, then any `=` padding), surrounding
/// whitespace ignored. Anything else could not be sent as an HTTP/2 header
/// value, and a token that is silently not sent fails every call with
/// Unauthenticated. The reason never quotes the token.
pub fn bearer_token(bytes: &[u8]) -> Result<&str, String> {
    let token = std::str::from_utf8(bytes).map_err(|_| "the token is not UTF-8 text".to_string())?.trim();
    if token.is_empty() {
        return Err("the file is empty".into());
    }
    if token.len() > MAX_TOKEN {
        return Err(format!(
            "the token is {} bytes, over the {MAX_TOKEN} a request's metadata can carry \
             (gRPC would fail every ResumeActor call locally)",
            token.len()
        ));
    }
    let body = token.trim_end_matches('=');
    if body.is_empty() {
        return Err("the token is only padding".into());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    match body.char_indices().find(|(_, c)| !allowed(*c)) {
        None => Ok(token),
        Some((at, c)) if c.is_whitespace() => {
            Err(format!("whitespace inside the token (character {}); expected one token on one line", at + 1))
        }
        Some((at, _)) => Err(format!(
            "character {} is not allowed in a bearer token (letters, digits and -._~+/ only, then = padding)",
            at + 1
        )),
    }
}

impl Resumer for AteapiClient {
    fn start(&self, actor: &ActorId, done: AttemptDone) {
        let mut request = ResumeActorRequest::new();
        let mut object = ObjectRef::new();
        object.atespace = actor.atespace().to_string();
        object.name = actor.name().to_string();
        request.actor = Some(object).into();
        // The client on this thread's own completion queue, so that the
        // answer is read, and the stream waiting for it woken, on the thread
        // that runs that stream: no hand-off to another thread (retries
        // start on the timer thread and take the first).
        let (client, authorization) = {
            let live = self.live.read();
            let here = std::thread::current().id();
            let client = live.clients.iter().find(|(thread, _)| *thread == here).unwrap_or(&live.clients[0]);
            (Arc::clone(&client.1), live.authorization.clone())
        };
        let mut options = CallOption::default();
        let traceparent = done.traceparent();
        if authorization.is_some() || traceparent.is_some() {
            let mut headers = MetadataBuilder::with_capacity(2);
            if let Some(value) = authorization {
                // bearer_token() admits only characters a header value can carry.
                if let Err(e) = headers.add_str("authorization", &value) {
                    log::error!("ateapi token not sent: {e}");
                }
            }
            // The flight's trace goes on in a control plane that traces
            // (B122); the value is hex and dashes only.
            if let Some(value) = traceparent {
                let _ = headers.add_str(crate::trace::context::TRACEPARENT, &value);
            }
            options = options.headers(headers.build());
        }
        let (metrics, health, actor) = (self.metrics.clone(), Arc::clone(&self.health), actor.clone());
        let (metrics_for_wait, health_for_wait, actor_for_wait) =
            (metrics.clone(), Arc::clone(&health), actor.clone());
        // Sent as a server-streaming call, read by `unary` (B108).
        let call = move |client: &Client, done: AttemptDone| match client.server_streaming(
            &ATEAPI_RESUME_ACTOR,
            &request,
            options,
        ) {
            Ok(receiver) => client.spawn(async move {
                let result = attempt_result(unary::answer(receiver).await);
                report(&metrics, &health, &actor, &result);
                done.complete(result);
            }),
            Err(e) => {
                let result = Err(ResumeError::new(Code::Unknown, format!("starting ResumeActor: {e}")));
                report(&metrics, &health, &actor, &result);
                done.complete(result);
            }
        };
        // The common case costs one state read: a connection is there.
        if !is_connecting(client.channel().check_connectivity_state(true)) {
            return call(&client, done);
        }
        // Until the connection is made the call has reached nobody, so it
        // is no committed attempt (B15): it waits for the connection no
        // longer than the flight's budget, and past it fails as Unavailable
        // without being sent, so that the verdict comes at the budget (B82).
        // A connection that fails (refused, a TLS error) ends the wait at
        // once: the call then fails fast with gRPC's reason, as always.
        let channel = client.channel().clone();
        let deadline = done.budget_deadline();
        let waiting = Arc::clone(&client);
        client.spawn(async move {
            loop {
                let state = channel.check_connectivity_state(true);
                if !is_connecting(state) {
                    return call(&waiting, done);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !channel.wait_for_state_change(state, left).await {
                    let message = "no connection to ateapi within the budget (the call was not sent)";
                    let result = Err(ResumeError::new(Code::Unavailable, message));
                    report(&metrics_for_wait, &health_for_wait, &actor_for_wait, &result);
                    return done.complete(result);
                }
            }
        });
    }
}

/// Whether a channel in `state` has no connection yet but is making one.
fn is_connecting(state: grpcio::ConnectivityState) -> bool {
    matches!(
        state,
        grpcio::ConnectivityState::GRPC_CHANNEL_IDLE | grpcio::ConnectivityState::GRPC_CHANNEL_CONNECTING
    )
}

/// Whether the control plane is reachable, so an outage is logged once when
/// it starts and once when it ends, not once per request.
#[derive(Default)]
struct Health {
    down: AtomicBool,
}

fn report(metrics: &Metrics, health: &Health, actor: &ActorId, result: &AttemptResult) {
    match result {
        Ok(_) => {
            metrics.count_attempt(Code::Ok);
            if health.down.swap(false, Ordering::AcqRel) {
                log::info!("ateapi reachable again");
            }
        }
        Err(e) => {
            metrics.count_attempt(e.code);
            if e.code == Code::Unavailable && !health.down.swap(true, Ordering::AcqRel) {
                let kind = if is_tls_failure(&e.message) { "TLS failure" } else { "unreachable" };
                log::warn!(
                    error = e.message.as_str();
                    "ateapi {kind}: {}; requests park until it recovers (logged once)", e.message
                );
            }
            log::debug!("ResumeActor {actor}: {e}");
        }
    }
}

/// Whether a transport error is a TLS problem (handshake, certificate).
fn is_tls_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["ssl", "tls", "handshake", "certificate"].iter().any(|w| m.contains(w))
}

/// A pool name as the router keeps it (B109): at most 128 characters, so
/// that a control plane's long names cost bounded memory per actor.
fn clean_pool(pool: &str) -> &str {
    pool.char_indices().nth(128).map_or(pool, |(at, _)| &pool[..at])
}

/// Maps a call's result to the router's terms.
fn attempt_result(result: Result<ResumeActorResponse, Failure>) -> AttemptResult {
    match result {
        Ok(response) => {
            let assignment = response
                .actor
                .as_ref()
                .and_then(|a| a.status.as_ref())
                .and_then(|s| s.worker_assignment.as_ref());
            let ips = assignment.map(|w| w.worker_pod_ips.as_slice()).unwrap_or_default();
            let pool = assignment.map(|w| w.worker_pool.as_str()).unwrap_or_default();
            Ok(Resumed::from_pod_ips(response.resumed, ips).on_pool(clean_pool(pool)))
        }
        // gRPC core's own refusal of an answer over one of the router's
        // limits is a failure of the router's client, not a control-plane
        // verdict: it is not retried (a ResourceExhausted of gRPC's own is
        // no full pool), and its library text never reaches a body (B13).
        Err(Failure::Grpc(grpcio::Error::RpcFailure(status))) => match local_refusal(status.message()) {
            Some(limit) => {
                // The 500's body never shows the message; the log does (B62).
                let why = format!("ateapi's answer exceeds the router's {limit}: {}", status.message());
                Err(ResumeError::new(Code::Internal, clean_message(&why)))
            }
            None => {
                Err(ResumeError::new(Code::from_i32(status.code().into()), clean_message(status.message())))
            }
        },
        Err(Failure::Grpc(other)) => Err(ResumeError::new(Code::Unknown, other.to_string())),
        Err(Failure::Malformed(what)) => {
            Err(ResumeError::new(Code::Internal, format!("ateapi's answer broke the protocol: {what}")))
        }
    }
}

/// The metadata of one ateapi answer, status message included, at most.
const MAX_ANSWER_METADATA: i32 = 64 * 1024;

/// How gRPC core 1.56 begins the statuses it makes up itself when an
/// answer is over one of the channel's limits: its metadata
/// (`hpack_parse_result.cc`), its message (4 MiB, `compression_filter.cc`).
/// gRPC reports them as statuses of the call, the same type as the
/// control plane's own; their text is all that tells them apart.
const LOCAL_REFUSALS: [(&str, &str); 2] = [
    ("received metadata size exceeds", "metadata limit"),
    ("Received message larger than max", "message limit"),
];

/// The router's limit that gRPC core's own status `message` names, if any.
fn local_refusal(message: &str) -> Option<&'static str> {
    LOCAL_REFUSALS.iter().find(|(refusal, _)| message.starts_with(refusal)).map(|(_, limit)| *limit)
}

/// The most of a control-plane message a verdict's body carries (B13).
const MAX_MESSAGE_CHARS: usize = 256;

/// A control-plane message as a body may show it: at most
/// [`MAX_MESSAGE_CHARS`] characters, control characters as spaces, and `…`
/// where it was cut. A flight keeps its last error, so this also bounds
/// what a long message costs while requests park.
fn clean_message(message: &str) -> String {
    let mut clean: String =
        message.chars().take(MAX_MESSAGE_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if message.chars().nth(MAX_MESSAGE_CHARS).is_some() {
        clean.push('…');
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(b"  abc.DEF-123_~+/==\n"), Ok("abc.DEF-123_~+/=="));
        for (bad, why) in [
            (&b""[..], "empty"),
            (b" \n", "empty"),
            (b"==", "padding"),
            (b"ab\tc", "whitespace"),
            (b"ab c", "whitespace"),
            (b"line1\nline2", "whitespace"),
            ("t\u{f6}ken".as_bytes(), "not allowed"),
            (b"a=b", "not allowed"),
            (b"\xff\xfe", "UTF-8"),
        ] {
            let e = bearer_token(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(!bearer_token(b"s3cr3t value").unwrap_err().contains("s3cr3t"), "never quotes the token");
        let longest = "a".repeat(MAX_TOKEN);
        assert_eq!(bearer_token(format!("{longest}\n").as_bytes()), Ok(longest.as_str()));
        let e = bearer_token(format!("{longest}b").as_bytes()).unwrap_err();
        assert!(e.contains("8193 bytes, over the 8192"), "{e}");
    }

    #[test]
    fn maps_grpc_failures_to_codes_and_messages() {
        let status = grpcio::RpcStatus::with_message(
            grpcio::RpcStatusCode::RESOURCE_EXHAUSTED,
            "no free workers available".into(),
        );
        assert_eq!(
            attempt_result(Err(Failure::Grpc(grpcio::Error::RpcFailure(status)))),
            Err(ResumeError::new(Code::ResourceExhausted, "no free workers available"))
        );
        assert_eq!(
            attempt_result(Err(Failure::Grpc(grpcio::Error::RemoteStopped))).unwrap_err().code,
            Code::Unknown
        );
    }

    #[test]
    fn long_or_odd_messages_are_bounded_and_local_refusals_are_the_routers_own() {
        let failure = |code, message: &str| {
            attempt_result(Err(Failure::Grpc(grpcio::Error::RpcFailure(grpcio::RpcStatus::with_message(
                code,
                message.into(),
            )))))
            .unwrap_err()
        };
        let long = failure(grpcio::RpcStatusCode::RESOURCE_EXHAUSTED, &"é".repeat(20_000));
        assert_eq!(long.code, Code::ResourceExhausted);
        assert_eq!(long.message, format!("{}…", "é".repeat(MAX_MESSAGE_CHARS)));
        let odd = failure(grpcio::RpcStatusCode::ABORTED, "line one\r\nline\ttwo");
        assert_eq!(odd.message, "line one  line two");
        let local = failure(
            grpcio::RpcStatusCode::RESOURCE_EXHAUSTED,
            "received metadata size exceeds hard limit (value length 80000 vs. 65536)",
        );
        assert_eq!(local.code, Code::Internal, "not a full pool: not retried");
        assert!(local.message.starts_with("ateapi's answer exceeds the router's metadata limit"));
        let big = failure(
            grpcio::RpcStatusCode::RESOURCE_EXHAUSTED,
            "Received message larger than max (5242932 vs. 4194304)",
        );
        assert_eq!(big.code, Code::Internal, "B108: gRPC's own message limit is no full pool");
        assert!(
            big.message.starts_with("ateapi's answer exceeds the router's message limit"),
            "{}",
            big.message
        );
    }

    #[test]
    fn tls_failures_are_recognised() {
        assert!(is_tls_failure(
            "failed to connect to all addresses; last error: UNKNOWN: Ssl handshake failed"
        ));
        assert!(is_tls_failure("CERTIFICATE_VERIFY_FAILED"));
        assert!(!is_tls_failure("connection refused"));
    }
}
