//! A stand-in for Envoy's admin API, for the drain's Envoy steps (B43).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// A stand-in for Envoy's admin API: records requests, and answers
/// `/stats` with the given active-connection counts in turn (then the last).
pub struct FakeAdmin {
    pub addr: String,
    pub log: Arc<Mutex<Vec<String>>>,
    _server: Arc<tiny_http::Server>,
}

/// How the fake admin answers one request: HTTP status and a delay.
pub type Answering = Box<dyn Fn(&str) -> (u16, Duration) + Send>;

impl FakeAdmin {
    pub fn start(active: Vec<u64>) -> FakeAdmin {
        FakeAdmin::answering(active, Box::new(|_| (200, Duration::ZERO)))
    }

    /// As [`FakeAdmin::start`], with `answer` choosing each answer's status
    /// and delay from its `METHOD path` (an error status carries no stats).
    pub fn answering(active: Vec<u64>, answer: Answering) -> FakeAdmin {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let addr = server.server_addr().to_ip().unwrap().to_string();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (srv, requests) = (Arc::clone(&server), Arc::clone(&log));
        std::thread::spawn(move || {
            let mut counts = active.into_iter().peekable();
            let mut last = 0;
            while let Ok(request) = srv.recv() {
                let line = format!("{} {}", request.method(), request.url());
                requests.lock().push(line.clone());
                let (status, delay) = answer(&line);
                std::thread::sleep(delay);
                let body = if status != 200 {
                    "error\n".to_string()
                } else if request.url().starts_with("/stats") {
                    last = counts.next().unwrap_or(last);
                    format!("http.admin.downstream_cx_active: 1\nhttp.ingress.downstream_cx_active: {last}\n")
                } else {
                    "OK\n".to_string()
                };
                let _ = request.respond(tiny_http::Response::from_string(body).with_status_code(status));
            }
        });
        FakeAdmin { addr, log, _server: server }
    }
}
