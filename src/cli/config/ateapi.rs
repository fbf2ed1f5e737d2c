//! The control plane: where ateapi is, how it is reached and authenticated
//! (B53), and how many ResumeActor calls may be open at once.

use std::path::PathBuf;

use super::{share, Purpose};
use crate::cli::flags::ServeArgs;
use crate::cli::values::{grpc_target, invalid, non_empty, ConfigError};

/// How the router reaches ateapi.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AteapiTransport {
    /// Plaintext (`--ateapi-insecure`).
    Insecure,
    /// TLS verified against `ca_file`, optionally with a client bundle.
    Tls { ca_file: PathBuf, client_cert: Option<PathBuf>, server_name: Option<String> },
}

/// The control-plane client's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ateapi {
    /// `host:port`.
    pub address: String,
    /// How ateapi is reached: always set for [`Purpose::Serve`]; `None` only
    /// for a bootstrap given neither `--ateapi-ca-file` nor
    /// `--ateapi-insecure`, which no router can start with.
    pub transport: Option<AteapiTransport>,
    /// A bearer token file, sent as `authorization: Bearer ...` (TLS only).
    pub token_file: Option<PathBuf>,
    /// ResumeActor calls open at once at most.
    pub max_calls: usize,
    /// ... and for one atespace.
    pub max_calls_per_atespace: usize,
}

impl Ateapi {
    /// The ateapi flags, checked for `purpose`: a bootstrap needs no
    /// transport, but every ateapi flag given is checked as `serve` checks
    /// it (B96).
    pub(super) fn from_args(args: &ServeArgs, purpose: Purpose) -> Result<Ateapi, ConfigError> {
        let max_calls = max_calls(args.ateapi_max_calls)?;
        if args.ateapi_address.trim().is_empty() {
            return Err(invalid("--ateapi-address must not be empty"));
        }
        grpc_target("--ateapi-address", args.ateapi_address.trim())?;
        let transport = transport(args)?;
        if transport.is_none() && purpose == Purpose::Serve {
            return Err(invalid(
                "--ateapi-ca-file is required to verify ateapi (or pass --ateapi-insecure for plaintext)",
            ));
        }
        let token_file = non_empty(&args.ateapi_token_file).map(PathBuf::from);
        if token_file.is_some() && transport == Some(AteapiTransport::Insecure) {
            return Err(invalid(
                "--ateapi-token-file needs TLS: a bearer token is never sent in plaintext (drop --ateapi-insecure)",
            ));
        }
        Ok(Ateapi {
            address: args.ateapi_address.trim().to_string(),
            transport,
            token_file,
            max_calls,
            max_calls_per_atespace: share(
                "--ateapi-max-calls-per-atespace",
                args.ateapi_max_calls_per_atespace,
                "--ateapi-max-calls",
                max_calls as u64,
            )?,
        })
    }
}

/// The most ResumeActor calls that may be open at once (B97): each costs
/// about 19 KiB in gRPC core, so a million is already 19 GiB.
fn max_calls(value: i64) -> Result<usize, ConfigError> {
    match value {
        1..=1_000_000 => Ok(value as usize),
        n => Err(invalid(format!("--ateapi-max-calls must be in 1..=1000000, got {n}"))),
    }
}

/// The transport the ateapi flags name: `None` when they name none (no CA,
/// not insecure).
fn transport(args: &ServeArgs) -> Result<Option<AteapiTransport>, ConfigError> {
    let tls_flags: Vec<&str> = [
        ("--ateapi-ca-file", &args.ateapi_ca_file),
        ("--ateapi-client-cert", &args.ateapi_client_cert),
        ("--ateapi-server-name", &args.ateapi_server_name),
    ]
    .into_iter()
    .filter(|(_, v)| !v.trim().is_empty())
    .map(|(flag, _)| flag)
    .collect();
    if args.ateapi_insecure {
        if !tls_flags.is_empty() {
            return Err(invalid(format!(
                "--ateapi-insecure cannot be combined with {}",
                tls_flags.join(", ")
            )));
        }
        return Ok(Some(AteapiTransport::Insecure));
    }
    let Some(ca_file) = non_empty(&args.ateapi_ca_file) else {
        // A client certificate or a server name without a CA to verify
        // the server with is a mistake whatever the command.
        if let Some(flag) = tls_flags.first() {
            return Err(invalid(format!("{flag} needs --ateapi-ca-file, the CA that verifies ateapi")));
        }
        return Ok(None);
    };
    Ok(Some(AteapiTransport::Tls {
        ca_file: PathBuf::from(ca_file),
        client_cert: non_empty(&args.ateapi_client_cert).map(PathBuf::from),
        server_name: non_empty(&args.ateapi_server_name),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::parse_serve_args;
    use crate::cli::config::tests::parse;

    #[test]
    fn tls_required_without_insecure() {
        let message = parse_serve_args(&[]).unwrap_err().to_string();
        assert!(message.contains("--ateapi-ca-file"), "{message}");
        let c = parse_serve_args(&[
            "--ateapi-ca-file",
            "/etc/ca.pem",
            "--ateapi-client-cert",
            "/etc/client.pem",
            "--ateapi-server-name",
            "api",
        ])
        .unwrap();
        assert_eq!(
            c.ateapi.transport,
            Some(AteapiTransport::Tls {
                ca_file: "/etc/ca.pem".into(),
                client_cert: Some("/etc/client.pem".into()),
                server_name: Some("api".into()),
            })
        );
    }

    #[test]
    fn b97_calls_open_at_once_and_an_atespaces_share_of_them() {
        let calls = |args: &[&str]| {
            let c = parse(args).unwrap();
            (c.ateapi.max_calls, c.ateapi.max_calls_per_atespace)
        };
        assert_eq!(calls(&[]), (1024, 512));
        assert_eq!(calls(&["--ateapi-max-calls", "1"]), (1, 1), "at least one");
        assert_eq!(
            calls(&["--ateapi-max-calls", "1000000", "--ateapi-max-calls-per-atespace", "1000000"]),
            (1_000_000, 1_000_000)
        );
        for bad in [
            &["--ateapi-max-calls", "0"][..],
            &["--ateapi-max-calls", "-1"],
            &["--ateapi-max-calls", "1000001"],
            &["--ateapi-max-calls-per-atespace", "-1"],
            &["--ateapi-max-calls", "8", "--ateapi-max-calls-per-atespace", "9"],
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad[bad.len() - 2]), "{bad:?}: {e}");
        }
    }
}
