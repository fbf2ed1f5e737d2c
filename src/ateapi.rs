//! The ateapi client: one grpcio channel, asynchronous `ResumeActor` calls.
//!
//! An attempt is a unary call whose completion is a future spawned on the
//! channel's completion queue, so no thread is blocked per attempt and the
//! thread count does not grow with the number of parked requests. Attempts
//! carry no client deadline (B15): the control plane's own server-side
//! deadline bounds them, and abandoning one would strand the worker it
//! claimed.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use grpcio::{CallOption, ChannelBuilder, ChannelCredentialsBuilder, Client, Environment};

use crate::config::AteapiTransport;
use crate::metrics::Metrics;
use crate::proto::ateapi::{ObjectRef, ResumeActorRequest, ResumeActorResponse};
use crate::proto::ATEAPI_RESUME_ACTOR;
use crate::resume::{AttemptDone, AttemptResult, Code, ResumeError, Resumed, Resumer};
use crate::target::ActorId;

/// A ResumeActor client over one channel.
pub struct AteapiClient {
    client: Client,
    metrics: Metrics,
}

/// Why the client could not be set up.
#[derive(Debug)]
pub struct CredentialsError(pub String);

impl std::fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CredentialsError {}

impl AteapiClient {
    /// Opens a channel to `address` (connection is lazy: a control plane that
    /// is down shows up as `Unavailable` attempts, which park).
    pub fn connect(
        env: Arc<Environment>,
        address: &str,
        transport: &AteapiTransport,
        metrics: Metrics,
    ) -> Result<AteapiClient, CredentialsError> {
        let builder = ChannelBuilder::new(env)
            .primary_user_agent(concat!("atenet-router/", env!("CARGO_PKG_VERSION")))
            .keepalive_time(std::time::Duration::from_secs(30))
            .keepalive_timeout(std::time::Duration::from_secs(10));
        let channel = match transport {
            AteapiTransport::Insecure => builder.connect(address),
            AteapiTransport::Tls { ca_file, client_cert, server_name } => {
                let mut creds =
                    ChannelCredentialsBuilder::new().root_cert(read("--ateapi-ca-file", ca_file)?);
                if let Some(bundle_path) = client_cert {
                    let bundle = read("--ateapi-client-cert", bundle_path)?;
                    let (chain, key) = split_pem_bundle(&bundle).map_err(|why| {
                        CredentialsError(format!("--ateapi-client-cert {}: {why}", bundle_path.display()))
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
        Ok(AteapiClient { client: Client::new(channel), metrics })
    }
}

impl AteapiClient {
    /// The channel's state, without triggering a connection attempt.
    pub fn connectivity(&self) -> &'static str {
        use grpcio::ConnectivityState as S;
        match self.client.channel().check_connectivity_state(false) {
            S::GRPC_CHANNEL_IDLE => "IDLE",
            S::GRPC_CHANNEL_CONNECTING => "CONNECTING",
            S::GRPC_CHANNEL_READY => "READY",
            S::GRPC_CHANNEL_TRANSIENT_FAILURE => "TRANSIENT_FAILURE",
            S::GRPC_CHANNEL_SHUTDOWN => "SHUTDOWN",
        }
    }
}

impl Resumer for AteapiClient {
    fn start(&self, actor: &ActorId, done: AttemptDone) {
        let mut request = ResumeActorRequest::new();
        let mut object = ObjectRef::new();
        object.atespace = actor.atespace().to_string();
        object.name = actor.name().to_string();
        request.actor = Some(object).into();
        let metrics = self.metrics.clone();
        let actor = actor.clone();
        match self.client.unary_call_async(&ATEAPI_RESUME_ACTOR, &request, CallOption::default()) {
            Ok(receiver) => self.client.spawn(async move {
                let result = attempt_result(receiver.await);
                report(&metrics, &actor, &result);
                done(result);
            }),
            Err(e) => {
                let result = Err(ResumeError::new(Code::Unknown, format!("starting ResumeActor: {e}")));
                report(&metrics, &actor, &result);
                done(result);
            }
        }
    }
}

fn report(metrics: &Metrics, actor: &ActorId, result: &AttemptResult) {
    match result {
        Ok(_) => metrics.count_attempt(Code::Ok),
        Err(e) => {
            metrics.count_attempt(e.code);
            crate::debug!("ResumeActor {actor}: {e}");
        }
    }
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

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, CredentialsError> {
    fs::read(path).map_err(|e| CredentialsError(format!("{flag} {}: {e}", path.display())))
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
}
