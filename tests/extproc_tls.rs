//! ext_proc over TLS (B86), with certificates made by the openssl command:
//! a client CA lets in only clients with a certificate it signed; a
//! rotated server certificate is what new handshakes get, without a
//! restart; bad files are refused at startup and at rotation.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::cli::config::parse_serve_args;
use atenet_router::proto::health::HealthCheckRequest;
use atenet_router::proto::{EXT_PROC_PROCESS, HEALTH_CHECK};
use atenet_router::router::Router;
use atenet_router::tools::sim::Answer;
use common::pki::Pki;
use common::process::{eventually_within, router_args, run_refused, spawn_router, ROUTER_BIN};
use common::*;
use futures::{SinkExt, StreamExt};
use grpcio::{CallOption, ChannelBuilder, ChannelCredentialsBuilder, Client, EnvBuilder, WriteFlags};
use openssl::ssl::{SslConnector, SslMethod};
use openssl::x509::X509;

/// `ca1` and `ca2`; the router's certificates `router` and `router2` (new
/// key, new serial) for `router.test` and 127.0.0.1, from `ca1`; clients
/// `client1` (from `ca1`) and `client2` (from `ca2`).
fn pki(name: &str) -> Pki {
    let pki = Pki::new(name);
    for router in ["router", "router2"] {
        pki.issue(router, "ca1", "subjectAltName=DNS:router.test,IP:127.0.0.1");
    }
    pki
}

/// The ext_proc flags of a router that presents `tls.crt`/`tls.key`, with
/// `ca` as its client CA when given.
fn tls_flags(pki: &Pki, client_ca: Option<&str>) -> Vec<String> {
    let mut flags = vec![
        "--extproc-cert-file".to_string(),
        pki.path("tls.crt").display().to_string(),
        "--extproc-key-file".into(),
        pki.path("tls.key").display().to_string(),
    ];
    if let Some(ca) = client_ca {
        flags.extend(["--extproc-client-ca-file".into(), pki.path(ca).display().to_string()]);
    }
    flags
}

/// A gRPC client to the router over TLS, verifying it as `router.test`
/// against `ca1`, presenting `client` (a `.pem` and `.key` pair) if given.
fn client(pki: &Pki, addr: SocketAddr, client: Option<&str>) -> Client {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("test-tls").build());
    let mut creds = ChannelCredentialsBuilder::new().root_cert(pki.read("ca1.pem"));
    if let Some(name) = client {
        creds = creds.cert(pki.read(&format!("{name}.pem")), pki.read(&format!("{name}.key")));
    }
    let channel = ChannelBuilder::new(env)
        .override_ssl_target("router.test")
        .set_credentials(creds.build())
        .connect(&addr.to_string());
    Client::new(channel)
}

/// `Check("")`: Ok with the status, or the failure's text.
fn check(client: &Client) -> Result<i32, String> {
    let options = CallOption::default().timeout(Duration::from_secs(5));
    client
        .unary_call(&HEALTH_CHECK, &HealthCheckRequest::new(), options)
        .map(|r| r.status.value())
        .map_err(|e| e.to_string())
}

/// The serial of the certificate a new TLS handshake with the router
/// presents (ALPN h2, as gRPC and Envoy offer).
fn presented_serial(pki: &Pki, addr: SocketAddr) -> String {
    let mut connector = SslConnector::builder(SslMethod::tls_client()).unwrap();
    connector.set_ca_file(pki.path("ca1.pem")).unwrap();
    connector.set_alpn_protos(b"\x02h2").unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    let stream = connector.build().connect("router.test", tcp).expect("handshake");
    let serial = stream.ssl().peer_certificate().expect("a certificate").serial_number().to_bn().unwrap();
    serial.to_dec_str().unwrap().to_string()
}

fn serial_of(pki: &Pki, file: &str) -> String {
    let cert = X509::from_pem(&pki.read(file)).unwrap();
    cert.serial_number().to_bn().unwrap().to_dec_str().unwrap().to_string()
}

#[test]
fn b86_with_a_client_ca_only_clients_with_a_certificate_it_signed_get_in() {
    let pki = pki("clientca");
    pki.rotating("tls.crt", "router.pem");
    pki.rotating("tls.key", "router.key");
    let sim = empty_sim();
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
    let address = sim.addr().to_string();
    let mut args: Vec<String> = [
        "--ateapi-insecure",
        "--ateapi-address",
        &address,
        "--port-extproc",
        "0",
        "--metrics-listen-addr",
        "127.0.0.1:0",
        "--status-port",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(tls_flags(&pki, Some("ca1.pem")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let router = Router::start(&parse_serve_args(&args).unwrap()).unwrap();
    let addr = router.extproc_addr();

    let started = Instant::now();
    let refused = check(&client(&pki, addr, None));
    let refusal = started.elapsed();
    assert!(refused.is_err(), "no client certificate: refused, got {refused:?}");
    let other_ca = check(&client(&pki, addr, Some("client2")));
    assert!(other_ca.is_err(), "a certificate another CA signed: refused, got {other_ca:?}");
    let plaintext = Envoy::connect(addr);
    let plain = futures::executor::block_on(async {
        let mut stream = plaintext.open_within(Duration::from_secs(5));
        let _ =
            stream.tx.send((headers_request(&[("ate-target-actor", "demo/a")]), WriteFlags::default())).await;
        stream.rx.next().await
    });
    assert!(!matches!(plain, Some(Ok(_))), "plaintext gets nothing: {plain:?}");

    let admitted = client(&pki, addr, Some("client1"));
    assert_eq!(check(&admitted), Ok(1), "SERVING to a client ca1 signed");
    let reply = futures::executor::block_on(async {
        let (mut tx, mut rx) = admitted.duplex_streaming(&EXT_PROC_PROCESS, CallOption::default()).unwrap();
        tx.send((headers_request(&[("ate-target-actor", "demo/a")]), WriteFlags::default())).await.unwrap();
        rx.next().await.unwrap().unwrap()
    });
    assert_eq!(routed(&reply).1, "10.0.0.1:443", "and routed over TLS");
    assert_eq!(sim.calls("demo/a"), 1, "only the admitted client's request reached the control plane");
    println!("measured: a client without a certificate was refused in {refusal:?}");
    router.stop(Duration::from_secs(5), &crossbeam_channel::never::<()>());
}

#[test]
fn b86_a_rotated_certificate_is_presented_to_new_connections_without_a_restart() {
    let pki = pki("rotation");
    pki.rotating("tls.crt", "router.pem");
    pki.rotating("tls.key", "router.key");
    let sim = empty_sim();
    let flags = tls_flags(&pki, None);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let router = spawn_router(&router_args(&sim.addr().to_string(), &flags));
    let (first, second) = (serial_of(&pki, "router.pem"), serial_of(&pki, "router2.pem"));
    assert_ne!(first, second);
    assert_eq!(presented_serial(&pki, router.extproc), first);
    // An established connection keeps its session; new ones get the new
    // certificate once the files are replaced (key first: until the
    // certificate follows, the pair does not match and is not used).
    let kept = client(&pki, router.extproc, None);
    assert_eq!(check(&kept), Ok(1));
    let rotated = Instant::now();
    pki.replace("tls.key", "router2.key");
    pki.replace("tls.crt", "router2.pem");
    eventually_within(PATIENCE, "the new certificate on a new handshake", || {
        presented_serial(&pki, router.extproc) == second
    });
    let latency = rotated.elapsed();
    assert_eq!(check(&kept), Ok(1), "the open connection still serves");
    assert_eq!(check(&client(&pki, router.extproc, None)), Ok(1), "a new gRPC connection too");
    // A key that is not the certificate's: refused, logged once, and the
    // last good pair stays.
    pki.replace("tls.key", "client2.key");
    eventually_within(PATIENCE, "the refusal in the log", || {
        router.process.log.lock().iter().any(|l| l.contains("ext_proc TLS credentials not reloaded"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(
        log.contains("--extproc-key-file") && log.contains("does not belong to --extproc-cert-file"),
        "{log}"
    );
    assert_eq!(presented_serial(&pki, router.extproc), second, "the last good certificate stays");
    assert_eq!(check(&client(&pki, router.extproc, None)), Ok(1));
    println!(
        "measured: a rotated certificate reached new handshakes {latency:?} after the files were replaced"
    );
}

#[test]
fn b86_bad_tls_files_and_plaintext_off_the_loopback_exit_2() {
    let pki = pki("startup");
    std::fs::write(pki.path("mismatch.key"), pki.read("router2.key")).unwrap();
    let run = |extra: &[String]| {
        let out = std::process::Command::new(ROUTER_BIN)
            .args([
                "serve",
                "--ateapi-insecure",
                "--port-extproc",
                "0",
                "--metrics-listen-addr",
                "127.0.0.1:0",
            ])
            .args(["--status-port", "0"])
            .args(extra)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let flags = |cert: &str, key: &str| -> Vec<String> {
        vec![
            "--extproc-cert-file".into(),
            pki.path(cert).display().to_string(),
            "--extproc-key-file".into(),
            pki.path(key).display().to_string(),
        ]
    };
    for (extra, said) in [
        (flags("router.pem", "mismatch.key"), "does not belong to --extproc-cert-file"),
        (flags("router.pem", "missing.key"), "--extproc-key-file"),
        (flags("router.key", "router.key"), "no CERTIFICATE block"),
        (vec!["--extproc-address".into(), "0.0.0.0".into()], "--extproc-address 0.0.0.0 is not loopback"),
    ] {
        let (code, err) = run(&extra);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(err.contains(said), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The router's name, as [`pki`] gives it.
const ROUTER_NAMES: &str = "subjectAltName=DNS:router.test,IP:127.0.0.1";

/// Router certificates from `ca1` out of their dates (`expired`: 2020 to
/// 2021; `future`: 2099 to 2100) and within them (`current`: to
/// 2099-12-31T23:59:59Z, 4102444799; `current2`: to 2099-06-01T00:00:00Z,
/// 4083955200).
fn dated(pki: &Pki) {
    pki.issue_dated("expired", "ca1", ROUTER_NAMES, "20200101000000Z", "20210101000000Z");
    pki.issue_dated("future", "ca1", ROUTER_NAMES, "20990101000000Z", "21000101000000Z");
    pki.issue_dated("current", "ca1", ROUTER_NAMES, "20200101000000Z", "20991231235959Z");
    pki.issue_dated("current2", "ca1", ROUTER_NAMES, "20200101000000Z", "20990601000000Z");
}

fn expiry_gauge(router: &common::process::RouterProcess) -> f64 {
    Metrics(http_get(router.metrics, "/metrics").1)
        .value("atenet_router_certificate_expiry_timestamp_seconds", &[("certificate", "extproc")])
}

#[test]
fn b106_an_expired_or_not_yet_valid_certificate_exits_2_at_startup() {
    let pki = pki("dates-startup");
    dated(&pki);
    for (name, said) in [
        ("expired", "its first certificate expired on Jan  1 00:00:00 2021 GMT"),
        ("future", "its first certificate is not valid yet: not before Jan  1 00:00:00 2099 GMT"),
    ] {
        let (code, err) = run_refused(
            std::process::Command::new(ROUTER_BIN)
                .args(router_args("127.0.0.1:1", &[]))
                .args(["--extproc-cert-file", pki.path(&format!("{name}.pem")).to_str().unwrap()])
                .args(["--extproc-key-file", pki.path(&format!("{name}.key")).to_str().unwrap()]),
        );
        assert_eq!(code, Some(2), "{name}: {err}");
        let flag = format!("--extproc-cert-file {}: ", pki.path(&format!("{name}.pem")).display());
        assert!(err.contains(&flag) && err.contains(said), "{name}: {err}");
        assert!(!err.contains("serving"), "{name}: {err}");
    }
}

#[test]
fn b106_a_rotation_to_a_certificate_out_of_its_dates_keeps_the_last_good_one() {
    let pki = pki("dates-rotation");
    dated(&pki);
    pki.rotating("tls.crt", "current.pem");
    pki.rotating("tls.key", "current.key");
    let sim = empty_sim();
    let flags = tls_flags(&pki, None);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let router = spawn_router(&router_args(&sim.addr().to_string(), &flags));
    let current = serial_of(&pki, "current.pem");
    assert_eq!(presented_serial(&pki, router.extproc), current);
    assert_eq!(expiry_gauge(&router), 4_102_444_799.0, "the notAfter of the certificate in use");
    for (name, said) in [("expired", "expired on Jan  1 00:00:00 2021 GMT"), ("future", "not valid yet")] {
        pki.replace("tls.key", &format!("{name}.key"));
        pki.replace("tls.crt", &format!("{name}.pem"));
        let refusal = |l: &String| l.contains("ext_proc TLS credentials not reloaded") && l.contains(said);
        eventually_within(PATIENCE, &format!("the refusal of {name}.pem in the log"), || {
            router.process.log.lock().iter().any(refusal)
        });
        let line = router.process.log.lock().iter().find(|l| refusal(l)).cloned().unwrap();
        assert!(line.contains(" ERROR ") && line.contains("--extproc-cert-file"), "{line}");
        // New connections, each a handshake of its own: the last good
        // certificate, which their CA and clock accept.
        for _ in 0..5 {
            assert_eq!(presented_serial(&pki, router.extproc), current, "{name}: the last good certificate");
            assert_eq!(check(&client(&pki, router.extproc, None)), Ok(1), "{name}: a new gRPC connection");
        }
        assert_eq!(expiry_gauge(&router), 4_102_444_799.0, "{name}: the notAfter of the one in use");
    }
    pki.replace("tls.key", "current2.key");
    pki.replace("tls.crt", "current2.pem");
    let next = serial_of(&pki, "current2.pem");
    eventually_within(PATIENCE, "the valid rotation on a new handshake", || {
        presented_serial(&pki, router.extproc) == next
    });
    assert_eq!(expiry_gauge(&router), 4_083_955_200.0, "the gauge follows the certificate in use");
}
