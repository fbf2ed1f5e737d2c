//! The real `atenet-router` binary: flags, validation messages, startup and
//! shutdown (B37-B40, B46).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const ROUTER: &str = env!("CARGO_BIN_EXE_atenet-router");
const SIM: &str = env!("CARGO_BIN_EXE_ateapi-sim");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(ROUTER).args(args).output().expect("run atenet-router");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts a process and returns it with the first stderr line containing
/// `marker`.
fn start_until(program: &str, args: &[&str], marker: &str) -> (Child, String) {
    let mut child =
        Command::new(program).args(args).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{program} exited before printing {marker:?}"));
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, line)
}

fn word_after<'a>(line: &'a str, prefix: &str) -> &'a str {
    let start = line.find(prefix).unwrap_or_else(|| panic!("{prefix:?} in {line:?}")) + prefix.len();
    line[start..].split([' ', ',']).next().unwrap()
}

fn terminate(child: &mut Child) -> i32 {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    child.wait().unwrap().code().unwrap_or(-1)
}

#[test]
fn help_lists_the_serve_subcommand_and_its_flags() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("serve"), "{out}");
    let (code, out, _) = run(&["serve", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--ateapi-address",
        "--ateapi-insecure",
        "--parked-request-budget",
        "--parked-request-max",
        "--extproc-max-requests",
        "--drain-timeout",
        "--route-timeout",
        "--log-level",
    ] {
        assert!(out.contains(flag), "{flag} missing from help");
    }
}

#[test]
fn b37_bad_flags_exit_nonzero_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["serve", "--ateapi-insecure", "--parked-request-retry-factor", "0.5"],
            "--parked-request-retry-factor",
        ),
        (
            &["serve", "--ateapi-insecure", "--parked-request-retry-jitter", "1.5"],
            "--parked-request-retry-jitter",
        ),
        (&["serve", "--ateapi-insecure", "--extproc-max-requests", "10"], "--extproc-max-requests"),
        (&["serve", "--ateapi-insecure", "--drain-timeout", "1s"], "--drain-timeout"),
        (&["serve", "--ateapi-insecure", "--drain-delay", "-1s"], "--drain-delay"),
        (&["serve", "--ateapi-insecure", "--port-extproc", "abc"], "--port-extproc"),
        (&["serve", "--ateapi-insecure", "--parked-request-budget", "5"], "--parked-request-budget"),
        (&["serve", "--ateapi-insecure", "--ateapi-ca-file", "/tmp/ca.pem"], "--ateapi-insecure"),
        (&["serve"], "--ateapi-ca-file"),
        (&["serve", "--bogus"], "--bogus"),
    ];
    for (args, flag) in cases {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("invalid router configuration: "), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?} should name {flag}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn b46_parking_off_with_small_breaker_and_short_drain_starts() {
    let (mut child, line) = start_until(
        ROUTER,
        &[
            "serve",
            "--ateapi-insecure",
            "--ateapi-address",
            "127.0.0.1:1",
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            "--parked-request-max",
            "0",
            "--extproc-max-requests",
            "1",
            "--drain-timeout",
            "1s",
            "--drain-delay",
            "0s",
            "--envoy-admin-address",
            "",
            "--drain-complete-file",
            "",
        ],
        "serving",
    );
    assert!(line.contains("parking off"), "{line}");
    assert_eq!(terminate(&mut child), 0, "SIGTERM exits 0");
}

#[test]
fn second_router_on_a_taken_port_fails_clearly() {
    let base = [
        "serve",
        "--ateapi-insecure",
        "--metrics-listen-addr",
        "127.0.0.1:0",
        "--status-port",
        "0",
        "--drain-delay",
        "0s",
        "--envoy-admin-address",
        "",
        "--drain-complete-file",
        "",
    ];
    let mut first_args = base.to_vec();
    first_args.extend(["--port-extproc", "0"]);
    let (mut first, line) = start_until(ROUTER, &first_args, "serving");
    let port = word_after(&line, "ext_proc on ").rsplit(':').next().unwrap().to_string();
    let mut second_args = base.to_vec();
    second_args.extend(["--port-extproc", &port]);
    let (code, _, err) = run(&second_args);
    assert_ne!(code, 0);
    assert!(err.contains("cannot listen for ext_proc"), "{err}");
    assert_eq!(terminate(&mut first), 0);
}

#[test]
fn sim_binary_serves_and_stops_on_sigterm() {
    let (mut sim, line) = start_until(SIM, &["--listen", "127.0.0.1:0", "--workers", "1"], "listening on");
    assert!(word_after(&line, "listening on ").starts_with("127.0.0.1:"));
    assert_eq!(terminate(&mut sim), 0);
    let out = Command::new(SIM).args(["--unavailable-rate", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--unavailable-rate"));
}

#[test]
fn parkload_points_at_a_running_router_and_reports() {
    let (mut sim, sim_line) =
        start_until(SIM, &["--listen", "127.0.0.1:0", "--workers", "8"], "listening on");
    let sim_addr = word_after(&sim_line, "listening on ").to_string();
    let (mut router, line) = start_until(
        ROUTER,
        &[
            "serve",
            "--ateapi-insecure",
            "--ateapi-address",
            &sim_addr,
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            "--status-port",
            "0",
            "--drain-delay",
            "0s",
            "--envoy-admin-address",
            "",
            "--drain-complete-file",
            "",
        ],
        "serving",
    );
    let target = word_after(&line, "ext_proc on ");
    let out = Command::new(env!("CARGO_BIN_EXE_parkload"))
        .args([
            "--target",
            target,
            "--count",
            "200",
            "--concurrency",
            "8",
            "--actors",
            "demo/actor-{0..3},demo/nope",
            "--json",
            "--progress",
            "0",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    assert!(json.starts_with("{\"requests\":200,"), "{json}");
    assert!(json.contains("\"200 routed\":") && json.contains("\"404 atenet_not_found\":"), "{json}");
    let bad =
        Command::new(env!("CARGO_BIN_EXE_parkload")).args(["--distribution", "bogus"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--distribution"));
    assert_eq!(terminate(&mut router), 0);
    assert_eq!(terminate(&mut sim), 0);
}
