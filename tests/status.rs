//! The status page (B42): JSON over HTTP, and the HTML rendered by a real
//! headless browser while requests are parked.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

mod common;

use std::process::Command;

use atenet_router::ateapi::resume::Code;
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;

fn status(stack: &Stack, path: &str) -> (u16, String) {
    http_get(stack.router().status_addr().expect("status page enabled"), path)
}

fn park_three(
    stack: &Stack,
    actor: &'static str,
) -> std::thread::JoinHandle<Vec<atenet_router::proto::external_processor::ProcessingResponse>> {
    stack.sim.script(actor, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = stack.envoy.clone();
    let handle =
        std::thread::spawn(move || block_on(futures::future::join_all((0..3).map(|_| envoy.route(actor)))));
    stack.eventually("three parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 3.0);
    handle
}

fn with_status_port() -> Stack {
    // Port 0 for the status page is "disabled"; pick a free one.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    // Requests stay parked until a test answers them, however slowly a
    // browser starts: a budget nothing here uses up.
    Stack::start_with(
        &[
            "--parked-request-retry-interval",
            "20ms",
            "--parked-request-max",
            "50",
            "--parked-request-budget",
            "60s",
        ],
        &port,
    )
}

#[test]
fn b42_json_shows_parking_and_parked_actors_and_no_secrets() {
    let stack = with_status_port();
    stack.sim.script("demo/ok", vec![Answer::ok("10.0.0.1", false)]);
    let secret = headers_request(&[
        (":method", "GET"),
        (":path", "/private/data?token=s3cr3t-token"),
        ("authorization", "Bearer s3cr3t-bearer"),
        ("cookie", "session=s3cr3t-cookie"),
        ("ate-target-actor", "demo/ok"),
    ]);
    routed(&block_on(stack.envoy.exchange(secret)));
    let parked = park_three(&stack, "demo/hot");
    let (code, json) = status(&stack, "/statusz?format=json");
    assert_eq!(code, 200);
    assert!(
        json.contains("\"parking\":{\"enabled\":true,\"active\":3,\"max_parked\":50,\"max_wait\":\"1m0s\"}"),
        "{json}"
    );
    assert!(json.contains("\"actor\":\"demo/hot\",\"waiting\":3"), "{json}");
    assert!(json.contains("\"last_code\":\"ResourceExhausted\""));
    assert!(json.contains("\"path\":\"/private/data\""), "path kept without its query");
    assert!(!json.contains("s3cr3t"), "B42: no secret ever appears: {json}");
    let (_, html) = status(&stack, "/statusz");
    assert!(html.contains("<title>atenet Router Status</title>"));
    assert!(!html.contains("s3cr3t"));
    stack.sim.script("demo/hot", vec![Answer::ok("10.0.0.2", true)]);
    parked.join().unwrap();
    stack.assert_quiescent();
    let (_, json) = status(&stack, "/statusz?format=json");
    assert!(json.contains("\"active\":0") && json.contains("\"parked_actors\":[]"), "{json}");
}

#[test]
fn b42_accept_header_selects_json() {
    let stack = with_status_port();
    let addr = stack.router().status_addr().unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    write!(stream, "GET /statusz HTTP/1.0\r\nAccept: application/json\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.contains("application/json") && response.contains("\"parking\":{"), "{response}");
}

/// Renders the page in headless Chromium (Debian `chromium`, installed by
/// `make deps`) while three requests are parked.
#[test]
fn b42_html_renders_in_a_real_browser_with_live_parking_numbers() {
    let stack = with_status_port();
    let parked = park_three(&stack, "demo/browser");
    let url = format!("http://{}/statusz", stack.router().status_addr().unwrap());
    let profile = std::env::temp_dir().join(format!("atenet-chromium-{}", std::process::id()));
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--user-data-dir={}", profile.display()),
            "--virtual-time-budget=1000",
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("chromium is installed (make deps)");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("<title>atenet Router Status</title>"), "{dom}");
    assert!(dom.contains("Request Parking"));
    assert!(
        dom.contains("<span id=\"parking-active\">3</span> / <span id=\"parking-max\">50</span>"),
        "{dom}"
    );
    assert!(dom.contains("<td>demo/browser</td><td>3</td>"), "parked actor row: {dom}");
    stack.sim.script("demo/browser", vec![Answer::ok("10.0.0.2", true)]);
    parked.join().unwrap();
}
