//! The router's health where Envoy can see it: gRPC's standard health
//! service (`grpc.health.v1.Health`) on the ext_proc port (B84).
//!
//! A fleet of routers behind one Envoy cluster needs each router's own
//! word on whether to send it streams: Envoy's `grpc_health_check` (and a
//! Kubernetes gRPC probe) calls `Check` on the port it already connects to.
//! `Check` answers SERVING while the router serves and NOT_SERVING from the
//! first moment of a drain; Envoy takes a host out of rotation on the first
//! NOT_SERVING answer (docs/envoy.md), so a draining router stops being
//! chosen within one health-check interval, while it still serves the
//! streams it holds.
//!
//! A hand-over (B75) is no drain: the port keeps serving through the
//! successor, so the predecessor never says NOT_SERVING (an answer from it
//! would eject a host whose address still serves). Only `Check` is served:
//! `Watch` stays UNIMPLEMENTED (B84).
//!
//! A check takes no ext_proc stream slot and counts in no ext_proc metric:
//! it is a call of another service, answered at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use grpcio::{RpcContext, RpcStatus, RpcStatusCode, Service, ServiceBuilder, UnarySink};

use crate::proto::health::health_check_response::ServingStatus;
use crate::proto::health::{HealthCheckRequest, HealthCheckResponse};
use crate::proto::HEALTH_CHECK;

/// The service names `Check` answers for: the whole server (`""`, what
/// Envoy's `grpc_health_check` and Kubernetes send by default) and the
/// ext_proc service by its full name.
pub const SERVICES: [&str; 2] = ["", "envoy.service.ext_proc.v3.ExternalProcessor"];

/// How much of an unknown service name the NOT_FOUND status repeats.
const ECHOED_NAME: usize = 100;

/// Whether the router says it serves.
pub struct Health {
    serving: AtomicBool,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health { serving: AtomicBool::new(true) })
    }

    /// SERVING, or NOT_SERVING once a drain started.
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// What `Check` answers for the whole server now.
    pub fn status(&self) -> ServingStatus {
        if self.serving.load(Ordering::Acquire) {
            ServingStatus::SERVING
        } else {
            ServingStatus::NOT_SERVING
        }
    }

    /// The answer to `Check` for `service`: a status, or NOT_FOUND for a
    /// service this server does not have, as the health protocol says.
    fn check(&self, service: &str) -> Result<HealthCheckResponse, RpcStatus> {
        if !SERVICES.contains(&service) {
            let name: String = service.chars().take(ECHOED_NAME).collect();
            return Err(RpcStatus::with_message(
                RpcStatusCode::NOT_FOUND,
                format!("unknown service {name:?} (this server's are \"\" and {:?})", SERVICES[1]),
            ));
        }
        let mut response = HealthCheckResponse::new();
        response.status = self.status().into();
        Ok(response)
    }

    /// The grpcio service to register beside ext_proc.
    pub fn service(self: &Arc<Self>) -> Service {
        let this = Arc::clone(self);
        ServiceBuilder::new()
            .add_unary_handler(
                &HEALTH_CHECK,
                move |ctx: RpcContext<'_>,
                      request: HealthCheckRequest,
                      sink: UnarySink<HealthCheckResponse>| {
                    let answer = match this.check(&request.service) {
                        Ok(response) => sink.success(response),
                        Err(status) => sink.fail(status),
                    };
                    // A client gone before the answer is nothing to report.
                    ctx.spawn(answer.map(|_| ()));
                },
            )
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b84_serving_until_the_drain_and_not_found_for_other_services() {
        let health = Health::new();
        for service in SERVICES {
            assert_eq!(health.check(service).unwrap().status.enum_value(), Ok(ServingStatus::SERVING));
        }
        health.set_serving(false);
        assert_eq!(health.check("").unwrap().status.enum_value(), Ok(ServingStatus::NOT_SERVING));
        let unknown = health.check(&"x".repeat(10_000)).unwrap_err();
        assert_eq!(unknown.code(), RpcStatusCode::NOT_FOUND);
        assert!(unknown.message().len() < 300, "the name is cut: {}", unknown.message());
        assert_eq!(health.check("grpc.health.v1.Health").unwrap_err().code(), RpcStatusCode::NOT_FOUND);
    }
}
