//! Error mapping: what HTTP answer a resolution becomes (B6-B8, B10-B13),
//! and the gRPC status a gRPC client reads instead (B73).
//!
//! Bodies carry at most the gRPC status message (B13); the full error goes to
//! the log. Each rejection also carries a short machine token, sent as
//! ImmediateResponse `details` and as the `x-atenet-reason` header, so an
//! operator can see why a request failed from Envoy's access log alone.

use std::net::IpAddr;

use crate::actor::resume::{Code, ResumeError};
use crate::actor::target::{ActorId, Target};
use crate::parking::resolver::{ResolveError, ResumeOutcome};

/// The answer to one request_headers message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send the request to `worker` (`ip:port`, IPv6 bracketed), telling the
    /// worker the target port, and setting `ate-target-actor` when the
    /// request does not already carry it alone.
    Route { actor: ActorId, worker: String, target_port: u16, set_actor_header: bool },
    /// Answer the client directly.
    Reject(Rejection),
}

/// An ImmediateResponse's content (B10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub body: String,
    /// Machine token for `details` and `x-atenet-reason`.
    pub reason: &'static str,
    /// Seconds for a `Retry-After` header: set on capacity 503s only.
    pub retry_after: Option<u64>,
}

impl Rejection {
    /// The gRPC status a gRPC client gets for this rejection (B73). Without
    /// it Envoy derives one from the HTTP status, and its table turns a 404
    /// into UNIMPLEMENTED: a client would read "no such method" for "no such
    /// actor".
    ///
    /// Every transient 503 is UNAVAILABLE, the code gRPC clients and retry
    /// policies retry with backoff. Only an atespace over its fair share
    /// (B69) is RESOURCE_EXHAUSTED: that is a per-tenant quota, which a
    /// retry does not lift until the tenant's own parked requests drain.
    /// A caller preempted by a higher band (B118) is RESOURCE_EXHAUSTED too:
    /// its band's share of the lot is taken, and an at-once retry of the
    /// same band would only be refused again.
    pub fn grpc_status(&self) -> Code {
        match (self.status, self.reason) {
            (404, "atenet_invalid_target") => Code::InvalidArgument,
            (404, _) => Code::NotFound,
            (403, _) => Code::PermissionDenied,
            (401, _) => Code::Unauthenticated,
            (504, _) => Code::DeadlineExceeded,
            (503, "atenet_atespace_full" | "atenet_preempted") => Code::ResourceExhausted,
            (503, _) => Code::Unavailable,
            _ => Code::Internal,
        }
    }
}

/// B35's `outcome` label: how a request_headers exchange ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteOutcome {
    Ok,
    NotFound,
    NoCapacity,
    Unavailable,
    LockConflict,
    FailedPrecondition,
    Timeout,
    Cancelled,
    ResumeError,
}

impl RouteOutcome {
    /// Every value, in the order of their discriminants.
    pub const ALL: [RouteOutcome; 9] = [
        RouteOutcome::Ok,
        RouteOutcome::NotFound,
        RouteOutcome::NoCapacity,
        RouteOutcome::Unavailable,
        RouteOutcome::LockConflict,
        RouteOutcome::FailedPrecondition,
        RouteOutcome::Timeout,
        RouteOutcome::Cancelled,
        RouteOutcome::ResumeError,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            RouteOutcome::Ok => "ok",
            RouteOutcome::NotFound => "not_found",
            RouteOutcome::NoCapacity => "no_capacity",
            RouteOutcome::Unavailable => "unavailable",
            RouteOutcome::LockConflict => "lock_conflict",
            RouteOutcome::FailedPrecondition => "failed_precondition",
            RouteOutcome::Timeout => "timeout",
            RouteOutcome::Cancelled => "cancelled",
            RouteOutcome::ResumeError => "resume_error",
        }
    }
}

/// The 404 for a missing or invalid target (B4).
pub fn invalid_target() -> (Verdict, RouteOutcome) {
    let rejection = Rejection {
        status: 404,
        body: "invalid actor reference".into(),
        reason: "atenet_invalid_target",
        retry_after: None,
    };
    (Verdict::Reject(rejection), RouteOutcome::NotFound)
}

/// The 504 for a caller whose flight's attempt is still running when Envoy
/// would give up on it (B81): the control plane has not answered.
pub fn resume_timeout(id: &ActorId) -> (Verdict, RouteOutcome) {
    let rejection = Rejection {
        status: 504,
        body: format!("actor {id} request timed out: ateapi has not answered the resume"),
        reason: "atenet_resume_timeout",
        retry_after: None,
    };
    (Verdict::Reject(rejection), RouteOutcome::Timeout)
}

/// The verdict for a caller's resolution. `retry_after` is the seconds a
/// capacity 503 (lot full, budget exhausted) tells the client to wait.
pub fn for_outcome(
    target: &Target,
    outcome: &ResumeOutcome,
    worker_port: u16,
    retry_after: u64,
) -> (Verdict, RouteOutcome) {
    let id = &target.actor;
    match &outcome.result {
        Ok(resumed) => match resumed.worker {
            Ok(ip) => {
                let worker = match ip {
                    IpAddr::V4(v4) => format!("{v4}:{worker_port}"),
                    IpAddr::V6(v6) => format!("[{v6}]:{worker_port}"),
                };
                let set_actor_header = !target.carries_actor_header;
                (
                    Verdict::Route { actor: id.clone(), worker, target_port: target.port, set_actor_header },
                    RouteOutcome::Ok,
                )
            }
            Err(_) => reject(
                500,
                format!("actor {id} routing failed"),
                "atenet_routing_failed",
                RouteOutcome::ResumeError,
            ),
        },
        Err(ResolveError::LotFull) => with_retry_after(
            reject(
                503,
                format!("actor \"{id}\" unavailable: router at capacity"),
                "atenet_lot_full",
                RouteOutcome::NoCapacity,
            ),
            retry_after,
        ),
        // B118: the same answer as a full lot, under its own reason.
        Err(ResolveError::Preempted) => with_retry_after(
            reject(
                503,
                format!("actor \"{id}\" unavailable: router at capacity"),
                "atenet_preempted",
                RouteOutcome::NoCapacity,
            ),
            retry_after,
        ),
        Err(ResolveError::FlightsFull) => with_retry_after(
            reject(
                503,
                format!("actor \"{id}\" unavailable: router at capacity"),
                "atenet_flights_full",
                RouteOutcome::NoCapacity,
            ),
            retry_after,
        ),
        // The tenant's quota, whichever share it hit (B69, B79, B80): the
        // client's answer is the same, the metrics say which.
        Err(
            ResolveError::AtespaceFull
            | ResolveError::AtespaceFlightsFull
            | ResolveError::AtespaceRequestsFull,
        ) => with_retry_after(
            reject(
                503,
                format!("actor \"{id}\" unavailable: atespace at capacity"),
                "atenet_atespace_full",
                RouteOutcome::NoCapacity,
            ),
            retry_after,
        ),
        Err(ResolveError::DeadlineTooShort(error)) => {
            with_retry_after(for_error(id, error, Some("atenet_deadline_too_short")), retry_after)
        }
        Err(ResolveError::CallerDeadline) => reject(
            504,
            format!("actor {id} request timed out"),
            "atenet_caller_deadline",
            RouteOutcome::Timeout,
        ),
        Err(ResolveError::Failed(error)) => for_error(id, error, None),
        Err(ResolveError::BudgetExhausted(error)) => {
            with_retry_after(for_error(id, error, Some("atenet_budget_exhausted")), retry_after)
        }
    }
}

fn with_retry_after((verdict, label): (Verdict, RouteOutcome), seconds: u64) -> (Verdict, RouteOutcome) {
    match verdict {
        Verdict::Reject(r) if r.status == 503 => {
            (Verdict::Reject(Rejection { retry_after: Some(seconds.max(1)), ..r }), label)
        }
        other => (other, label),
    }
}

/// B11's table; `reason` overrides the code's own token (budget exhaustion
/// keeps the wrapped error's status and body, B12).
fn for_error(id: &ActorId, error: &ResumeError, reason: Option<&'static str>) -> (Verdict, RouteOutcome) {
    let (status, body, token, label) = match error.code {
        Code::NotFound => (404, format!("actor {id} not found"), "atenet_not_found", RouteOutcome::NotFound),
        Code::ResourceExhausted => (
            503,
            format!("actor {id} unavailable: {}", error.message),
            "atenet_no_capacity",
            RouteOutcome::NoCapacity,
        ),
        Code::FailedPrecondition => (
            503,
            format!("actor {id} unavailable: {}", error.message),
            "atenet_failed_precondition",
            RouteOutcome::FailedPrecondition,
        ),
        Code::Aborted => (
            503,
            format!("actor {id} unavailable: {}", error.message),
            "atenet_lock_conflict",
            RouteOutcome::LockConflict,
        ),
        Code::Unavailable => {
            (503, format!("actor {id} unavailable"), "atenet_unavailable", RouteOutcome::Unavailable)
        }
        Code::DeadlineExceeded => {
            (504, format!("actor {id} request timed out"), "atenet_timeout", RouteOutcome::Timeout)
        }
        Code::PermissionDenied => {
            (403, format!("actor {id} access denied"), "atenet_access_denied", RouteOutcome::ResumeError)
        }
        Code::Unauthenticated => (
            401,
            format!("actor {id} authentication required"),
            "atenet_unauthenticated",
            RouteOutcome::ResumeError,
        ),
        _ => (500, format!("error resuming actor {id}"), "atenet_resume_error", RouteOutcome::ResumeError),
    };
    reject(status, body, reason.unwrap_or(token), label)
}

fn reject(status: u16, body: String, reason: &'static str, label: RouteOutcome) -> (Verdict, RouteOutcome) {
    (Verdict::Reject(Rejection { status, body, reason, retry_after: None }), label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::resume::Resumed;
    use crate::parking::resolver::ResumeLabel;

    fn target() -> Target {
        Target { actor: ActorId::parse("demo/a").unwrap(), port: 8080, carries_actor_header: false }
    }

    fn outcome(result: Result<Resumed, ResolveError>) -> ResumeOutcome {
        ResumeOutcome { result, resume: ResumeLabel::Unknown, parked: false }
    }

    fn rejection(result: Result<Resumed, ResolveError>) -> (u16, String, &'static str) {
        match for_outcome(&target(), &outcome(result), 443, 7).0 {
            Verdict::Reject(r) => (r.status, r.body, r.reason),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn failed(code: Code, message: &str) -> Result<Resumed, ResolveError> {
        Err(ResolveError::Failed(ResumeError::new(code, message)))
    }

    #[test]
    fn b7_route_ipv4_ipv6() {
        let ok = |ip: &str| Ok(Resumed::from_pod_ips(true, &[ip.into(), "10.9.9.9".into()]));
        assert_eq!(
            for_outcome(&target(), &outcome(ok("10.0.0.7")), 443, 7).0,
            Verdict::Route {
                actor: target().actor,
                worker: "10.0.0.7:443".into(),
                target_port: 8080,
                set_actor_header: true
            }
        );
        match for_outcome(&target(), &outcome(ok("fd00::52")), 8443, 7).0 {
            Verdict::Route { worker, .. } => assert_eq!(worker, "[fd00::52]:8443"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn b8_missing_or_bad_worker_ip() {
        let not_a_host = [
            "0.0.0.0",
            "::",
            "255.255.255.255",
            "224.0.0.1",
            "239.1.2.3",
            "ff02::1",
            "::ffff:0.0.0.0",
            // B83: link-local, the cloud's metadata address among them.
            "169.254.169.254",
            "169.254.0.1",
            "::ffff:169.254.169.254",
            "fe80::1",
            "febf::1",
        ];
        let cases = [vec![], vec!["not-an-ip".to_string()], vec!["".to_string(), "10.0.0.1".to_string()]]
            .into_iter()
            .chain(not_a_host.iter().map(|ip| vec![ip.to_string(), "10.0.0.1".to_string()]));
        for ips in cases {
            let got = rejection(Ok(Resumed::from_pod_ips(true, &ips)));
            assert_eq!(got, (500, "actor demo/a routing failed".into(), "atenet_routing_failed"));
        }
    }

    #[test]
    fn b11_every_row() {
        let rows: Vec<(Result<Resumed, ResolveError>, u16, &str)> = vec![
            (failed(Code::NotFound, "x"), 404, "actor demo/a not found"),
            (
                failed(Code::ResourceExhausted, "no free workers available"),
                503,
                "actor demo/a unavailable: no free workers available",
            ),
            (failed(Code::FailedPrecondition, "suspending"), 503, "actor demo/a unavailable: suspending"),
            (failed(Code::Aborted, "conflict"), 503, "actor demo/a unavailable: conflict"),
            (failed(Code::Unavailable, "connection refused"), 503, "actor demo/a unavailable"),
            (failed(Code::DeadlineExceeded, "slow"), 504, "actor demo/a request timed out"),
            (failed(Code::PermissionDenied, "no"), 403, "actor demo/a access denied"),
            (failed(Code::Unauthenticated, "who"), 401, "actor demo/a authentication required"),
            (Err(ResolveError::LotFull), 503, "actor \"demo/a\" unavailable: router at capacity"),
            (Err(ResolveError::FlightsFull), 503, "actor \"demo/a\" unavailable: router at capacity"),
            (Err(ResolveError::AtespaceFull), 503, "actor \"demo/a\" unavailable: atespace at capacity"),
            (
                Err(ResolveError::AtespaceFlightsFull),
                503,
                "actor \"demo/a\" unavailable: atespace at capacity",
            ),
            (
                Err(ResolveError::AtespaceRequestsFull),
                503,
                "actor \"demo/a\" unavailable: atespace at capacity",
            ),
            (Err(ResolveError::CallerDeadline), 504, "actor demo/a request timed out"),
            (
                Err(ResolveError::DeadlineTooShort(ResumeError::new(
                    Code::ResourceExhausted,
                    "no free workers available",
                ))),
                503,
                "actor demo/a unavailable: no free workers available",
            ),
            (failed(Code::Internal, "boom"), 500, "error resuming actor demo/a"),
            (failed(Code::Unknown, "transport"), 500, "error resuming actor demo/a"),
        ];
        for (result, status, body) in rows {
            let (got_status, got_body, _) = rejection(result);
            assert_eq!((got_status, got_body.as_str()), (status, body));
        }
    }

    #[test]
    fn retry_after_only_on_capacity_503s() {
        let retry = |result| match for_outcome(&target(), &outcome(result), 443, 7).0 {
            Verdict::Reject(r) => r.retry_after,
            Verdict::Route { .. } => None,
        };
        assert_eq!(retry(Err(ResolveError::LotFull)), Some(7));
        assert_eq!(retry(Err(ResolveError::Preempted)), Some(7), "B118");
        assert_eq!(
            rejection(Err(ResolveError::Preempted)),
            (503, "actor \"demo/a\" unavailable: router at capacity".into(), "atenet_preempted")
        );
        assert_eq!(retry(Err(ResolveError::FlightsFull)), Some(7));
        assert_eq!(retry(Err(ResolveError::AtespaceFull)), Some(7));
        assert_eq!(retry(Err(ResolveError::AtespaceFlightsFull)), Some(7));
        assert_eq!(retry(Err(ResolveError::AtespaceRequestsFull)), Some(7));
        let short = ResolveError::DeadlineTooShort(ResumeError::new(Code::ResourceExhausted, "full"));
        assert_eq!(retry(Err(short)), Some(7));
        assert_eq!(retry(Err(ResolveError::CallerDeadline)), None, "a 504 is not a capacity answer");
        let wrapped = ResumeError::new(Code::ResourceExhausted, "full");
        assert_eq!(retry(Err(ResolveError::BudgetExhausted(wrapped.clone()))), Some(7));
        assert_eq!(retry(Err(ResolveError::Failed(wrapped))), None, "a fail-fast 503 is not capacity");
        assert_eq!(retry(failed(Code::NotFound, "x")), None);
    }

    #[test]
    fn b73_grpc_status_for_every_rejection() {
        let grpc = |result| match for_outcome(&target(), &outcome(result), 443, 7).0 {
            Verdict::Reject(r) => r.grpc_status(),
            other => panic!("expected a rejection, got {other:?}"),
        };
        let wrapped = || ResumeError::new(Code::ResourceExhausted, "full");
        let rows: Vec<(Result<Resumed, ResolveError>, Code)> = vec![
            (failed(Code::NotFound, "x"), Code::NotFound),
            (failed(Code::PermissionDenied, "no"), Code::PermissionDenied),
            (failed(Code::Unauthenticated, "who"), Code::Unauthenticated),
            (failed(Code::DeadlineExceeded, "slow"), Code::DeadlineExceeded),
            (Err(ResolveError::CallerDeadline), Code::DeadlineExceeded),
            (failed(Code::ResourceExhausted, "full"), Code::Unavailable),
            (failed(Code::FailedPrecondition, "suspending"), Code::Unavailable),
            (failed(Code::Aborted, "conflict"), Code::Unavailable),
            (failed(Code::Unavailable, "down"), Code::Unavailable),
            (Err(ResolveError::LotFull), Code::Unavailable),
            (Err(ResolveError::Preempted), Code::ResourceExhausted),
            (Err(ResolveError::FlightsFull), Code::Unavailable),
            (Err(ResolveError::BudgetExhausted(wrapped())), Code::Unavailable),
            (Err(ResolveError::DeadlineTooShort(wrapped())), Code::Unavailable),
            (Err(ResolveError::AtespaceFull), Code::ResourceExhausted),
            (Err(ResolveError::AtespaceFlightsFull), Code::ResourceExhausted),
            (Err(ResolveError::AtespaceRequestsFull), Code::ResourceExhausted),
            (Ok(Resumed::from_pod_ips(true, &[])), Code::Internal),
            (failed(Code::Internal, "boom"), Code::Internal),
            (failed(Code::Unknown, "transport"), Code::Internal),
        ];
        for (result, code) in rows {
            let label = format!("{result:?}");
            assert_eq!(grpc(result), code, "{label}");
        }
        let (Verdict::Reject(invalid), _) = invalid_target() else { panic!("B4 is a rejection") };
        assert_eq!(invalid.grpc_status(), Code::InvalidArgument);
    }

    #[test]
    fn b12_budget_exhausted_maps_by_wrapped_code_and_message() {
        let wrapped = ResumeError::new(Code::ResourceExhausted, "no free workers available");
        let got = rejection(Err(ResolveError::BudgetExhausted(wrapped)));
        assert_eq!(
            got,
            (503, "actor demo/a unavailable: no free workers available".into(), "atenet_budget_exhausted")
        );
        let got = rejection(Err(ResolveError::BudgetExhausted(ResumeError::new(Code::Unavailable, "x"))));
        assert_eq!(got.0, 503);
        assert_eq!(got.1, "actor demo/a unavailable");
        assert!(!got.1.contains("rpc error"));
    }
}
