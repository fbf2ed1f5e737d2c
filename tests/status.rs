//! The status page (B42): JSON over HTTP, and the HTML rendered by a real
//! headless browser while requests are parked.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::process::Command;
use std::time::Instant;

use atenet_router::actor::resume::Code;
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
        json.contains(
            "\"parking\":{\"enabled\":true,\"active\":3,\"active_by_band\":{\"sheddable\":0,\"standard\":3,\
             \"critical\":0},\"max_parked\":50,\"max_wait\":\"1m0s\"}"
        ),
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
    assert!(
        dom.contains(
            "<td data-label=\"actor\">demo/browser</td><td class=\"n\" data-label=\"waiting\">3</td>"
        ),
        "parked actor row: {dom}"
    );
    stack.sim.script("demo/browser", vec![Answer::ok("10.0.0.2", true)]);
    parked.join().unwrap();
}

/// The `{...}` of the entry for `actor` in the JSON list `list`.
fn entry<'a>(json: &'a str, list: &str, actor: &str) -> &'a str {
    let start = json.find(&format!("\"{list}\":[")).unwrap_or_else(|| panic!("no {list}: {json}"));
    let items = &json[start..];
    let items = &items[..items.find(']').expect("a list ends")];
    let at = items
        .find(&format!("{{\"actor\":\"{actor}\""))
        .unwrap_or_else(|| panic!("{actor} not in {list}: {json}"));
    &items[at..at + items[at..].find('}').expect("an entry ends") + 1]
}

/// The number after `"key":` in `json`, or None for `null`.
fn number(json: &str, key: &str) -> Option<f64> {
    let start =
        json.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key}: {json}")) + key.len() + 3;
    let text: String = json[start..].chars().take_while(|c| !matches!(c, ',' | '}' | ']')).collect();
    (text != "null").then(|| text.parse().unwrap_or_else(|_| panic!("{key}: {text:?} in {json}")))
}

/// B92: every flight is listed, callers parked or not, with its age and its
/// running attempt's age, and the oldest attempt is a gauge. The truth for
/// the ages is the test's own clock: the hung attempt started after the
/// test sent its request and before the simulator saw the call.
#[test]
fn b92_every_flight_is_listed_with_its_attempts_age_and_the_oldest_is_a_metric() {
    let stack = with_status_port();
    stack.sim.script("demo/hung", vec![Answer::ok("10.0.0.3", true).held()]);
    let sent = Instant::now();
    let hung = {
        let envoy = stack.envoy.clone();
        std::thread::spawn(move || block_on(envoy.route("demo/hung")))
    };
    assert!(stack.sim.wait_for_calls("demo/hung", 1, PATIENCE));
    let called = Instant::now();
    let parked = park_three(&stack, "demo/parks");
    // The hung request holds no slot (its flight never reached the park
    // transition, B23): only a list of every flight can show it.
    let (asked, (_, json), replied) =
        (Instant::now(), status(&stack, "/statusz?format=json"), Instant::now());
    assert_eq!(number(&json, "flights"), Some(2.0), "{json}");
    assert_eq!(number(&json, "oldest_flights_more"), Some(0.0));
    let row = entry(&json, "oldest_flights", "demo/hung");
    let attempt = number(row, "attempt_seconds").expect("its first attempt runs");
    let (least, most) =
        (asked.duration_since(called).as_secs_f64(), replied.duration_since(sent).as_secs_f64());
    assert!(least - 0.001 <= attempt && attempt <= most + 0.001, "{least} <= {attempt} <= {most}: {row}");
    assert!(
        number(row, "age_seconds").unwrap() >= attempt - 0.001,
        "a flight is as old as its attempts: {row}"
    );
    assert_eq!((number(row, "attempts"), number(row, "parked")), (Some(1.0), Some(0.0)), "{row}");
    assert_eq!(number(entry(&json, "oldest_flights", "demo/parks"), "parked"), Some(3.0));
    assert!(!json[json.find("\"parked_actors\":").unwrap()..]
        .starts_with("\"parked_actors\":[{\"actor\":\"demo/hung\""));
    assert_eq!(number(&json, "parked_actors_total"), Some(1.0), "only demo/parks has parked callers");
    let oldest = number(&json, "oldest_attempt_seconds").unwrap();
    assert!(oldest >= attempt, "the hung attempt is the oldest: {oldest} < {attempt}");
    let (html, gauge) =
        (status(&stack, "/statusz").1, stack.metrics().value("atenet_router_oldest_attempt_seconds", &[]));
    assert!(html.contains("<td data-label=\"actor\">demo/hung</td>"), "{html}");
    assert!(html.contains("<td data-label=\"attempt\">running "), "{html}");
    let most = sent.elapsed().as_secs_f64();
    assert!(least <= gauge && gauge <= most + 0.001, "gauge {gauge} outside [{least}, {most}]");

    stack.sim.release("demo/hung");
    routed(&hung.join().unwrap());
    stack.sim.script("demo/parks", vec![Answer::ok("10.0.0.2", true)]);
    parked.join().unwrap();
    stack.assert_quiescent();
    assert_eq!(stack.metrics().value("atenet_router_oldest_attempt_seconds", &[]), 0.0, "no attempt runs");
    let (_, json) = status(&stack, "/statusz?format=json");
    assert!(
        json.contains("\"flights\":0,\"oldest_flights\":[],")
            && json.contains("\"oldest_attempt_seconds\":null")
    );
}

/// B93: with thousands of distinct parked actors the page lists the oldest
/// fifty and the top twenty atespaces, says how many it left out, and its
/// size does not grow with them. The truth is what the test holds: 3,000
/// requests, each for an actor of its own, in 30 atespaces, each refused by
/// the simulator until released.
#[test]
fn b93_the_page_is_bounded_and_its_totals_are_what_is_parked() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let flags = [
        "--parked-request-max",
        "4000",
        "--parked-request-budget",
        "10m",
        // Every flight retries every 3 s, so that a release is seen soon.
        "--parked-request-retry-interval",
        "3s",
        "--parked-request-retry-factor",
        "1",
    ];
    let stack = Stack::start_with(&flags, &port);
    let actors: Vec<String> = (0..3000).map(|i| format!("tenant-{}/actor-{}", i % 30, i / 30)).collect();
    let refused = Answer::error(Code::ResourceExhausted, "no free workers available");
    stack.sim.script_all(actors.iter().map(|a| (a.clone(), refused.clone())).collect());
    let hold = |actors: &[String]| {
        let (envoy, actors) = (stack.envoy.clone(), actors.to_vec());
        std::thread::spawn(move || block_on(futures::future::join_all(actors.iter().map(|a| envoy.route(a)))))
    };
    let sizes =
        |stack: &Stack| (status(stack, "/statusz?format=json").1.len(), status(stack, "/statusz").1.len());
    let parked = |n: usize| {
        stack.eventually(&format!("{n} parked"), |s| {
            s.metrics().value("atenet_router_parking_active", &[]) == n as f64
        });
        assert!(actors[..n].iter().all(|a| stack.sim.calls(a) >= 1), "each was refused by the simulator");
    };

    // Sixty actors fill every list already: 50 rows, 20 of 30 atespaces.
    let first = hold(&actors[..60]);
    parked(60);
    let (json_60, html_60) = sizes(&stack);
    let rest = hold(&actors[60..]);
    parked(3000);
    let (_, json) = status(&stack, "/statusz?format=json");
    let (_, html) = status(&stack, "/statusz");
    let (json_3000, html_3000) = (json.len(), html.len());
    println!("statusz at 60 parked actors: JSON {json_60} B, HTML {html_60} B; at 3,000: JSON {json_3000} B, HTML {html_3000} B");
    for (key, want) in [
        ("flights", 3000.0),
        ("oldest_flights_more", 2950.0),
        ("parked_actors_total", 3000.0),
        ("parked_actors_more", 2950.0),
        ("atespaces_total", 30.0),
        ("atespaces_more", 10.0),
    ] {
        assert_eq!(number(&json, key), Some(want), "{key}");
    }
    let listed = |list: &str| {
        let start = json.find(&format!("\"{list}\":[")).unwrap();
        json[start..start + json[start..].find(']').unwrap()].matches("{\"").count()
    };
    assert_eq!((listed("oldest_flights"), listed("parked_actors"), listed("atespaces")), (50, 50, 20));
    assert!(
        html.contains("Showing the oldest 50 of 3,000 (<b>2,950</b> more).")
            && html.contains("(<b>10</b> more)")
    );
    // Fifty times the actors, the same page: only its figures (and the
    // charts' samples meanwhile) differ.
    assert!(json_3000 <= json_60 + 8192 && html_3000 <= html_60 + 8192, "the page grew with the actors");
    assert!(json_3000 <= 128 * 1024 && html_3000 <= 192 * 1024, "JSON {json_3000} B, HTML {html_3000} B");

    actors.iter().for_each(|a| stack.sim.script(a, vec![Answer::ok("10.0.0.4", true)]));
    for (handle, n) in [(first, 60), (rest, 2940)] {
        let replies = handle.join().unwrap();
        assert_eq!(replies.len(), n);
        replies.iter().for_each(|r| drop(routed(r)));
    }
}
