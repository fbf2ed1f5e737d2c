//! `parkload`'s numbers: open-loop latency timed from the schedule, requests
//! that time out, unsent requests and the exit status, against the real
//! binaries (router, simulated ateapi, parkload).
//!
//! Every timing bound here is a lower bound that the scripted server
//! guarantees by construction; none depends on how fast this machine is.
#![cfg(feature = "testkit")]

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::{router_args, spawn_router, spawn_until, word_after, RouterProcess, Spawned, SIM_BIN};
use common::PATIENCE;

const PARKLOAD: &str = env!("CARGO_BIN_EXE_parkload");

/// A simulated ateapi answering as `script` says (see `ateapi-sim
/// --script`), and a router in front of it.
struct Stack {
    // Dropped first: the router, then the sim it calls.
    router: RouterProcess,
    _sim: Spawned,
}

impl Stack {
    fn start(name: &str, script: &str) -> Stack {
        let path = std::env::temp_dir().join(format!("parkload-{name}-{}.script", std::process::id()));
        std::fs::write(&path, script).unwrap();
        let sim = spawn_until(
            SIM_BIN,
            &[
                "--listen",
                "127.0.0.1:0",
                "--workers",
                "0",
                "--actors",
                "0",
                "--script",
                path.to_str().unwrap(),
            ],
            "listening on",
        );
        let _ = std::fs::remove_file(&path);
        let router = spawn_router(&router_args(word_after(&sim.line, "listening on "), &[]));
        Stack { router, _sim: sim }
    }

    fn target(&self) -> String {
        self.router.extproc.to_string()
    }
}

/// What a parkload run printed, and how it exited.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs parkload with `args`; kills it and fails if it has not exited
/// within `limit`.
fn parkload(args: &[&str], limit: Duration) -> Ran {
    let start = Instant::now();
    let mut child = Command::new(PARKLOAD)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parkload");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).unwrap();
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("parkload {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ran {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        took: start.elapsed(),
    }
}

/// The number after the first `"key":` that follows `after` in `json`.
fn number(json: &str, after: &str, key: &str) -> f64 {
    let from = json.find(after).unwrap_or_else(|| panic!("{after} in {json}"));
    let rest = &json[from..];
    let at = rest.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("{key} after {after} in {json}"));
    let value = &rest[at + key.len() + 3..];
    let end = value.find([',', '}', ']']).unwrap();
    value[..end].parse().unwrap_or_else(|_| panic!("{key} is a number in {json}"))
}

/// A server that takes 200 ms per request, one request at a time, and 20
/// requests scheduled over 1 s: request `i` (due at `i` x 50 ms) cannot be
/// sent before the `i` before it have had their verdicts, `i` x 200 ms, nor
/// have its own before `(i + 1)` x 200 ms. Timed from its schedule its
/// latency is at least 200 + 150 `i` ms: p50 >= 1.55 s, max >= 3.05 s, and
/// every request after the first is late. Timed from its send (coordinated
/// omission) every latency would be about 200 ms: what the service time
/// reports, so that the server's own time stays visible.
#[test]
fn open_loop_latency_counts_from_the_schedule_not_the_send() {
    let stack = Stack::start("schedule", "demo/slow OK 200ms 10.0.0.1 false -\n");
    let target = stack.target();
    let ran = parkload(
        &[
            "--target",
            &target,
            "--actors",
            "demo/slow",
            "--rate",
            "20",
            "--count",
            "20",
            "--concurrency",
            "1",
            "--json",
            "--progress",
            "0",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let json = ran.stdout;
    assert!(json.starts_with("{\"requests\":20,"), "every tick is sent, none skipped: {json}");
    assert!(json.contains("\"verdicts\":{\"200 routed\":20}"), "{json}");
    assert_eq!(number(&json, "{", "unsent"), 0.0, "{json}");
    assert!(number(&json, "{", "late") >= 15.0, "{json}");
    assert!(number(&json, "\"latency_ms\":", "max") >= 3000.0, "{json}");
    assert!(number(&json, "\"latency_ms\":", "p50") >= 1000.0, "{json}");
    assert!(number(&json, "\"200 routed\":{", "p50") >= 1000.0, "{json}");
    let service = number(&json, "\"service_ms\":", "p50");
    assert!((150.0..1000.0).contains(&service), "service time from the send: {json}");
    assert!(json.contains("\"params\":{\"target\":"), "{json}");
    assert!(json.contains("\"rate\":20,\"duration_seconds\":null,\"count\":20,\"actors\":1,"), "{json}");
}

/// The same server for 1 s: at most 5 of the 20 requests scheduled within
/// it can be sent (one every 200 ms at best), and the rest are reported
/// unsent, not dropped.
#[test]
fn open_loop_reports_requests_the_time_ran_out_for() {
    let stack = Stack::start("unsent", "demo/slow OK 200ms 10.0.0.1 false -\n");
    let target = stack.target();
    let args = [
        "--target",
        &target,
        "--actors",
        "demo/slow",
        "--rate",
        "20",
        "--duration",
        "1s",
        "--concurrency",
        "1",
    ];
    let ran = parkload(&[&args[..], &["--json", "--progress", "0"]].concat(), Duration::from_secs(60));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let json = ran.stdout;
    let (sent, unsent) = (number(&json, "{", "requests"), number(&json, "{", "unsent"));
    assert!(sent <= 5.0, "{json}");
    assert_eq!(sent + unsent, 20.0, "{json}");
    assert!(json.contains("\"duration_seconds\":1,\"count\":null,"), "{json}");
    let per_second = json.split("\"per_second\":[").nth(1).unwrap().split(']').next().unwrap();
    let counted: f64 = per_second.split(',').map(|n| n.parse::<f64>().unwrap()).sum();
    assert_eq!(counted, sent, "{json}");

    // The run takes at least its second: progress lines every 200 ms come.
    let human = parkload(&[&args[..], &["--progress", "0.2"]].concat(), Duration::from_secs(60));
    assert_eq!(human.code, 0, "{}", human.stderr);
    let progress = human.stderr.lines().find(|l| l.contains("] completed ")).expect("a progress line");
    for part in ["  rate ", "/s  in flight ", "  late "] {
        assert!(progress.contains(part), "{progress}");
    }
    let unsent_line = human.stdout.lines().find(|l| l.starts_with("unsent: ")).expect("an unsent line");
    let unsent: u64 = word_after(unsent_line, "unsent: ").parse().unwrap();
    assert!(unsent >= 15, "{}", human.stdout);
    assert!(human.stdout.contains("late: "), "{}", human.stdout);
}

/// A control plane that holds the resume for an hour: each request is
/// cancelled at its timeout and counted, and the run ends on its own.
#[test]
fn requests_without_a_verdict_time_out_and_fail_the_run() {
    let stack = Stack::start("timeout", "demo/held OK 1h 10.0.0.1 false -\n");
    let target = stack.target();
    let args = [
        "--target",
        &target,
        "--actors",
        "demo/held",
        "--request-timeout",
        "500ms",
        "--count",
        "3",
        "--concurrency",
        "3",
        "--progress",
        "0",
    ];
    let ran = parkload(&args, PATIENCE);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.took >= Duration::from_millis(500));
    assert!(ran.stdout.contains("errors: 3"), "{}", ran.stdout);
    assert!(
        ran.stdout.lines().any(|l| l.trim_start().starts_with('3') && l.ends_with("client-timeout")),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stderr
            .contains("parkload: 3 requests failed (gRPC errors or timeouts), more than --max-errors 0"),
        "{}",
        ran.stderr
    );

    let tolerated = parkload(&[&args[..], &["--max-errors", "3", "--json"]].concat(), PATIENCE);
    assert_eq!(tolerated.code, 0, "{}", tolerated.stderr);
    let json = tolerated.stdout;
    assert!(json.contains("\"verdicts\":{\"client-timeout\":3}"), "{json}");
    assert_eq!(number(&json, "{", "errors"), 3.0, "{json}");
    assert!(number(&json, "\"client-timeout\":{", "p50") >= 500.0, "timed from the send: {json}");
    assert!(json.contains("\"request_timeout_seconds\":0.5}"), "{json}");
}

/// Nothing listening: every request fails at the gRPC level.
#[test]
fn grpc_failures_fail_the_run() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let target = format!("127.0.0.1:{port}");
    let ran = parkload(
        &["--target", &target, "--count", "4", "--concurrency", "2", "--json", "--progress", "0"],
        PATIENCE,
    );
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("\"grpc-error 14-UNAVAILABLE\":4"), "{}", ran.stdout);
    assert!(
        ran.stderr
            .contains("parkload: 4 requests failed (gRPC errors or timeouts), more than --max-errors 0"),
        "{}",
        ran.stderr
    );
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, flag) in [
        (&["--request-timeout", "0s"][..], "--request-timeout"),
        (&["--request-timeout", "soon"], "--request-timeout"),
        (&["--rate", "-5"], "--rate"),
        (&["--rate", "inf"], "--rate"),
        (&["--progress", "1e300"], "--progress"),
        (&["--max-errors", "-1"], "--max-errors"),
        (&["--hold", "100000000000"], "--hold"),
        (&["--concurrency", "1000000000"], "--concurrency"),
    ] {
        let ran = parkload(args, PATIENCE);
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(flag), "{args:?}: {}", ran.stderr);
        assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    }
}

// ------------------------------------------------------------------ --http

/// How the test's HTTP server answers.
#[derive(Clone, Copy, Default)]
struct Answers {
    /// Close the connection, without saying so, after this many responses
    /// on it (as a server closing an idle keep-alive connection does).
    close_after: Option<usize>,
    /// Hold each response this long, one response at a time across every
    /// connection.
    serial_delay: Option<Duration>,
    /// Never answer.
    hang: bool,
    /// Answer every request with this instead of a response.
    garbage: Option<&'static str>,
}

/// A small HTTP/1.1 server standing in for Envoy's listener, and the truth
/// of what parkload sent: every request's connection, path and
/// `ate-target-actor`. For `demo/full` it answers as the router does for a
/// full flight table (503, `x-atenet-reason`); for `demo/chunked` a
/// chunked 200; for anything else a 200 with a Content-Length.
struct HttpServer {
    addr: std::net::SocketAddr,
    /// (connection number, path, actor) of each request, in arrival order.
    seen: std::sync::Arc<std::sync::Mutex<Vec<(usize, String, String)>>>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HttpServer {
    fn start(answers: Answers) -> HttpServer {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let serial = Arc::new(Mutex::new(()));
        let (seen2, connections2) = (Arc::clone(&seen), Arc::clone(&connections));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let n = connections2.fetch_add(1, Ordering::SeqCst);
                let (seen, serial) = (Arc::clone(&seen2), Arc::clone(&serial));
                std::thread::spawn(move || serve_connection(stream, n, answers, &seen, &serial));
            }
        });
        HttpServer { addr, seen, connections }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> Vec<(usize, String, String)> {
        self.seen.lock().unwrap().clone()
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn serve_connection(
    stream: std::net::TcpStream,
    n: usize,
    answers: Answers,
    seen: &std::sync::Mutex<Vec<(usize, String, String)>>,
    serial: &std::sync::Mutex<()>,
) {
    use std::io::{BufRead, BufReader, Write};
    let mut reader = BufReader::new(stream);
    let mut answered = 0;
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push(line.trim_end().to_string()),
            }
        }
        let path = head.first().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_string();
        let actor = head.iter().find_map(|l| l.strip_prefix("ate-target-actor: ")).unwrap_or("").to_string();
        seen.lock().unwrap().push((n, path, actor.clone()));
        if answers.hang {
            std::thread::sleep(Duration::from_secs(3600));
        }
        let response = match (answers.garbage, actor.as_str()) {
            (Some(garbage), _) => garbage.to_string(),
            (None, "demo/full") => "HTTP/1.1 503 Service Unavailable\r\nx-atenet-reason: atenet_flights_full\r\ncontent-length: 9\r\n\r\ntoo busy\n".to_string(),
            (None, "demo/chunked") => "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n".to_string(),
            (None, _) => "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n".to_string(),
        };
        let _turn = answers.serial_delay.map(|delay| {
            let turn = serial.lock().unwrap();
            std::thread::sleep(delay);
            turn
        });
        if reader.get_mut().write_all(response.as_bytes()).is_err() {
            return;
        }
        answered += 1;
        if answers.close_after.is_some_and(|n| answered >= n) {
            return;
        }
    }
}

/// Each request in flight keeps its connection (keep-alive), every request
/// carries its actor and the URL's path, and each response is counted by
/// its status and `x-atenet-reason`, checked against what the server saw.
#[test]
fn http_keeps_connections_alive_and_counts_each_verdict() {
    let server = HttpServer::start(Answers::default());
    let url = server.url("/probe?x=1");
    let ran = parkload(
        &[
            "--http",
            &url,
            "--actors",
            "demo/a,demo/full,demo/chunked",
            "--distribution",
            "round-robin",
            "--count",
            "300",
            "--concurrency",
            "4",
            "--json",
            "--progress",
            "0",
        ],
        PATIENCE,
    );
    assert_eq!(ran.code, 0, "a 503 is a verdict, not a failure: {}\n{}", ran.stdout, ran.stderr);
    let json = ran.stdout;
    assert!(json.contains("\"verdicts\":{\"200\":200,\"503 atenet_flights_full\":100}"), "{json}");
    assert_eq!(number(&json, "{", "errors"), 0.0, "{json}");
    assert!(json.contains(&format!("\"params\":{{\"target\":\"{url}\",\"concurrency\":4,")), "{json}");
    let seen = server.seen();
    assert_eq!(seen.len(), 300);
    for actor in ["demo/a", "demo/full", "demo/chunked"] {
        assert_eq!(seen.iter().filter(|(_, _, a)| a == actor).count(), 100, "{actor}");
    }
    assert!(seen.iter().all(|(_, path, _)| path == "/probe?x=1"), "{seen:?}");
    assert_eq!(server.connections(), 4, "one keep-alive connection per request in flight");
}

/// A server that closes each connection after two responses without a
/// word: the request that finds its connection closed goes again on a
/// fresh one, and no request fails.
#[test]
fn http_sends_again_on_a_fresh_connection_when_a_kept_one_was_closed() {
    let server = HttpServer::start(Answers { close_after: Some(2), ..Answers::default() });
    let ran = parkload(
        &["--http", &server.url("/"), "--count", "100", "--concurrency", "2", "--json", "--progress", "0"],
        PATIENCE,
    );
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("\"verdicts\":{\"200\":100}"), "{}", ran.stdout);
    assert!(server.connections() >= 50, "{} connections", server.connections());
}

/// The open-loop test above, over HTTP: a server taking 200 ms per
/// request, one at a time, and 20 requests due over 1 s. Latency counts
/// from each request's schedule: p50 >= 1.55 s and max >= 3.05 s by
/// construction, while the service time stays about 200 ms.
#[test]
fn http_open_loop_latency_counts_from_the_schedule_not_the_send() {
    let server =
        HttpServer::start(Answers { serial_delay: Some(Duration::from_millis(200)), ..Answers::default() });
    let ran = parkload(
        &[
            "--http",
            &server.url("/"),
            "--actors",
            "demo/slow",
            "--rate",
            "20",
            "--count",
            "20",
            "--concurrency",
            "1",
            "--json",
            "--progress",
            "0",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let json = ran.stdout;
    assert!(json.contains("\"verdicts\":{\"200\":20}"), "{json}");
    assert!(number(&json, "{", "late") >= 15.0, "{json}");
    assert!(number(&json, "\"latency_ms\":", "max") >= 3000.0, "{json}");
    assert!(number(&json, "\"latency_ms\":", "p50") >= 1000.0, "{json}");
    let service = number(&json, "\"service_ms\":", "p50");
    assert!((150.0..1000.0).contains(&service), "service time from the send: {json}");
    assert_eq!(server.seen().len(), 20);
}

/// No answer within --request-timeout is a client-timeout; an answer that
/// is no HTTP, or no server at all, an http-error: each fails the run.
#[test]
fn http_timeouts_and_failures_fail_the_run() {
    let hung = HttpServer::start(Answers { hang: true, ..Answers::default() });
    let args =
        ["--request-timeout", "500ms", "--count", "3", "--concurrency", "3", "--progress", "0", "--json"];
    let ran = parkload(&[&["--http", &hung.url("/")][..], &args].concat(), PATIENCE);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.took >= Duration::from_millis(500));
    assert!(ran.stdout.contains("\"verdicts\":{\"client-timeout\":3}"), "{}", ran.stdout);
    assert!(number(&ran.stdout, "\"client-timeout\":{", "p50") >= 500.0, "{}", ran.stdout);
    assert!(
        ran.stderr
            .contains("parkload: 3 requests failed (HTTP errors or timeouts), more than --max-errors 0"),
        "{}",
        ran.stderr
    );

    let garbage =
        HttpServer::start(Answers { garbage: Some("SSH-2.0-OpenSSH_9.6\r\n\r\n"), ..Answers::default() });
    let ran = parkload(&[&["--http", &garbage.url("/")][..], &args].concat(), PATIENCE);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("\"verdicts\":{\"http-error malformed status line\":3}"), "{}", ran.stdout);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ran = parkload(&[&["--http", &format!("http://127.0.0.1:{port}/")][..], &args].concat(), PATIENCE);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("\"verdicts\":{\"http-error connect: connection refused\":3}"),
        "{}",
        ran.stdout
    );
    let tolerated = parkload(
        &[
            "--http",
            &format!("http://127.0.0.1:{port}/"),
            "--count",
            "3",
            "--max-errors",
            "3",
            "--progress",
            "0",
        ],
        PATIENCE,
    );
    assert_eq!(tolerated.code, 0, "{}", tolerated.stderr);
    assert!(tolerated.stdout.contains("errors: 3 (HTTP errors and client timeouts)"), "{}", tolerated.stdout);
}

/// A server that refuses connections refuses at once: the closed loop
/// pauses after each refusal (10 ms, doubling to 1 s), where each thread
/// spun, 105,000 refusals a second on a core of its own.
#[test]
fn http_a_refused_connection_pauses_the_closed_loop() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/");
    let args = ["--http", &url, "--duration", "2s", "--concurrency", "4", "--max-errors", "100000000"];
    let ran = parkload(&[&args[..], &["--progress", "0", "--json"]].concat(), PATIENCE);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let refused = number(&ran.stdout, "\"verdicts\":{", "http-error connect: connection refused");
    // Each thread: about 8 tries in 2 s (10 + 20 + ... + 640 ms, then 1 s).
    assert!((4.0..=100.0).contains(&refused), "{refused} refusals: {}", ran.stdout);
}

#[test]
fn http_bad_flags_exit_2_naming_the_flag() {
    for (args, says) in [
        (&["--http", "https://127.0.0.1/"][..], "https is not supported"),
        (&["--http", "127.0.0.1:8080"], "--http"),
        (&["--http", "http://"], "--http"),
        (&["--http", "http://127.0.0.1/", "--target", "127.0.0.1:1"], "exclude each other"),
        (&["--http", "http://127.0.0.1/", "--concurrency", "10001"], "--concurrency"),
        (&["--http", "http://127.0.0.1/", "--hold", "10001"], "--hold"),
        (&["--http", "http://127.0.0.1/", "--actors", "demo/a\r\nx-evil: 1"], "--actors"),
    ] {
        let ran = parkload(args, PATIENCE);
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(says), "{args:?}: {}", ran.stderr);
        assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    }
}
