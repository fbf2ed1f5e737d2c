//! The ateapi client: asynchronous `ResumeActor` calls over one channel,
//! with credentials that follow the files on disk.
//!
//! An attempt is a unary call whose completion is a future spawned on the
//! channel's completion queue, so no thread is blocked per attempt and the
//! thread count does not grow with the number of parked requests. Attempts
//! carry no client deadline (B15): the control plane's own server-side
//! deadline bounds them, and abandoning one would strand the worker it
//! claimed.
//!
//! Credentials rotate without a restart: [`AteapiClient::refresh`] (run
//! every second by the router) re-reads the CA file, the client bundle and
//! the token file, and when one changed, builds a new channel for new
//! attempts; attempts already running finish on the old one. The token is
//! sent as `authorization: Bearer ...` and is never logged or shown.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use grpcio::{
    CallOption, Channel, ChannelBuilder, ChannelCredentialsBuilder, Client, Environment, MetadataBuilder,
};
use parking_lot::{Mutex, RwLock};

use crate::config::AteapiTransport;
use crate::metrics::Metrics;
use crate::proto::ateapi::{ObjectRef, ResumeActorRequest, ResumeActorResponse};
use crate::proto::ATEAPI_RESUME_ACTOR;
use crate::resume::{AttemptDone, AttemptResult, Code, ResumeError, Resumed, Resumer};
use crate::target::ActorId;

/// Why the client could not be set up.
#[derive(Debug)]
pub struct CredentialsError(pub String);

impl std::fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CredentialsError {}

/// The credential files as last read.
#[derive(Clone, Default, PartialEq, Eq)]
struct Files {
    ca: Vec<u8>,
    bundle: Vec<u8>,
    token: Vec<u8>,
}

/// What a new attempt uses.
struct Live {
    client: Arc<Client>,
    /// `Bearer <token>`, when a token file is configured.
    authorization: Option<Arc<str>>,
    files: Files,
}

/// A ResumeActor client.
pub struct AteapiClient {
    env: Arc<Environment>,
    address: String,
    transport: AteapiTransport,
    token_file: Option<PathBuf>,
    live: RwLock<Live>,
    metrics: Metrics,
    health: Arc<Health>,
    /// Serialises refreshes, so two never rebuild the channel at once.
    refreshing: Mutex<()>,
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
        metrics: Metrics,
    ) -> Result<AteapiClient, CredentialsError> {
        let files = read_files(transport, token_file)?;
        let live = build(&env, address, transport, token_file.is_some(), files)?;
        Ok(AteapiClient {
            env,
            address: address.to_string(),
            transport: transport.clone(),
            token_file: token_file.map(Path::to_path_buf),
            live: RwLock::new(live),
            metrics,
            health: Arc::new(Health::default()),
            refreshing: Mutex::new(()),
        })
    }

    /// Re-reads the credential files; when any changed, new attempts use a
    /// channel built from the new contents. A file that cannot be read (a
    /// rotation in progress) keeps the current credentials.
    pub fn refresh(&self) {
        let _one = self.refreshing.lock();
        let files = match read_files(&self.transport, self.token_file.as_deref()) {
            Ok(files) => files,
            Err(e) => {
                crate::warn!("ateapi credentials not reloaded, keeping the current ones: {e}");
                return;
            }
        };
        if files == self.live.read().files {
            return;
        }
        match build(&self.env, &self.address, &self.transport, self.token_file.is_some(), files) {
            Ok(live) => {
                *self.live.write() = live;
                crate::info!("ateapi credentials changed on disk: reloaded");
            }
            Err(e) => crate::warn!("ateapi credentials not reloaded, keeping the current ones: {e}"),
        }
    }

    /// The channel's state, without triggering a connection attempt.
    pub fn connectivity(&self) -> &'static str {
        use grpcio::ConnectivityState as S;
        match self.live.read().client.channel().check_connectivity_state(false) {
            S::GRPC_CHANNEL_IDLE => "IDLE",
            S::GRPC_CHANNEL_CONNECTING => "CONNECTING",
            S::GRPC_CHANNEL_READY => "READY",
            S::GRPC_CHANNEL_TRANSIENT_FAILURE => "TRANSIENT_FAILURE",
            S::GRPC_CHANNEL_SHUTDOWN => "SHUTDOWN",
        }
    }
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, CredentialsError> {
    fs::read(path).map_err(|e| CredentialsError(format!("{flag} {}: {e}", path.display())))
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
    with_token: bool,
    files: Files,
) -> Result<Live, CredentialsError> {
    let builder = ChannelBuilder::new(Arc::clone(env))
        .primary_user_agent(concat!("atenet-router/", env!("CARGO_PKG_VERSION")))
        .keepalive_time(std::time::Duration::from_secs(30))
        .keepalive_timeout(std::time::Duration::from_secs(10));
    let channel: Channel = match transport {
        AteapiTransport::Insecure => builder.connect(address),
        AteapiTransport::Tls { client_cert, server_name, .. } => {
            let mut creds = ChannelCredentialsBuilder::new().root_cert(files.ca.clone());
            if let Some(path) = client_cert {
                let (chain, key) = split_pem_bundle(&files.bundle).map_err(|why| {
                    CredentialsError(format!("--ateapi-client-cert {}: {why}", path.display()))
                })?;
                creds = creds.cert(chain, key);
            }
            let mut builder = builder.set_credentials(creds.build());
            if let Some(name) = server_name {
                builder = builder.override_ssl_target(name.clone());
            }
            builder.connect(address)
        }
    };
    let authorization = if with_token {
        let token = std::str::from_utf8(&files.token)
            .map(str::trim)
            .map_err(|_| CredentialsError("--ateapi-token-file: the token is not UTF-8".into()))?;
        if token.is_empty() || token.contains(['\r', '\n']) {
            return Err(CredentialsError("--ateapi-token-file: expected one non-empty line".into()));
        }
        Some(Arc::from(format!("Bearer {token}")))
    } else {
        None
    };
    Ok(Live { client: Arc::new(Client::new(channel)), authorization, files })
}

impl Resumer for AteapiClient {
    fn start(&self, actor: &ActorId, done: AttemptDone) {
        let mut request = ResumeActorRequest::new();
        let mut object = ObjectRef::new();
        object.atespace = actor.atespace().to_string();
        object.name = actor.name().to_string();
        request.actor = Some(object).into();
        let (client, authorization) = {
            let live = self.live.read();
            (Arc::clone(&live.client), live.authorization.clone())
        };
        let mut options = CallOption::default();
        if let Some(value) = authorization {
            let mut headers = MetadataBuilder::with_capacity(1);
            if headers.add_str("authorization", &value).is_ok() {
                options = options.headers(headers.build());
            }
        }
        let (metrics, health, actor) = (self.metrics.clone(), Arc::clone(&self.health), actor.clone());
        match client.unary_call_async(&ATEAPI_RESUME_ACTOR, &request, options) {
            Ok(receiver) => client.spawn(async move {
                let result = attempt_result(receiver.await);
                report(&metrics, &health, &actor, &result);
                done(result);
            }),
            Err(e) => {
                let result = Err(ResumeError::new(Code::Unknown, format!("starting ResumeActor: {e}")));
                report(&metrics, &health, &actor, &result);
                done(result);
            }
        }
    }
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
                crate::info!("ateapi reachable again");
            }
        }
        Err(e) => {
            metrics.count_attempt(e.code);
            if e.code == Code::Unavailable && !health.down.swap(true, Ordering::AcqRel) {
                let kind = if is_tls_failure(&e.message) { "TLS failure" } else { "unreachable" };
                crate::warn!("ateapi {kind}: {}; requests park until it recovers (logged once)", e.message);
            }
            crate::debug!("ResumeActor {actor}: {e}");
        }
    }
}

/// Whether a transport error is a TLS problem (handshake, certificate).
fn is_tls_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["ssl", "tls", "handshake", "certificate"].iter().any(|w| m.contains(w))
}

/// Maps a call's result to the router's terms.
fn attempt_result(result: grpcio::Result<ResumeActorResponse>) -> AttemptResult {
    match result {
        Ok(response) => Ok(Resumed {
            resumed: response.resumed,
            worker_ips: response
                .actor
                .as_ref()
                .and_then(|a| a.status.as_ref())
                .and_then(|s| s.worker_assignment.as_ref())
                .map(|w| w.worker_pod_ips.clone())
                .unwrap_or_default(),
        }),
        Err(grpcio::Error::RpcFailure(status)) => {
            Err(ResumeError::new(Code::from_i32(status.code().into()), status.message()))
        }
        Err(other) => Err(ResumeError::new(Code::Unknown, other.to_string())),
    }
}

/// Splits one PEM bundle into its certificate chain and its private key,
/// each re-encoded as PEM, as gRPC's credential API wants them apart.
pub fn split_pem_bundle(bundle: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let text = std::str::from_utf8(bundle).map_err(|_| "not a PEM file".to_string())?;
    let (mut chain, mut key) = (String::new(), String::new());
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let label_end = block[11..].find("-----").ok_or("truncated PEM header")? + 11;
        let label = &block[11..label_end];
        let end_marker = format!("-----END {label}-----");
        let end = block.find(&end_marker).ok_or_else(|| format!("unterminated PEM block {label}"))?
            + end_marker.len();
        let pem = format!("{}\n", &block[..end]);
        if label == "CERTIFICATE" {
            chain.push_str(&pem);
        } else if label.ends_with("PRIVATE KEY") {
            if !key.is_empty() {
                return Err("more than one private key".into());
            }
            key = pem;
        }
        rest = &block[end..];
    }
    if chain.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    if key.is_empty() {
        return Err("no PRIVATE KEY block".into());
    }
    Ok((chain.into_bytes(), key.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_bundle() {
        let bundle = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n\
                      -----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n\
                      -----BEGIN PRIVATE KEY-----\nKKK\n-----END PRIVATE KEY-----\n";
        let (chain, key) = split_pem_bundle(bundle.as_bytes()).unwrap();
        let chain = String::from_utf8(chain).unwrap();
        assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(String::from_utf8(key).unwrap().contains("KKK"));
        assert!(split_pem_bundle(b"-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n").is_err());
        assert!(split_pem_bundle(b"garbage").is_err());
    }

    #[test]
    fn maps_grpc_failures_to_codes_and_messages() {
        let status = grpcio::RpcStatus::with_message(
            grpcio::RpcStatusCode::RESOURCE_EXHAUSTED,
            "no free workers available".into(),
        );
        assert_eq!(
            attempt_result(Err(grpcio::Error::RpcFailure(status))),
            Err(ResumeError::new(Code::ResourceExhausted, "no free workers available"))
        );
        assert_eq!(attempt_result(Err(grpcio::Error::RemoteStopped)).unwrap_err().code, Code::Unknown);
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
