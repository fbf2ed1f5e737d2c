//! What one `ResumeActor` attempt can return, independent of gRPC plumbing:
//! the vocabulary the flights, the verdicts and the ateapi client share.

use std::fmt;
use std::net::IpAddr;

/// gRPC status codes, as numbered on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// Every code, in wire order (a code's discriminant is its wire number).
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code for a wire number; unknown numbers are `Unknown`, as gRPC says.
    pub fn from_i32(n: i32) -> Code {
        usize::try_from(n).ok().and_then(|i| Code::ALL.get(i)).copied().unwrap_or(Code::Unknown)
    }

    /// The canonical name, as used in metric labels (`ResourceExhausted`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "Canceled",
            Code::Unknown => "Unknown",
            Code::InvalidArgument => "InvalidArgument",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::NotFound => "NotFound",
            Code::AlreadyExists => "AlreadyExists",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
            Code::Aborted => "Aborted",
            Code::OutOfRange => "OutOfRange",
            Code::Unimplemented => "Unimplemented",
            Code::Internal => "Internal",
            Code::Unavailable => "Unavailable",
            Code::DataLoss => "DataLoss",
            Code::Unauthenticated => "Unauthenticated",
        }
    }

    /// Whether a flight retries after this code (B16). Aborted is a
    /// concurrent-resume conflict and always retried; the capacity and
    /// availability codes only when parking is enabled.
    pub fn is_retryable(self, parking_enabled: bool) -> bool {
        match self {
            Code::Aborted => true,
            Code::ResourceExhausted | Code::FailedPrecondition | Code::Unavailable => parking_enabled,
            _ => false,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed attempt: a gRPC status, or a failure that never reached the
/// server (reported as `Unknown`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeError {
    pub code: Code,
    /// The gRPC status message; the only detail ever shown to clients.
    pub message: String,
}

impl ResumeError {
    pub fn new(code: Code, message: impl Into<String>) -> ResumeError {
        ResumeError { code, message: message.into() }
    }
}

impl fmt::Display for ResumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A successful attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// True when a resume actually ran; false when the actor was already
    /// running (B21's `none`).
    pub resumed: bool,
    /// The first of `status.worker_assignment.worker_pod_ips`, parsed:
    /// all a verdict needs, and cheap for every joiner to copy.
    pub worker: Result<IpAddr, BadWorkerIp>,
    /// `status.worker_assignment.worker_pool`, empty when not given: the
    /// pool whose saturation group the actor joins later (B109).
    pub worker_pool: String,
}

impl Resumed {
    /// A success whose worker is the first of `worker_pod_ips` (B8).
    pub fn from_pod_ips(resumed: bool, ips: &[String]) -> Resumed {
        Resumed { resumed, worker: worker_ip(ips), worker_pool: String::new() }
    }

    /// The same success, on worker pool `pool`.
    pub fn on_pool(self, pool: &str) -> Resumed {
        Resumed { worker_pool: pool.to_owned(), ..self }
    }
}

/// ateapi answered success without a usable worker IP: the first entry of
/// `worker_pod_ips` (empty when there was none), cut to 64 characters, for
/// the log line of the 500 it becomes (B8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadWorkerIp(pub String);

fn worker_ip(ips: &[String]) -> Result<IpAddr, BadWorkerIp> {
    let first = ips.first().map(String::as_str).unwrap_or_default();
    first
        .trim()
        .parse()
        .ok()
        .filter(is_worker_address)
        .ok_or_else(|| BadWorkerIp(first.chars().take(64).collect()))
}

/// Whether `ip` can be a worker's address. An unspecified address would
/// send Envoy to its own host, and a broadcast or multicast one to no
/// worker at all (B8); a link-local one is no pod's, and 169.254.169.254 is
/// the cloud's metadata service (B83). An IPv4-mapped IPv6 address is
/// judged as IPv4.
fn is_worker_address(ip: &IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() || v4.is_link_local())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}

/// The result of one attempt.
pub type AttemptResult = Result<Resumed, ResumeError>;
