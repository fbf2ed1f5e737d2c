//! Assembly: builds every component from a [`Config`] and owns their
//! threads. Nothing here decides anything; it wires.
//!
//! Threads, whatever the load: grpcio's completion-queue threads (one per
//! core, shared by the ext_proc server and the ateapi channel), one timer
//! thread, two HTTP threads per listener, and the caller's own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::bounded;
use grpcio::{ChannelBuilder, EnvBuilder, Environment, Server, ServerBuilder, ServerCredentials};

use crate::ateapi::AteapiClient;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::extproc::ExtProc;
use crate::flight::{FlightPolicy, FlightTable};
use crate::http::{self, HttpServer};
use crate::lot::ParkingLot;
use crate::metrics::Metrics;
use crate::resolver::Resolver;
use crate::timer::TimerThread;

/// Why the router could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// A running router.
pub struct Router {
    grpc: Server,
    http: Option<HttpServer>,
    timer: Arc<TimerThread>,
    resolver: Resolver,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    extproc_addr: SocketAddr,
    _env: Arc<Environment>,
}

impl Router {
    /// Starts every component. Binds the ext_proc port and the metrics
    /// listener; fails without leaving anything running.
    pub fn start(config: &Config) -> Result<Router, StartError> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let env = Arc::new(EnvBuilder::new().cq_count(cores).name_prefix("atenet-grpc").build());
        let metrics = Metrics::new();
        let timer = TimerThread::start();

        let ateapi = AteapiClient::connect(
            Arc::clone(&env),
            &config.ateapi_address,
            &config.ateapi_transport,
            metrics.clone(),
        )
        .map_err(|e| StartError(format!("ateapi client: {e}")))?;
        let policy = FlightPolicy {
            budget: config.parking.budget,
            backoff: config.parking.backoff,
            parking_enabled: config.parking.enabled,
        };
        let flights = FlightTable::new(policy, Arc::new(SystemClock), timer.clone(), Arc::new(ateapi));
        let lot = config
            .parking
            .enabled
            .then(|| ParkingLot::new(config.parking.max, Arc::new(SystemClock), metrics.clone()));
        let resolver = Resolver::new(flights, lot);
        let extproc = ExtProc::new(resolver.clone(), metrics.clone(), config.worker_port);

        // Without this gRPC sets SO_REUSEPORT, and a second router on the
        // same port would start silently instead of failing.
        let args = ChannelBuilder::new(Arc::clone(&env)).reuse_port(false).build_args();
        let mut grpc = ServerBuilder::new(Arc::clone(&env))
            .channel_args(args)
            .register_service(extproc.service())
            .build()
            .map_err(|e| StartError(format!("building the ext_proc server: {e}")))?;
        let port = grpc
            .add_listening_port(config.extproc_addr.to_string(), ServerCredentials::insecure())
            .map_err(|_| StartError(format!("cannot listen for ext_proc on {}", config.extproc_addr)))?;
        let extproc_addr = SocketAddr::new(config.extproc_addr.ip(), port);

        let ready = Arc::new(AtomicBool::new(true));
        let http = HttpServer::start(
            config.metrics_addr,
            "atenet-metrics",
            http::metrics_handler(metrics.clone(), Arc::clone(&ready)),
        )
        .map_err(|e| StartError(format!("cannot listen for metrics on {}: {e}", config.metrics_addr)))?;
        grpc.start();
        Ok(Router { grpc, http: Some(http), timer, resolver, metrics, ready, extproc_addr, _env: env })
    }

    /// Where ext_proc listens.
    pub fn extproc_addr(&self) -> SocketAddr {
        self.extproc_addr
    }

    /// Where `/metrics`, `/healthz` and `/readyz` listen.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.http.as_ref().map(HttpServer::addr).expect("metrics listener runs until stop")
    }

    /// The router's instruments.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The flight table and lot.
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// Flips `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Stops accepting streams, lets in-flight ones finish for up to
    /// `timeout`, then cancels the rest. Returns whether everything finished
    /// in time.
    pub fn stop(mut self, timeout: Duration) -> bool {
        self.set_ready(false);
        let shutdown = self.grpc.shutdown();
        let (done_tx, done_rx) = bounded(1);
        // The shutdown notification arrives on a completion queue; a short
        // lived thread waits for it so this one can time out.
        std::thread::spawn(move || {
            let _ = futures::executor::block_on(shutdown);
            let _ = done_tx.send(());
        });
        let drained = done_rx.recv_timeout(timeout).is_ok();
        if !drained {
            self.grpc.cancel_all_calls();
            let _ = done_rx.recv_timeout(Duration::from_secs(5));
        }
        if let Some(http) = self.http.take() {
            http.stop();
        }
        self.timer.stop();
        drained
    }
}
