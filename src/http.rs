//! The router's HTTP endpoints on tiny_http: `/metrics`, `/healthz` and
//! `/readyz` on the metrics listener (B31, B41).
//!
//! A fixed pool of two threads serves each listener: scrapes and probes are
//! rare and tiny, and a fixed count keeps the thread total independent of
//! load.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tiny_http::{Header, Request, Response, Server};

use crate::metrics::Metrics;

/// What a handler answers: status, content type, body.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
    }
}

/// Answers one request.
pub type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// A running listener.
pub struct HttpServer {
    server: Arc<Server>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl HttpServer {
    /// Binds `addr` and serves `handler` on two threads named `name`.
    pub fn start(addr: SocketAddr, name: &str, handler: Handler) -> io::Result<HttpServer> {
        let server = Arc::new(
            Server::http(addr).map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?,
        );
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let threads = (0..2)
            .map(|i| {
                let (server, handler) = (Arc::clone(&server), Arc::clone(&handler));
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        while let Ok(request) = server.recv() {
                            let reply = handler(&request);
                            let content_type = Header::from_bytes("Content-Type", reply.content_type)
                                .expect("static header is valid");
                            let response = Response::from_data(reply.body)
                                .with_status_code(reply.status)
                                .with_header(content_type);
                            let _ = request.respond(response);
                        }
                    })
                    .expect("spawning an HTTP thread")
            })
            .collect();
        Ok(HttpServer { server, threads, addr })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins the threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        for _ in &self.threads {
            self.server.unblock();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The metrics listener's handler.
pub fn metrics_handler(metrics: Metrics, ready: Arc<AtomicBool>) -> Handler {
    Arc::new(move |request: &Request| {
        let path = request.url().split('?').next().unwrap_or("");
        match path {
            "/metrics" => Reply {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: metrics.render().into_bytes(),
            },
            "/healthz" => Reply::text(200, "ok"),
            "/readyz" if ready.load(Ordering::Acquire) => Reply::text(200, "ok"),
            "/readyz" => Reply::text(503, "draining"),
            _ => Reply::text(404, "not found"),
        }
    })
}
