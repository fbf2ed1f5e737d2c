//! `parkload`'s numbers: open-loop latency timed from the schedule, requests
//! that time out, unsent requests and the exit status, against the real
//! binaries (router, simulated ateapi, parkload).
//!
//! Every timing bound here is a lower bound that the scripted server
//! guarantees by construction; none depends on how fast this machine is.
#![cfg(feature = "testkit")]

mod common;

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
