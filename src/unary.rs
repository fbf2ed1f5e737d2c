//! Reading a unary gRPC call's answer without trusting the peer to keep
//! the unary protocol (B108, B133).
//!
//! grpcio's unary receiver unwraps the answer's message: an OK status
//! without one (trailers only, or headers then trailers with no DATA)
//! panics, which B59 turns into the router's abort, and a second message
//! is never noticed. So the router's clients send each unary call as a
//! server-streaming one, which is the same call on the wire, and read the
//! answer here, message by message. Every gRPC client of the router (the
//! control plane's, the OTLP exporter's) goes through [`answer`].
//!
//! May depend on nothing of the crate.

use std::fmt;

use futures::StreamExt;
use grpcio::ClientSStreamReceiver;

/// Why a call has no answer to use.
#[derive(Debug)]
pub enum Failure {
    /// gRPC's status: the peer's, or gRPC core's own.
    Grpc(grpcio::Error),
    /// An answer that breaks gRPC's unary protocol.
    Malformed(&'static str),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Grpc(e) => e.fmt(f),
            Failure::Malformed(what) => write!(f, "the answer broke gRPC's unary protocol: {what}"),
        }
    }
}

/// A unary call's answer, read from its response stream: exactly one
/// message and an OK status. Anything else is a [`Failure`], never a panic
/// and never a call left open: a second message cancels the call at once.
pub async fn answer<T>(mut answer: ClientSStreamReceiver<T>) -> Result<T, Failure> {
    let first = match answer.next().await {
        Some(Ok(message)) => message,
        Some(Err(e)) => return Err(Failure::Grpc(e)),
        None => return Err(Failure::Malformed("an OK status without a message")),
    };
    match answer.next().await {
        None => Ok(first),
        Some(Err(e)) => Err(Failure::Grpc(e)),
        Some(Ok(_)) => {
            answer.cancel();
            Err(Failure::Malformed("a second message in a unary answer"))
        }
    }
}
