//! The real `atenet-router` binary: flags, validation messages, startup and
//! shutdown (B37-B40, B46).
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::process::Command;

use common::free_port;
use common::process::{
    router_args, spawn_router, spawn_until, terminate, word_after, ROUTER_BIN as ROUTER, SIM_BIN as SIM,
};

fn run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    let out = Command::new(ROUTER).args(args).output().expect("run atenet-router");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A reader that went away (`envoy-config | head -1`) ends the output
/// quietly with status 0, never a panic; a bad sim flag exits 2 as every
/// other bad configuration does.
#[test]
fn a_closed_stdout_is_no_panic_and_a_bad_sim_flag_exits_2() {
    let parkload = env!("CARGO_BIN_EXE_parkload");
    let commands: [(&str, &[&str]); 5] = [
        (ROUTER, &["envoy-config", "--ateapi-insecure"]),
        (ROUTER, &["--help"]),
        (ROUTER, &["version"]),
        (SIM, &["--help"]),
        (parkload, &["--help"]),
    ];
    for (program, args) in commands {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(program).args(args).stdout(writer).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{program} {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{program} {args:?}: {stderr}");
    }
    let out = Command::new(SIM).arg("--bogus").output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("invalid sim configuration: "));
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
    // B65: every flag says its default (an entry's text may wrap onto
    // indented lines, which may start with another flag's name).
    let flags = help_flags(ROUTER, &["serve", "--help"]);
    assert!(flags.len() >= 29, "{flags:#?}");
    for (flag, text) in flags {
        assert!(text.contains("(default: "), "no default shown: {flag} {text}");
    }
}

/// The `--help` of a command, each flag with its whole description (argh
/// wraps a long one onto lines of its own): `(flag, text)`, `--help` left out.
fn help_flags(program: &str, args: &[&str]) -> Vec<(String, String)> {
    let out = Command::new(program).args(args).output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{program} {args:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let options = text.split_once("\nOptions:\n").map_or("", |(_, rest)| rest);
    let mut flags: Vec<(String, String)> = Vec::new();
    for line in options.lines() {
        if let Some(entry) = line.strip_prefix("  --") {
            let (name, rest) = entry.split_once(' ').unwrap_or((entry, ""));
            flags.push((format!("--{}", name.trim_end_matches(',')), rest.trim().to_string()));
        } else if let Some((_, text)) = flags.last_mut().filter(|_| line.starts_with("    ")) {
            text.push(' ');
            text.push_str(line.trim());
        } else {
            break;
        }
    }
    flags.retain(|(name, _)| name != "--help");
    flags
}

/// B65: every flag of every command's `--help` says its default, the tools'
/// as the router's.
#[test]
fn b65_every_flag_of_every_help_names_its_default() {
    let parkload = env!("CARGO_BIN_EXE_parkload");
    let commands: [(&str, &[&str], usize); 4] = [
        (ROUTER, &["serve", "--help"], 61),
        (ROUTER, &["envoy-config", "--help"], 61),
        (SIM, &["--help"], 20),
        (parkload, &["--help"], 16),
    ];
    for (program, args, count) in commands {
        let flags = help_flags(program, args);
        assert_eq!(flags.len(), count, "{program} {args:?}: {flags:?}");
        for (flag, text) in flags {
            assert!(text.contains("(default: "), "{program} {args:?}: {flag} names no default: {text:?}");
        }
    }
}

/// The flags' page (docs/flags.md) lists exactly the flags `serve --help`
/// does, each with the same default, so neither can change alone.
#[test]
fn the_flags_page_and_help_list_the_same_flags_and_defaults() {
    let help: Vec<(String, String)> = help_flags(ROUTER, &["serve", "--help"])
        .into_iter()
        .map(|(flag, text)| {
            let default = text.rsplit_once("(default: ").map_or("", |(_, d)| d.trim_end_matches(')'));
            // The value itself, before what it means ("0 = half of ...").
            let value = default.split([';']).next().unwrap().split(" = ").next().unwrap();
            (flag, value.split(": ").next().unwrap().to_string())
        })
        .collect();
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md")).unwrap();
    let documented: Vec<(String, String)> = page
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix("| `--")?.split('|');
            let flag = format!("--{}", cells.next()?.trim().trim_end_matches('`'));
            let default = cells.next()?.trim();
            // The first value in backticks, else the word; an empty cell is none.
            let value = match default.split('`').nth(1) {
                Some(value) => value,
                None if default.is_empty() => "none",
                None => default,
            };
            Some((flag, value.to_string()))
        })
        .collect();
    let sorted = |mut v: Vec<(String, String)>| {
        v.sort();
        v
    };
    assert_eq!(sorted(documented), sorted(help), "docs/flags.md against serve --help (flag, default)");
}

/// The status page's effective flags (B42) are every flag `--help` lists.
#[test]
fn the_status_page_shows_every_flag() {
    let config = atenet_router::cli::config::parse_serve_args(&["--ateapi-insecure"]).unwrap();
    let mut shown: Vec<&str> =
        atenet_router::admin::status::effective_flags(&config).iter().map(|(f, _)| *f).collect();
    let mut listed: Vec<String> =
        help_flags(ROUTER, &["serve", "--help"]).into_iter().map(|(f, _)| f).collect();
    shown.sort();
    listed.sort();
    assert_eq!(shown, listed);
}

#[test]
fn b65_version_and_revision() {
    let revision = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    let revision = String::from_utf8_lossy(&revision.stdout).trim().to_string();
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let (code, out, _) = run(args);
        assert_eq!(code, 0, "{args:?}");
        assert_eq!(
            out.trim(),
            format!("atenet-router {} (revision {revision})", env!("CARGO_PKG_VERSION")),
            "{args:?}"
        );
    }
    // Words after them are refused, not ignored (they were, with exit 0).
    for args in [&["version", "--bogus"][..], &["--version", "extra"], &["help", "serve"]] {
        let (code, out, err) = run(args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert!(err.contains("takes no arguments"), "{args:?}: {err}");
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
        // B125: checked whether or not tracing is on.
        (&["serve", "--ateapi-insecure", "--trace-sample-percent", "101"], "--trace-sample-percent"),
        (&["envoy-config", "--trace-sample-percent", "-1"], "--trace-sample-percent"),
        (&["serve", "--ateapi-insecure", "--trace-sample-percent", "NaN"], "--trace-sample-percent"),
        (&["serve", "--ateapi-insecure", "--otlp-traces-address", "collector"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "collector:0"], "--otlp-traces-address"),
        (&["serve", "--ateapi-insecure", "--otlp-traces-address", ":4317"], "--otlp-traces-address"),
        // Hosts no resolver finds, and an IPv6 address without brackets.
        (&["serve", "--ateapi-insecure", "--otlp-traces-address", "a\u{1}b:1"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "h..:1"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "a_b:1"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "-x:1"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "::1:4317"], "--otlp-traces-address"),
        (&["envoy-config", "--otlp-traces-address", "[otel]:4317"], "--otlp-traces-address"),
        (&["serve", "--ateapi-insecure", "--port-extproc", "abc"], "--port-extproc"),
        (&["serve", "--ateapi-insecure", "--parked-request-budget", "5"], "--parked-request-budget"),
        (&["serve", "--ateapi-insecure", "--ateapi-ca-file", "/tmp/ca.pem"], "--ateapi-insecure"),
        (
            &[
                "serve",
                "--ateapi-insecure",
                "--parked-request-max",
                "4",
                "--parked-request-max-per-atespace",
                "5",
            ],
            "--parked-request-max-per-atespace",
        ),
        (
            &["serve", "--ateapi-insecure", "--parked-request-max-per-atespace", "-1"],
            "--parked-request-max-per-atespace",
        ),
        (
            &[
                "serve",
                "--ateapi-insecure",
                "--parked-request-max",
                "0",
                "--parked-request-max-per-atespace",
                "1",
            ],
            "--parked-request-max-per-atespace",
        ),
        (&["serve", "--ateapi-insecure", "--caller-deadlines", "maybe"], "--caller-deadlines"),
        (&["serve", "--ateapi-insecure", "--grpc-threads", "257"], "--grpc-threads"),
        (&["envoy-config", "--ateapi-insecure", "--grpc-threads", "-1"], "--grpc-threads"),
        // B70: what the bootstrap renders must fit Envoy's types.
        (&["serve", "--ateapi-insecure", "--extproc-max-requests", "4294967296"], "--extproc-max-requests"),
        (
            &["envoy-config", "--ateapi-insecure", "--extproc-max-requests", "4294967296"],
            "--extproc-max-requests",
        ),
        (
            &["envoy-config", "--ateapi-insecure", "--parked-request-max", "2147483648"],
            "--parked-request-max",
        ),
        (&["envoy-config", "--ateapi-insecure", "--route-timeout", "1ns"], "--route-timeout"),
        (&["envoy-config", "--ateapi-insecure", "--envoy-idle-timeout", "0"], "--envoy-idle-timeout"),
        (&["serve", "--ateapi-insecure", "--envoy-idle-timeout", "2h"], "--envoy-idle-timeout"),
        // B90: a heap bound Envoy could not run under, or no machine has.
        (&["envoy-config", "--ateapi-insecure", "--envoy-max-heap", "16Mi"], "--envoy-max-heap"),
        (&["serve", "--ateapi-insecure", "--envoy-max-heap", "2Ti"], "--envoy-max-heap"),
        (&["envoy-config", "--ateapi-insecure", "--envoy-max-heap=1GB"], "--envoy-max-heap"),
        (&["envoy-config", "--ateapi-insecure", "--route-timeout", "999us"], "--route-timeout"),
        (
            &["envoy-config", "--ateapi-insecure", "--envoy-admin-address", "localhost"],
            "--envoy-admin-address",
        ),
        (
            &["serve", "--ateapi-insecure", "--envoy-admin-address", "localhost:99999"],
            "--envoy-admin-address",
        ),
        (&["serve", "--ateapi-insecure", "--envoy-admin-address", "localhost:0"], "--envoy-admin-address"),
        (&["serve", "--ateapi-insecure", "--envoy-admin-address", ":9901"], "--envoy-admin-address"),
        (&["serve", "--ateapi-insecure", "--envoy-admin-address", "::1:9901"], "--envoy-admin-address"),
        (&["serve", "--ateapi-insecure", "--envoy-admin-address", "[::x]:9901"], "--envoy-admin-address"),
        // B70: two of the router's own listeners on one port.
        (&["serve", "--ateapi-insecure", "--metrics-listen-addr", "127.0.0.1:4040"], "--status-address"),
        (&["serve", "--ateapi-insecure", "--metrics-listen-addr", ":50051"], "--metrics-listen-addr"),
        (&["serve", "--ateapi-insecure", "--status-port", "9090"], "--status-address"),
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

/// B70: the largest values accepted still fit the bootstrap's 32-bit
/// fields, an explicit `--route-timeout 0` disables the route timeout, and
/// bracketed IPv6 admin addresses are accepted; B69's message with parking
/// off says why, not an empty range.
#[test]
fn b70_envoy_config_at_the_bounds() {
    let (code, out, err) = run(&["envoy-config", "--ateapi-insecure", "--parked-request-max", "2147483647"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_requests: 4294967294\n"), "2 x the largest lot fits a UInt32: {out}");
    let (code, out, err) = run(&[
        "envoy-config",
        "--ateapi-insecure",
        "--extproc-max-requests",
        "4294967295",
        "--route-timeout",
        "0",
        "--envoy-admin-address",
        "[::1]:9901",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_requests: 4294967295\n"), "{out}");
    assert!(out.contains("timeout: 0s\n"), "0 disables the route timeout: {out}");
    assert!(out.contains("address: \"::1\", port_value: 9901"), "{out}");
    let (code, out, err) = run(&["envoy-config", "--ateapi-insecure", "--route-timeout", "1ms"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("timeout: 0.001s\n"), "{out}");
    let (code, _, err) = run(&[
        "serve",
        "--ateapi-insecure",
        "--parked-request-max",
        "0",
        "--parked-request-max-per-atespace",
        "2",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("while parking is off") && !err.contains("1..=0"), "{err}");
}

/// B96: `envoy-config` prints its bootstrap without ateapi credentials, the
/// same as with `--ateapi-insecure`; it still refuses contradictory ateapi
/// flags, and `serve` still requires a CA or `--ateapi-insecure`.
#[test]
fn b96_envoy_config_needs_no_ateapi_credentials() {
    let (code, bare, err) = run(&["envoy-config"]);
    assert_eq!(code, 0, "{err}");
    let (code, insecure, err) = run(&["envoy-config", "--ateapi-insecure"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(bare, insecure, "the bootstrap names no ateapi setting");
    assert!(bare.contains("envoy.filters.http.ext_proc"), "{bare}");
    let (code, _, err) = run(&["envoy-config", "--ateapi-token-file", "/etc/token"]);
    assert_eq!(code, 0, "a token needs TLS only to be sent: {err}");
    for (args, flag) in [
        (&["envoy-config", "--ateapi-insecure", "--ateapi-ca-file", "/etc/ca.pem"][..], "--ateapi-insecure"),
        (&["envoy-config", "--ateapi-client-cert", "/etc/client.pem"][..], "--ateapi-client-cert"),
        (&["envoy-config", "--ateapi-address", " "][..], "--ateapi-address"),
        (
            &["envoy-config", "--ateapi-insecure", "--ateapi-token-file", "/etc/token"][..],
            "--ateapi-token-file",
        ),
        (&["serve"][..], "--ateapi-ca-file is required"),
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// B131: an argument that is not text is refused, naming its position,
/// by every binary (a panic before); `--ateapi-address` is `host:port`, as
/// `--envoy-admin-address` is (B70).
#[test]
fn b131_arguments_are_text_and_addresses_are_host_port() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"/tmp/\xff\xfe");
    let parkload = env!("CARGO_BIN_EXE_parkload");
    let commands: [(&str, Vec<&std::ffi::OsStr>); 4] = [
        (ROUTER, vec!["serve".as_ref(), "--ateapi-insecure".as_ref(), "--drain-complete-file".as_ref(), bad]),
        (ROUTER, vec!["envoy-config".as_ref(), bad]),
        (SIM, vec!["--listen".as_ref(), bad]),
        (parkload, vec![bad]),
    ];
    for (program, args) in commands {
        let out = Command::new(program).args(&args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{program} {args:?}: {stderr}");
        assert!(stderr.contains("is not valid UTF-8") && !stderr.contains("panicked"), "{stderr}");
    }
    for address in ["host:0", "host:99999", "a b:1", ":443", "a\nb:1", "[zz]:1", "h/x:1", "dns:///a b"] {
        for flag in ["--ateapi-address", "--envoy-admin-address"] {
            let (code, out, err) = run(&["envoy-config", flag, address]);
            assert_eq!(code, 2, "{flag} {address:?}: {out}");
            assert!(err.starts_with("invalid router configuration: ") && err.contains(flag), "{err}");
        }
    }
    // A scheme with nothing after it (an operator's hostile run: these
    // started a router whose every request parked out its budget), or with
    // what gRPC 1.56 refuses for it.
    for address in [
        "unix:",
        "unix:///",
        "unix-abstract:",
        "dns:",
        "dns:///",
        "dns://authority/",
        "ipv4:",
        "ipv6:",
        "ipv4:,",
        "ipv4:example.com:443",
        "ipv6:10.0.0.1:443",
        "unix://host/run/ateapi.sock",
        "ipv4://host/10.0.0.1:443",
    ] {
        let (code, out, err) = run(&["envoy-config", "--ateapi-address", address]);
        assert_eq!(code, 2, "{address:?}: {out}");
        assert!(err.contains("--ateapi-address"), "{address:?}: {err}");
    }
    // Envoy's admin needs a port; ateapi is a gRPC target, which may have
    // none (443) or a scheme.
    let (code, _, err) = run(&["envoy-config", "--envoy-admin-address", "nope"]);
    assert_eq!(code, 2, "{err}");
    for address in [
        "api.ate-system.svc:443",
        "ateapi_sim:50061",
        "10.0.0.1:443",
        "[::1]:50061",
        "api.ate-system.svc",
        "[fe80::1%eth0]:443",
        "dns:///api.ate-system.svc:443",
        "dns://8.8.8.8/api.ate-system.svc",
        "dns:api.ate-system.svc:443",
        "unix:/run/ateapi.sock",
        "unix:///run/ateapi.sock",
        "unix-abstract:ateapi",
        "ipv4:10.0.0.1:443,10.0.0.2:443",
        "ipv4:///10.0.0.1:443",
        "ipv4:10.0.0.1:443,",
        "ipv6:[::1]:443",
        "ipv6:[fe80::1%eth0]:443",
        "dns:/api.ate-system.svc:443",
        "dns:///api.ate-system.svc:443?x",
        "unix:relative/ateapi.sock",
    ] {
        let (code, _, err) = run(&["envoy-config", "--ateapi-address", address]);
        assert_eq!(code, 0, "{address}: {err}");
    }
}

/// B132: the bootstrap of the Envoy beside a loopback router gives Envoy
/// none of the router's ports; a router elsewhere, and `serve`, are free
/// to share port numbers with Envoy.
#[test]
fn b132_envoy_beside_the_router_takes_none_of_its_ports() {
    for (args, flags) in [
        (&["--port-http", "50051"][..], ["--port-http", "--port-extproc"]),
        (&["--port-stats", "9090"][..], ["--port-stats", "--metrics-listen-addr"]),
        (&["--status-port", "8080"][..], ["--port-http", "--status-port"]),
        (&["--envoy-admin-address", "localhost:50051"][..], ["--envoy-admin-address", "--port-extproc"]),
    ] {
        let (code, out, err) = run(&[&["envoy-config"][..], args].concat());
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert!(flags.iter().all(|flag| err.contains(flag)), "{args:?}: {err}");
    }
    let elsewhere =
        ["envoy-config", "--extproc-address", "10.0.0.1", "--extproc-insecure", "--port-http", "50051"];
    let (code, _, err) = run(&elsewhere);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) =
        run(&["envoy-config", "--routers", "10.0.0.1:50051,10.0.0.2:50051", "--port-http", "50051"]);
    assert_eq!(code, 0, "{err}");
    // A router that drains no Envoy (make run-router), or Envoy's admin on
    // another address than the router's status page.
    let (code, _, err) =
        run(&["envoy-config", "--envoy-admin-address=", "--metrics-listen-addr", "127.0.0.1:8080"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["envoy-config", "--envoy-admin-address", "[::1]:4040"]);
    assert_eq!(code, 0, "{err}");
}

/// B70: `envoy-config` cannot write the free port `serve --port-extproc 0`
/// would take; B37: a retry interval below 1 ms is a busy loop, refused.
#[test]
fn b70_b37_an_unknowable_extproc_port_and_a_busy_loop_interval_are_refused() {
    let (code, out, err) = run(&["envoy-config", "--ateapi-insecure", "--port-extproc", "0"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.starts_with("invalid router configuration: ") && err.contains("--port-extproc 0"), "{err}");
    for interval in ["1ns", "999us", "0.5ms"] {
        let (code, _, err) =
            run(&["serve", "--ateapi-insecure", "--parked-request-retry-interval", interval]);
        assert_eq!(code, 2, "{interval}: {err}");
        assert!(
            err.contains("--parked-request-retry-interval must be 0") && err.contains("at least 1ms"),
            "{err}"
        );
    }
    let (code, out, err) =
        run(&["envoy-config", "--ateapi-insecure", "--parked-request-retry-interval", "1ms"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("message_timeout"));
}

#[test]
fn b46_parking_off_with_small_breaker_and_short_drain_starts() {
    let args = router_args(
        "127.0.0.1:1",
        &["--parked-request-max", "0", "--extproc-max-requests", "1", "--drain-timeout", "1s"],
    );
    let mut router = spawn_router(&args);
    assert!(router.process.line.contains("parking off"), "{}", router.process.line);
    assert_eq!(terminate(&mut router.process.child), 0, "SIGTERM exits 0");
}

#[test]
fn second_router_on_a_taken_port_fails_clearly() {
    let mut first = spawn_router(&router_args("127.0.0.1:1", &[]));
    let port = first.extproc.port().to_string();
    let (code, _, err) = run(&router_args("127.0.0.1:1", &["--port-extproc", &port]));
    assert_ne!(code, 0);
    assert!(err.contains("cannot listen for ext_proc"), "{err}");
    assert_eq!(terminate(&mut first.process.child), 0);
}

#[test]
fn sim_binary_serves_and_stops_on_sigterm() {
    let mut sim = spawn_until(SIM, &["--listen", "127.0.0.1:0", "--workers", "1"], "listening on");
    assert!(word_after(&sim.line, "listening on ").starts_with("127.0.0.1:"));
    assert_eq!(terminate(&mut sim.child), 0);
    let out = Command::new(SIM).args(["--unavailable-rate", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--unavailable-rate"));
}

#[test]
fn parkload_points_at_a_running_router_and_reports() {
    let mut sim = spawn_until(SIM, &["--listen", "127.0.0.1:0", "--workers", "8"], "listening on");
    let mut router = spawn_router(&router_args(word_after(&sim.line, "listening on "), &[]));
    let target = router.extproc.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_parkload"))
        .args([
            "--target",
            &target,
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
    // A pool too large to build is refused before it is allocated.
    for flag in ["--workers", "--actors"] {
        let bad = Command::new(env!("CARGO_BIN_EXE_ateapi-sim"))
            .args(["--listen", "127.0.0.1:0", flag, "100000000000"])
            .output()
            .unwrap();
        assert_eq!(bad.status.code(), Some(2), "{flag}: {}", String::from_utf8_lossy(&bad.stderr));
        assert!(String::from_utf8_lossy(&bad.stderr).contains(flag));
    }
    assert_eq!(terminate(&mut router.process.child), 0);
    assert_eq!(terminate(&mut sim.child), 0);
}

/// The threads of a running process whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// B72: by default, one completion-queue thread per core the process may
/// use: started on one core (`taskset`), the router runs one.
#[test]
fn b72_grpc_threads_default_to_the_cores_the_process_may_use() {
    // taskset (util-linux) execs the router: the child is the router.
    let mut args = vec!["--cpu-list".to_string(), "0".into(), ROUTER.into()];
    args.extend(router_args("127.0.0.1:1", &[]));
    let mut process = spawn_until("taskset", &args, "serving");
    assert_eq!(threads_named(process.child.id(), "atenet-grpc-"), 1);
    assert_eq!(terminate(&mut process.child), 0);
}

/// The router's own threads in a running process, by the name Linux keeps
/// (15 bytes at most): gRPC core's threads are the ones whose names do not
/// start with `atenet-`.
fn own_threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("atenet-"))
        .collect();
    names.sort();
    names
}

/// docs/architecture.md's "Threads": the router's own threads are the main thread, one
/// per completion queue, the timer, one per HTTP listener, the signal thread,
/// and the credentials watcher with TLS; nothing else of its own. Counted in
/// /proc with and without the status page and with TLS.
#[test]
fn b72_the_routers_own_threads_are_the_readmes() {
    let dir = std::env::temp_dir().join(format!("atenet-cli-threads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem").display().to_string();
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args(["-keyout", &dir.join("ca.key").display().to_string(), "-out", &ca])
        .args(["-days", "2", "-subj", "/CN=ca"])
        .output()
        .expect("openssl is installed");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let status_port = free_port().to_string();
    let status = ["--status-port", status_port.as_str(), "--status-address", "127.0.0.1"];
    let base = [
        "atenet-grpc-0",
        "atenet-grpc-1",
        "atenet-metrics",
        "atenet-router",
        "atenet-signals",
        "atenet-timer",
    ];
    let cases: [(&[&str], bool, &[&str]); 3] = [
        (&[], false, &[]),
        (&status, false, &["atenet-status"]),
        (&["--ateapi-ca-file", &ca], true, &["atenet-creds"]),
    ];
    for (extra, tls, more) in cases {
        let mut flags = vec!["--grpc-threads", "2"];
        flags.extend_from_slice(extra);
        let mut args = router_args("127.0.0.1:1", &flags);
        if tls {
            args.retain(|a| a != "--ateapi-insecure");
        }
        let mut router = spawn_router(&args);
        let mut expected: Vec<String> = base.iter().chain(more).map(|s| s.to_string()).collect();
        expected.sort();
        let pid = router.process.child.id();
        // The threads start as the router comes up: a bounded poll.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while own_threads(pid) != expected && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(own_threads(pid), expected, "{extra:?}");
        assert_eq!(terminate(&mut router.process.child), 0);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// B72: `--grpc-threads` is the number of completion-queue threads the
/// process runs (counted in /proc, not asked of the router), and one thread
/// serves both the ext_proc streams and the ateapi calls.
#[test]
fn b72_grpc_threads_sets_the_completion_queue_threads() {
    let mut sim = spawn_until(SIM, &["--listen", "127.0.0.1:0", "--workers", "8"], "listening on");
    for threads in [1usize, 3] {
        let args =
            router_args(word_after(&sim.line, "listening on "), &["--grpc-threads", &threads.to_string()]);
        let mut router = spawn_router(&args);
        assert_eq!(threads_named(router.process.child.id(), "atenet-grpc-"), threads);
        let out = Command::new(env!("CARGO_BIN_EXE_parkload"))
            .args(["--target", &router.extproc.to_string(), "--count", "100", "--concurrency", "8"])
            .args(["--actors", "demo/actor-{0..3}", "--json", "--progress", "0"])
            .output()
            .unwrap();
        let json = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && json.contains("\"200 routed\":100"), "{threads} threads: {json}");
        assert_eq!(terminate(&mut router.process.child), 0);
    }
    assert_eq!(terminate(&mut sim.child), 0);
}

/// `--grpc-timeout` and an atespace mix (B68, B69), against the real binaries.
#[test]
fn parkload_sends_caller_deadlines_and_reports_each_atespace() {
    let script = std::env::temp_dir().join(format!("parkload-mix-{}.script", std::process::id()));
    std::fs::write(
        &script,
        "greedy/a0 ResourceExhausted 0s - false no free workers available\n\
         greedy/a1 ResourceExhausted 0s - false no free workers available\n\
         greedy/a2 ResourceExhausted 0s - false no free workers available\n\
         polite/b OK 0s 10.0.0.1 false -\n",
    )
    .unwrap();
    let mut sim = spawn_until(
        SIM,
        &["--listen", "127.0.0.1:0", "--workers", "0", "--actors", "0", "--script", script.to_str().unwrap()],
        "listening on",
    );
    let mut router = spawn_router(&router_args(
        word_after(&sim.line, "listening on "),
        &[
            "--parked-request-budget",
            "30s",
            "--parked-request-max",
            "8",
            "--parked-request-max-per-atespace",
            "2",
        ],
    ));
    let target = router.extproc.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_parkload"))
        .args([
            "--target",
            &target,
            "--count",
            "60",
            "--concurrency",
            "6",
            "--actors",
            "greedy/a{0..2},polite/b",
        ])
        .args(["--distribution", "round-robin", "--grpc-timeout", "300m", "--json", "--progress", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    let section = |atespace: &str| {
        let at = json.find(&format!("\"{atespace}\":{{")).unwrap_or_else(|| panic!("{atespace} in {json}"));
        json[at..].split('}').next().unwrap().to_string()
    };
    let (greedy, polite) = (section("greedy"), section("polite"));
    assert!(greedy.contains("\"504 atenet_caller_deadline\":"), "{json}");
    assert!(greedy.contains("\"503 atenet_atespace_full\":"), "{json}");
    assert!(!greedy.contains("200 routed"), "{json}");
    assert_eq!(polite, "\"polite\":{\"200 routed\":15", "{json}");
    let overdue = json.split("\"overdue\":").nth(1).unwrap();
    assert!(!overdue.starts_with('0'), "504s come at or after the deadline: {json}");
    let bad =
        Command::new(env!("CARGO_BIN_EXE_parkload")).args(["--grpc-timeout", "300ms"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--grpc-timeout"));
    let _ = std::fs::remove_file(&script);
    assert_eq!(terminate(&mut router.process.child), 0);
    assert_eq!(terminate(&mut sim.child), 0);
}

#[test]
fn b65_metrics_name_the_build_and_watch_the_process() {
    let mut router = spawn_router(&router_args("127.0.0.1:1", &[]));
    assert!(router.process.line.contains(&format!("atenet-router {} (revision ", env!("CARGO_PKG_VERSION"))));
    let metrics = common::Metrics(common::http_get(router.metrics, "/metrics").1);
    let (_, version, _) = run(&["--version"]);
    let revision = version.trim().rsplit_once("(revision ").unwrap().1.trim_end_matches(')').to_string();
    assert_eq!(
        metrics.value(
            "atenet_router_build_info",
            &[("version", env!("CARGO_PKG_VERSION")), ("revision", &revision)]
        ),
        1.0
    );
    for process in ["process_resident_memory_bytes", "process_open_fds", "process_threads"] {
        assert!(metrics.value(process, &[]) > 0.0, "{process}");
    }
    // Whole seconds: present, maybe still 0 in a process this young.
    metrics.value("process_cpu_seconds_total", &[]);
    assert_eq!(terminate(&mut router.process.child), 0);
}

/// Runs `args` and returns (exit code, stderr), killing the process if it
/// has not ended within `limit` (then the code is -1).
fn run_within(args: &[String], limit: std::time::Duration) -> (i32, String) {
    run_as_within(Command::new(ROUTER), args, limit)
}

/// As [`run_within`], the router started by `command` (`setpriv … ROUTER`).
fn run_as_within(mut command: Command, args: &[String], limit: std::time::Duration) -> (i32, String) {
    let mut child = command
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (-1, "still running".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// B70, B71: a credential file the router cannot use ends startup at once
/// with status 2 (a configuration error: systemd does not restart on it),
/// naming the flag, the path and the reason; a FIFO is never opened for a
/// blocking read.
#[test]
fn b70_b71_a_bad_credential_file_exits_2_at_once() {
    let dir = std::env::temp_dir().join(format!("atenet-cli-credentials-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("ca.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let missing = dir.join("missing.pem");
    for (path, why) in [
        (&fifo, "a FIFO, not a regular file"),
        (&dir, "a directory, not a regular file"),
        (&missing, "No such file"),
    ] {
        let mut args = router_args("127.0.0.1:1", &[]);
        args.retain(|a| a != "--ateapi-insecure");
        args.extend(["--ateapi-ca-file".to_string(), path.display().to_string()]);
        let (code, err) = run_within(&args, std::time::Duration::from_secs(10));
        assert_eq!(code, 2, "{why}: {err}");
        assert!(err.contains("--ateapi-ca-file") && err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(why), "{why}: {err}");
        assert!(err.contains("invalid router configuration: "), "B37's prefix, as any bad value: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// B70: a credential file the router may not read names the file and the
/// user and group the router runs as (a container's UID 65532, say), so the
/// operator knows whose read permission is missing. Run as root, the test
/// starts the router as 65532:65532 on a root-only file, as `docker run`
/// of the image does; otherwise on a file of its own with mode 000.
#[test]
fn b70_an_unreadable_credential_file_names_the_routers_user() {
    let dir = std::env::temp_dir().join(format!("atenet-cli-denied-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not read\n").unwrap();
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (command, expected) = if uid == 0 {
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let mut setpriv = Command::new("setpriv");
        setpriv.args(["--reuid=65532", "--regid=65532", "--clear-groups", ROUTER]);
        (setpriv, "uid 65532, gid 65532".to_string())
    } else {
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
        (Command::new(ROUTER), format!("uid {uid}, gid {gid}"))
    };
    let mut args = router_args("127.0.0.1:1", &[]);
    args.retain(|a| a != "--ateapi-insecure");
    args.extend(["--ateapi-ca-file".to_string(), ca.display().to_string()]);
    let (code, err) = run_as_within(command, &args, std::time::Duration::from_secs(10));
    assert_eq!(code, 2, "{err}");
    let line =
        format!("--ateapi-ca-file {}: permission denied (the router runs as {expected})", ca.display());
    assert!(err.contains(&line), "expected {line:?} in: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
