//! An authenticated control plane: TLS, mTLS, server name override, bearer
//! tokens, and credentials rotated on disk without a restart. Certificates
//! are generated at test time with the openssl command.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use atenet_router::cli::config::parse_serve_args;

use atenet_router::router::Router;
use atenet_router::tools::sim::{Answer, Sim, SimConfig, SimTls};
use common::pki::Pki;
use common::*;
use futures::StreamExt;
use parking_lot::Mutex;

/// The simulated control plane over mTLS: `server.pem` for `ateapi.test`,
/// clients must present a certificate `ca1` signed.
fn ateapi_sim(pki: &Pki) -> Sim {
    Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        actors: 0,
        workers: 0,
        tls: Some(SimTls {
            cert_chain: pki.read("server.pem"),
            key: pki.read("server.key"),
            client_ca: Some(pki.read("ca1.pem")),
        }),
        ..SimConfig::default()
    })
    .unwrap()
}

/// `serve` flags for a router on loopback that reaches `sim` with `ca` and
/// the client `bundle`, expecting the name `ateapi.test` when `named`.
fn tls_flags(sim: &Sim, ca: &Path, bundle: &Path, named: bool, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--ateapi-address".into(),
        sim.addr().to_string(),
        "--ateapi-ca-file".into(),
        ca.display().to_string(),
        "--ateapi-client-cert".into(),
        bundle.display().to_string(),
        "--port-extproc".into(),
        "0".into(),
        "--metrics-listen-addr".into(),
        "127.0.0.1:0".into(),
        "--status-port".into(),
        "0".into(),
    ];
    if named {
        args.extend(["--ateapi-server-name".into(), "ateapi.test".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start(args: &[String]) -> (Router, Envoy) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let router = Router::start(&parse_serve_args(&args).unwrap()).unwrap();
    let envoy = Envoy::connect(router.extproc_addr());
    (router, envoy)
}

fn router(sim: &Sim, ca: &Path, bundle: &Path, extra: &[&str]) -> (Router, Envoy) {
    let mut extra = extra.to_vec();
    extra.extend(["--parked-request-retry-interval", "50ms"]);
    start(&tls_flags(sim, ca, bundle, true, &extra))
}

fn stop(router: Router) {
    router.stop(Duration::from_secs(5), &crossbeam_channel::never::<()>());
}

#[test]
fn mtls_with_server_name_override_and_a_rotating_bearer_token() {
    let pki = Pki::new("mtls");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let token = pki.path("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let (router, envoy) = router(
        &sim,
        &pki.path("ca1.pem"),
        &pki.path("client1.bundle"),
        &["--ateapi-token-file", token.to_str().unwrap()],
    );
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    assert_eq!(sim.last_authorization().as_deref(), Some("Bearer first-token"));
    std::fs::write(&token, "second-token\n").unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        routed(&envoy.route_now("demo/a"));
        if sim.last_authorization().as_deref() == Some("Bearer second-token") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "rotated token not picked up");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(router);
}

#[test]
fn server_name_must_match_without_the_override() {
    let pki = Pki::new("name");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let args = tls_flags(
        &sim,
        &pki.path("ca1.pem"),
        &pki.path("client1.bundle"),
        false,
        &["--parked-request-budget", "500ms"],
    );
    let (router, envoy) = start(&args);
    let reply = immediate(&envoy.route_now("demo/a"));
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (503, "actor demo/a unavailable"),
        "127.0.0.1 is not in the certificate"
    );
    stop(router);
}

#[test]
fn rotated_client_certificate_and_ca_are_picked_up_without_restart() {
    let pki = Pki::new("rotate");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    // A client certificate the sim does not trust: every attempt fails.
    let bundle = pki.rotating("live.bundle", "client2.bundle");
    let ca = pki.rotating("live-ca.pem", "ca2.pem");
    let (router, envoy) = router(&sim, &ca, &bundle, &["--parked-request-budget", "500ms"]);
    let reply = immediate(&envoy.route_now("demo/a"));
    assert_eq!(reply.status, 503);
    assert_eq!(reply.details, "atenet_budget_exhausted", "Unavailable parks, then the budget ends");
    std::fs::copy(pki.path("ca1.pem"), &ca).unwrap();
    std::fs::copy(pki.path("client1.bundle"), &bundle).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !envoy.route_now("demo/a").has_request_headers() {
        assert!(std::time::Instant::now() < deadline, "rotated credentials not picked up");
    }
    stop(router);
}

#[test]
fn wrong_ca_parks_then_503_and_the_log_names_the_tls_failure_once() {
    let pki = Pki::new("wrongca");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let flags = tls_flags(
        &sim,
        &pki.path("ca2.pem"),
        &pki.path("client1.bundle"),
        true,
        &[
            "--parked-request-budget",
            "700ms",
            "--parked-request-retry-interval",
            "20ms",
            "--drain-delay",
            "0s",
            "--envoy-admin-address",
            "",
            "--drain-complete-file",
            "",
        ],
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_atenet-router"))
        .arg("serve")
        .args(&flags)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut reader = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = reader.by_ref().map_while(Result::ok).find(|l| l.contains("serving")).unwrap();
    let sink = Arc::clone(&lines);
    let drain = std::thread::spawn(move || reader.map_while(Result::ok).for_each(|l| sink.lock().push(l)));
    let extproc = line.split("ext_proc on ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    let envoy = Envoy::connect(extproc);
    let replies =
        futures::executor::block_on(futures::future::join_all((0..5).map(|_| envoy.route("demo/a"))));
    for reply in &replies {
        let r = immediate(reply);
        assert_eq!((r.status, r.details.as_str()), (503, "atenet_budget_exhausted"));
    }
    assert_eq!(sim.calls("demo/a"), 0, "no call ever reached the control plane");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    drain.join().unwrap();
    let log = lines.lock().clone();
    let tls: Vec<&String> = log.iter().filter(|l| l.contains("ateapi TLS failure")).collect();
    assert_eq!(tls.len(), 1, "logged once, not per request or attempt: {log:#?}");
}

#[test]
fn missing_token_file_is_a_startup_error() {
    let pki = Pki::new("token");
    let out = Command::new(env!("CARGO_BIN_EXE_atenet-router"))
        .args([
            "serve",
            "--ateapi-ca-file",
            pki.path("ca1.pem").to_str().unwrap(),
            "--ateapi-token-file",
            "/nonexistent/token",
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            // A port another process holds would be the first error found.
            "--status-port",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a configuration error (B70)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ateapi-token-file") && err.contains("/nonexistent/token"), "{err}");
    let insecure = Command::new(env!("CARGO_BIN_EXE_atenet-router"))
        .args(["serve", "--ateapi-insecure", "--ateapi-token-file", "/tmp/token"])
        .output()
        .unwrap();
    assert_eq!(insecure.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&insecure.stderr)
        .starts_with("invalid router configuration: --ateapi-token-file"));
}

/// Runs `serve` with TLS flags to `ateapi.test` and extra args; returns
/// (exit code, stderr). For flags the router must refuse at startup.
fn refused_start(pki: &Pki, ca: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_atenet-router"))
        .args(["serve", "--ateapi-address", "127.0.0.1:1", "--ateapi-ca-file", ca.to_str().unwrap()])
        .args(["--port-extproc", "0", "--metrics-listen-addr", "127.0.0.1:0", "--status-port", "0"])
        .args(extra)
        .current_dir(&pki.dir)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn b60_bad_credential_files_are_clear_startup_errors_never_panics() {
    let pki = Pki::new("badfiles");
    pki.openssl(&["x509", "-in", "ca1.pem", "-outform", "der", "-out", "ca1.der"]);
    let ca = pki.read("ca1.pem");
    std::fs::write(pki.path("empty.pem"), b"").unwrap();
    std::fs::write(pki.path("half.pem"), &ca[..ca.len() / 2]).unwrap();
    std::fs::write(pki.path("cert-only.bundle"), pki.read("client1.pem")).unwrap();
    std::fs::write(pki.path("tab.token"), "abc\tdef\n").unwrap();
    std::fs::write(pki.path("accent.token"), "t\u{f6}ken-s3cr3t\n").unwrap();
    // B60: a token gRPC could not send; B71: a FIFO is never read.
    std::fs::write(pki.path("long.token"), format!("s3cr3t{}\n", "a".repeat(8187))).unwrap();
    assert!(Command::new("mkfifo").arg(pki.path("bundle.fifo")).status().unwrap().success());
    // B60: a key under a CERTIFICATE label, an encrypted key.
    let key = String::from_utf8(pki.read("client1.key")).unwrap();
    std::fs::write(pki.path("key-as-cert.pem"), key.replace("PRIVATE KEY", "CERTIFICATE")).unwrap();
    pki.openssl(&[
        "pkcs8",
        "-topk8",
        "-in",
        "client1.key",
        "-out",
        "client1.enc.key",
        "-passout",
        "pass:s3cr3t",
        "-v2",
        "aes-256-cbc",
    ]);
    std::fs::write(
        pki.path("encrypted.bundle"),
        [pki.read("client1.pem"), pki.read("client1.enc.key")].concat(),
    )
    .unwrap();
    // B60: a key that is not the certificate's.
    std::fs::write(pki.path("mismatch.bundle"), [pki.read("client1.pem"), pki.read("client2.key")].concat())
        .unwrap();
    let good_ca = pki.path("ca1.pem");
    let cases: Vec<(PathBuf, Vec<String>, &str, &str)> = vec![
        (
            good_ca.clone(),
            vec!["--ateapi-client-cert".into(), pki.path("mismatch.bundle").display().to_string()],
            "--ateapi-client-cert",
            "the private key does not belong to the bundle's first certificate",
        ),
        (pki.path("ca1.der"), vec![], "--ateapi-ca-file", "not a PEM file"),
        (pki.path("empty.pem"), vec![], "--ateapi-ca-file", "no CERTIFICATE block"),
        (pki.path("half.pem"), vec![], "--ateapi-ca-file", "no end marker"),
        (
            good_ca.clone(),
            vec!["--ateapi-client-cert".into(), pki.path("cert-only.bundle").display().to_string()],
            "--ateapi-client-cert",
            "no PRIVATE KEY block",
        ),
        (
            good_ca.clone(),
            vec!["--ateapi-token-file".into(), pki.path("tab.token").display().to_string()],
            "--ateapi-token-file",
            "whitespace inside the token",
        ),
        (
            good_ca.clone(),
            vec!["--ateapi-token-file".into(), pki.path("accent.token").display().to_string()],
            "--ateapi-token-file",
            "not allowed in a bearer token",
        ),
        (
            good_ca.clone(),
            vec!["--ateapi-token-file".into(), pki.path("long.token").display().to_string()],
            "--ateapi-token-file",
            "the token is 8193 bytes, over the 8192",
        ),
        (
            good_ca.clone(),
            vec!["--ateapi-client-cert".into(), pki.path("bundle.fifo").display().to_string()],
            "--ateapi-client-cert",
            "a FIFO, not a regular file",
        ),
        (pki.path("key-as-cert.pem"), vec![], "--ateapi-ca-file", "does not hold an X.509 certificate"),
        (
            good_ca,
            vec!["--ateapi-client-cert".into(), pki.path("encrypted.bundle").display().to_string()],
            "--ateapi-client-cert",
            "the private key is encrypted",
        ),
    ];
    for (ca, extra, flag, why) in cases {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (code, err) = refused_start(&pki, &ca, &extra);
        assert_eq!(code, 2, "a configuration error (B70): {flag} {why}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{flag} {why}: {err}");
        assert!(!err.contains("panicked") && !err.contains("s3cr3t"), "{err}");
    }
}

/// The router binary with its stderr collected.
fn spawn_tls_router(args: &[String]) -> (std::process::Child, std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_atenet-router"))
        .arg("serve")
        .args(args)
        .args(["--drain-delay", "0s", "--envoy-admin-address", "", "--drain-complete-file", ""])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = reader.by_ref().map_while(Result::ok).find(|l| l.contains("serving")).expect("router starts");
    let lines = Arc::new(Mutex::new(vec![line.clone()]));
    let sink = Arc::clone(&lines);
    std::thread::spawn(move || reader.map_while(Result::ok).for_each(|l| sink.lock().push(l)));
    let extproc = line.split("ext_proc on ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    (child, extproc, lines)
}

fn terminate(mut child: std::process::Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn b60_a_bad_rotation_keeps_the_last_good_credentials_and_is_logged_once() {
    let pki = Pki::new("badrotation");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let ca = pki.rotating("live-ca.pem", "ca1.pem");
    let args = tls_flags(&sim, &ca, &pki.path("client1.bundle"), true, &[]);
    let (child, extproc, log) = spawn_tls_router(&args);
    let envoy = Envoy::connect(extproc);
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    // A rotation caught half-written.
    let good = pki.read("ca1.pem");
    std::fs::write(&ca, &good[..good.len() / 2]).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !log.lock().iter().any(|l| l.contains("not reloaded")) {
        assert!(std::time::Instant::now() < deadline, "the bad CA is reported: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Three more checks of the same bad file.
    std::thread::sleep(Duration::from_millis(3500));
    let reports: Vec<String> = log.lock().iter().filter(|l| l.contains("not reloaded")).cloned().collect();
    assert_eq!(reports.len(), 1, "logged once, not every second: {reports:#?}");
    assert!(reports[0].contains("--ateapi-ca-file") && reports[0].contains("no end marker"), "{reports:?}");
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None, "the last good credentials stay");
    std::fs::write(&ca, [good.clone(), b"\n".to_vec()].concat()).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !log.lock().iter().any(|l| l.contains("reloaded") && !l.contains("not reloaded")) {
        assert!(std::time::Instant::now() < deadline, "the good CA is picked up: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    terminate(child);
}

#[test]
fn b54_the_token_never_appears_in_logs_metrics_or_the_status_page() {
    let pki = Pki::new("secret");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    sim.script(
        "demo/down",
        vec![Answer::error(atenet_router::actor::resume::Code::Unauthenticated, "bad token")],
    );
    const TOKEN: &str = "s3cr3t-t0ken-Zq9";
    let token = pki.path("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let status_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut args = tls_flags(&sim, &pki.path("ca1.pem"), &pki.path("client1.bundle"), true, &[]);
    let status_at = args.iter().position(|a| a == "--status-port").unwrap() + 1;
    args[status_at] = status_port.clone();
    args.extend([
        "--ateapi-token-file".into(),
        token.display().to_string(),
        "--log-level".into(),
        "debug".into(),
    ]);
    let (child, extproc, log) = spawn_tls_router(&args);
    let envoy = Envoy::connect(extproc);
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    assert_eq!(
        sim.last_authorization().as_deref(),
        Some(format!("Bearer {TOKEN}").as_str()),
        "the token is sent"
    );
    assert_eq!(immediate(&envoy.route_now("demo/down")).status, 401);
    let metrics_addr =
        log.lock()[0].split("metrics on http://").nth(1).unwrap().split('/').next().unwrap().to_string();
    let metrics = http_get(metrics_addr.parse().unwrap(), "/metrics").1;
    let status_addr: std::net::SocketAddr = format!("127.0.0.1:{status_port}").parse().unwrap();
    let (code, page) = http_get(status_addr, "/statusz");
    assert_eq!(code, 200);
    let json = http_get(status_addr, "/statusz?format=json").1;
    assert!(json.contains("--ateapi-token-file"), "the page shows the path: {json}");
    terminate(child);
    let log = log.lock().join("\n");
    assert!(log.contains("DEBUG"), "debug logging was on");
    for (name, text) in [("log", &log), ("/metrics", &metrics), ("/statusz", &page), ("/statusz JSON", &json)]
    {
        assert!(!text.contains(TOKEN), "the token appears in {name}");
    }
}

/// B60, B71: a rotated token too long for gRPC to send, then a FIFO in the
/// token file's place, keep the last good token and are each logged; the
/// watcher never blocks on the FIFO, so SIGTERM ends the router at once.
#[test]
fn b60_b71_an_oversized_token_or_a_fifo_at_rotation_keeps_the_last_good_token() {
    let pki = Pki::new("fiforotation");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let token = pki.path("token");
    std::fs::write(&token, "good-token\n").unwrap();
    let args = tls_flags(
        &sim,
        &pki.path("ca1.pem"),
        &pki.path("client1.bundle"),
        true,
        &["--ateapi-token-file", token.to_str().unwrap()],
    );
    let (child, extproc, log) = spawn_tls_router(&args);
    // Killed if the test fails, so no router outlives it.
    struct Guard(std::process::Child);
    impl Drop for Guard {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let mut child = Guard(child);
    let envoy = Envoy::connect(extproc);
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    let reported = |why: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        while !log.lock().iter().any(|l| l.contains("not reloaded") && l.contains(why)) {
            assert!(std::time::Instant::now() < deadline, "{why} is reported: {:#?}", log.lock());
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
        assert_eq!(
            sim.last_authorization().as_deref(),
            Some("Bearer good-token"),
            "the last good token stays"
        );
    };
    std::fs::write(&token, "a".repeat(20_000)).unwrap();
    reported("the token is 20000 bytes, over the 8192");
    // Swapped in at once, as a rotation would.
    let fifo = pki.path("token.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::rename(&fifo, &token).unwrap();
    reported("a FIFO, not a regular file");
    assert!(Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.0.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "SIGTERM did not end the router: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

/// B60: the key formats gRPC loads besides PKCS#8 work end to end: SEC1
/// (`EC PRIVATE KEY`) and PKCS#1 (`RSA PRIVATE KEY`).
#[test]
fn b60_sec1_and_pkcs1_client_keys_work() {
    let pki = Pki::new("keyformats");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    pki.openssl(&["ec", "-in", "client1.key", "-out", "client1.sec1.key"]);
    pki.openssl(&["genrsa", "-traditional", "-out", "rsa.key", "2048"]);
    pki.openssl(&["req", "-new", "-key", "rsa.key", "-out", "rsa.csr", "-subj", "/CN=rsa"]);
    pki.openssl(&[
        "x509",
        "-req",
        "-in",
        "rsa.csr",
        "-CA",
        "ca1.pem",
        "-CAkey",
        "ca1.key",
        "-CAcreateserial",
        "-out",
        "rsa.pem",
        "-days",
        "2",
        "-extfile",
        "client1.ext",
    ]);
    for (cert, key, label) in
        [("client1.pem", "client1.sec1.key", "EC PRIVATE KEY"), ("rsa.pem", "rsa.key", "RSA PRIVATE KEY")]
    {
        let key = pki.read(key);
        assert!(String::from_utf8_lossy(&key).starts_with(&format!("-----BEGIN {label}-----")));
        let bundle = pki.path(&format!("{label}.bundle"));
        std::fs::write(&bundle, [pki.read(cert), key].concat()).unwrap();
        let (router, envoy) = router(&sim, &pki.path("ca1.pem"), &bundle, &[]);
        assert_eq!(routed(&envoy.route_now("demo/a")).0, None, "{label}");
        stop(router);
    }
}

/// A control plane that accepts TCP and never finishes TLS (B82): the call
/// never reaches it, so the flight does not wait on it past the budget, and
/// a second request finds the channel trying again within its own budget.
/// Before B82 each request was held for gRPC's 20 s connect timeout.
#[test]
fn b82_a_control_plane_that_never_finishes_tls_gets_the_verdict_at_the_budget() {
    let pki = Pki::new("silent-tls");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(Mutex::new(Vec::new()));
    {
        let accepted = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                // Held open, never read from or written to.
                accepted.lock().push(stream);
            }
        });
    }
    let args: Vec<String> = [
        "--ateapi-address",
        &addr.to_string(),
        "--ateapi-ca-file",
        pki.path("ca1.pem").to_str().unwrap(),
        "--port-extproc",
        "0",
        "--metrics-listen-addr",
        "127.0.0.1:0",
        "--status-port",
        "0",
        "--parked-request-budget",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (router, envoy) = start(&args);
    for _ in 0..2 {
        // Five budgets of patience: a router that waits for gRPC's 20 s
        // connection attempt leaves this client with no answer.
        let mut stream = envoy.open_within(Duration::from_secs(10));
        let reply = futures::executor::block_on(async {
            stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
            stream.rx.next().await
        });
        let reply = reply.expect("a verdict within five budgets").expect("a verdict, not a deadline");
        let answer = immediate(&reply);
        assert_eq!(answer.status, 503, "{answer:?}");
        assert_eq!(answer.headers["x-atenet-reason"], "atenet_budget_exhausted");
        stream.tx.cancel();
    }
    assert!(!accepted.lock().is_empty(), "the router did connect, and got no handshake");
    stop(router);
}

/// B60: a rotated client bundle whose key belongs to another certificate is
/// refused and logged, and the last good bundle stays in use.
#[test]
fn b60_a_rotated_key_that_does_not_match_is_refused_and_the_last_good_bundle_stays() {
    let pki = Pki::new("mismatchrotation");
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let bundle = pki.rotating("live.bundle", "client1.bundle");
    let args = tls_flags(&sim, &pki.path("ca1.pem"), &bundle, true, &[]);
    let (child, extproc, log) = spawn_tls_router(&args);
    let envoy = Envoy::connect(extproc);
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    std::fs::write(&bundle, [pki.read("client1.pem"), pki.read("client2.key")].concat()).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !log.lock().iter().any(|l| l.contains("not reloaded")) {
        assert!(std::time::Instant::now() < deadline, "the mismatch is reported: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = log.lock().iter().find(|l| l.contains("not reloaded")).cloned().unwrap();
    assert!(
        report.contains("--ateapi-client-cert")
            && report.contains("does not belong to the bundle's first certificate"),
        "{report}"
    );
    // A new connection (a new channel would be built on a reload) still
    // authenticates with the last good bundle.
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None, "the last good bundle stays");
    terminate(child);
}

/// Client certificates from `ca1` out of their dates (`expired`: 2020 to
/// 2021; `future`: 2099 to 2100) and within them (`current`: to
/// 2099-12-31T23:59:59Z, 4102444799; `current2`: to 2099-06-01T00:00:00Z,
/// 4083955200).
fn dated_clients(pki: &Pki) {
    let client = "extendedKeyUsage=clientAuth";
    pki.issue_dated("expired", "ca1", client, "20200101000000Z", "20210101000000Z");
    pki.issue_dated("future", "ca1", client, "20990101000000Z", "21000101000000Z");
    pki.issue_dated("current", "ca1", client, "20200101000000Z", "20991231235959Z");
    pki.issue_dated("current2", "ca1", client, "20200101000000Z", "20990601000000Z");
}

#[test]
fn b106_an_expired_or_not_yet_valid_client_certificate_exits_2_at_startup() {
    let pki = Pki::new("datedstart");
    dated_clients(&pki);
    for (name, said) in [
        ("expired", "its first certificate expired on Jan  1 00:00:00 2021 GMT"),
        ("future", "its first certificate is not valid yet: not before Jan  1 00:00:00 2099 GMT"),
    ] {
        let bundle = pki.path(&format!("{name}.bundle")).display().to_string();
        let (code, err) = common::process::run_refused(
            Command::new(env!("CARGO_BIN_EXE_atenet-router"))
                .args(["serve", "--ateapi-address", "127.0.0.1:1", "--ateapi-client-cert", &bundle])
                .args(["--ateapi-ca-file", pki.path("ca1.pem").to_str().unwrap(), "--port-extproc", "0"])
                .args(["--metrics-listen-addr", "127.0.0.1:0", "--status-port", "0"]),
        );
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(&format!("--ateapi-client-cert {bundle}: {said}")), "{name}: {err}");
    }
}

#[test]
fn b106_a_rotated_client_certificate_out_of_its_dates_keeps_the_last_good_one() {
    let pki = Pki::new("datedrotation");
    dated_clients(&pki);
    let sim = ateapi_sim(&pki);
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let bundle = pki.rotating("live.bundle", "current.bundle");
    let args = tls_flags(&sim, &pki.path("ca1.pem"), &bundle, true, &[]);
    let (child, extproc, log) = spawn_tls_router(&args);
    let metrics_addr =
        log.lock()[0].split("metrics on http://").nth(1).unwrap().split('/').next().unwrap().to_string();
    let expiry = || {
        Metrics(http_get(metrics_addr.parse().unwrap(), "/metrics").1)
            .value("atenet_router_certificate_expiry_timestamp_seconds", &[("certificate", "ateapi_client")])
    };
    let envoy = Envoy::connect(extproc);
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None);
    assert_eq!(expiry(), 4_102_444_799.0, "the notAfter of the client certificate in use");
    for (name, said) in [("expired", "expired on Jan  1 00:00:00 2021 GMT"), ("future", "not valid yet")] {
        pki.replace("live.bundle", &format!("{name}.bundle"));
        let refusal = |l: &String| l.contains("ateapi credentials not reloaded") && l.contains(said);
        let deadline = std::time::Instant::now() + PATIENCE;
        while !log.lock().iter().any(refusal) {
            assert!(std::time::Instant::now() < deadline, "the refusal of {name}: {:#?}", log.lock());
            std::thread::sleep(Duration::from_millis(50));
        }
        let line = log.lock().iter().find(|l| refusal(l)).cloned().unwrap();
        assert!(line.contains(" ERROR ") && line.contains("--ateapi-client-cert"), "{line}");
        assert_eq!(routed(&envoy.route_now("demo/a")).0, None, "{name}: the last good certificate stays");
        assert_eq!(expiry(), 4_102_444_799.0, "{name}: so does its notAfter");
    }
    pki.replace("live.bundle", "current2.bundle");
    let deadline = std::time::Instant::now() + PATIENCE;
    while expiry() != 4_083_955_200.0 {
        assert!(std::time::Instant::now() < deadline, "the valid rotation's notAfter: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(routed(&envoy.route_now("demo/a")).0, None, "served with the new certificate");
    terminate(child);
}
