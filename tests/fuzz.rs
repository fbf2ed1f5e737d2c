//! Fuzz targets for actor addressing, the ProcessingRequest handler,
//! duration parsing, flag validation, PEM credential files and Envoy's admin
//! stats, run as property tests for a bounded number of cases (`PROPTEST_CASES`
//! raises it for longer runs, e.g. `PROPTEST_CASES=2000000 cargo test
//! --release --features testkit --test integration -- fuzz::`).
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use std::collections::HashMap;

use atenet_router::actor::target::{self, ActorId};
use atenet_router::cli::config::parse_serve_args;
use atenet_router::cli::{godur, size};
use atenet_router::envoy::bootstrap;
use atenet_router::envoy::extproc::{classify, Classified};
use atenet_router::lifecycle::drain;
use atenet_router::parking::deadline;
use atenet_router::proto::base::{HeaderMap, HeaderValue};
use atenet_router::proto::external_processor::ProcessingRequest;
use atenet_router::tls::pem;
use proptest::prelude::*;
use protobuf::well_known_types::struct_::{Struct, Value};
use protobuf::Message;

/// An independent statement of B3: both parts of `a/b` are DNS-1123 labels.
fn oracle_valid(reference: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(reference) else { return false };
    let Some((a, b)) = text.split_once('/') else { return false };
    let label = |l: &str| {
        let bytes = l.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes.iter().all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'-'))
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    };
    label(a) && label(b)
}

/// Byte strings biased towards almost-valid references.
fn reference() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        "[a-z0-9-]{0,65}/[a-z0-9-]{0,65}".prop_map(String::into_bytes),
        "[a-zA-Z0-9./% -]{0,20}(/[a-z0-9]{0,5}){0,3}".prop_map(String::into_bytes),
    ]
}

fn header_map(pairs: &[(String, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (key, raw) in pairs {
        let mut h = HeaderValue::new();
        h.key = key.clone();
        h.raw_value = raw.clone();
        map.headers.push(h);
    }
    map
}

fn header_pairs() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let key = prop_oneof![
        Just("ate-target-actor".to_string()),
        Just("ATE-TARGET-ACTOR".to_string()),
        Just(":method".to_string()),
        Just(":authority".to_string()),
        Just(":path".to_string()),
        "[a-z:-]{0,12}",
    ];
    let value = prop_oneof![
        reference(),
        Just(b"CONNECT".to_vec()),
        "[a-z.]{0,8}:[0-9]{0,6}".prop_map(String::into_bytes)
    ];
    proptest::collection::vec((key, value), 0..8)
}

fn attributes() -> impl Strategy<Value = HashMap<String, Struct>> {
    let name = prop_oneof![
        Just(target::ACTOR_ATTRIBUTE.to_string()),
        Just(target::AUTHORITY_ATTRIBUTE.to_string()),
        "[a-z.]{0,10}",
    ];
    proptest::collection::vec((name, "[ -~]{0,40}"), 0..3).prop_map(|entries| {
        let mut s = Struct::new();
        for (k, v) in entries {
            let mut value = Value::new();
            value.set_string_value(v);
            s.fields.insert(k, value);
        }
        HashMap::from([("envoy.filters.http.ext_proc".to_string(), s)])
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// B3: a reference parses exactly when the oracle says it is valid, and
    /// the canonical id is the input.
    #[test]
    fn actor_parse_matches_the_spec(raw in reference()) {
        let parsed = std::str::from_utf8(&raw).ok().map(ActorId::parse);
        prop_assert_eq!(parsed.as_ref().is_some_and(|p| p.is_ok()), oracle_valid(&raw));
        if let Some(Ok(id)) = parsed {
            prop_assert_eq!(id.as_str().as_bytes(), &raw[..]);
            prop_assert_eq!(format!("{}/{}", id.atespace(), id.name()), id.as_str());
        }
    }

    /// B1-B5 never panic, and agree with an independent statement of the
    /// rules: the target is what the first actor header (or, when that is
    /// absent or empty, the attribute) says, and the port is B5's.
    #[test]
    fn addressing_matches_the_spec(pairs in header_pairs(), attrs in attributes()) {
        let map = header_map(&pairs);
        let got = target::resolve(&map, &attrs).map(|t| (t.actor.as_str().to_string(), t.port)).ok();
        let expected = oracle_actor(&pairs, &attrs).map(|actor| (actor, oracle_port(&pairs, &attrs)));
        prop_assert_eq!(got, expected);
        let port = target::target_port(&map, &attrs);
        prop_assert_eq!(port, oracle_port(&pairs, &attrs));
    }
}

/// The first value of a header, by case-insensitive name (B1).
fn oracle_header<'a>(pairs: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    pairs.iter().find(|(k, _)| k.to_ascii_lowercase() == name).map(|(_, v)| v.as_slice())
}

/// A string attribute (B2); the fuzzed attributes come under one filter key.
fn oracle_attribute<'a>(attrs: &'a HashMap<String, Struct>, name: &str) -> Option<&'a str> {
    attrs.values().find_map(|s| s.fields.get(name).map(|v| v.string_value()))
}

/// B1-B3: the canonical id, when the request names a valid actor.
fn oracle_actor(pairs: &[(String, Vec<u8>)], attrs: &HashMap<String, Struct>) -> Option<String> {
    let reference = match oracle_header(pairs, "ate-target-actor") {
        Some(value) if !value.is_empty() => value.to_vec(),
        _ => oracle_attribute(attrs, target::ACTOR_ATTRIBUTE).unwrap_or("").as_bytes().to_vec(),
    };
    oracle_valid(&reference).then(|| String::from_utf8(reference).unwrap())
}

/// B5, from its text: the authority attribute's port when the attribute is
/// set; else, for CONNECT only, the `:authority` port; else 80. A port that
/// is not an integer in 1..=65535 keeps 80.
fn oracle_port(pairs: &[(String, Vec<u8>)], attrs: &HashMap<String, Struct>) -> u16 {
    let port_of = |authority: &[u8]| -> Option<u16> {
        let text = std::str::from_utf8(authority).ok()?;
        let (host, port) = text.rsplit_once(':')?;
        let bracketed = host.starts_with('[') && host.ends_with(']');
        if host.contains(':') && !bracketed {
            return None; // a bare IPv6 address: no port
        }
        if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let n: u64 = port.parse().ok()?;
        (1..=65535).contains(&n).then_some(n as u16)
    };
    if let Some(authority) = oracle_attribute(attrs, target::AUTHORITY_ATTRIBUTE).filter(|a| !a.is_empty()) {
        return port_of(authority.as_bytes()).unwrap_or(80);
    }
    let connect = oracle_header(pairs, ":method").is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT"));
    match oracle_header(pairs, ":authority") {
        Some(authority) if connect => port_of(authority).unwrap_or(80),
        _ => 80,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    /// The handler on arbitrary bytes: decoding fails cleanly or the message
    /// is classified without panicking, and every reply encodes.
    #[test]
    fn handler_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(request) = ProcessingRequest::parse_from_bytes(&bytes) {
            check(request)?;
        }
    }

    /// The handler on well-formed messages mutated at the byte level.
    #[test]
    fn handler_on_mutated_messages(
        pairs in header_pairs(),
        attrs in attributes(),
        kind in 0u8..7,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut request = ProcessingRequest::new();
        let mut headers = atenet_router::proto::external_processor::HttpHeaders::new();
        headers.headers = Some(header_map(&pairs)).into();
        match kind {
            0 => request.set_request_headers(headers),
            1 => request.set_response_headers(headers),
            2 => request.set_request_body(Default::default()),
            3 => request.set_response_body(Default::default()),
            4 => request.set_request_trailers(Default::default()),
            5 => request.set_response_trailers(Default::default()),
            _ => {}
        }
        request.attributes = attrs;
        let mut bytes = request.write_to_bytes().unwrap();
        if !bytes.is_empty() {
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= byte;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
        }
        if let Ok(request) = ProcessingRequest::parse_from_bytes(&bytes) {
            check(request)?;
        }
    }
}

fn check(request: ProcessingRequest) -> Result<(), TestCaseError> {
    match classify(request) {
        Classified::Reply(reply) => {
            prop_assert!(reply.response.is_some(), "B9: a reply of a kind");
            prop_assert!(reply.write_to_bytes().is_ok());
        }
        Classified::Route(target, line, timeout, _, _) => {
            // B68: at most gRPC's longest (99999999H), or what fits a u64 of ms.
            prop_assert!(timeout.timeout.is_none_or(|t| t.as_secs() <= u64::MAX / 1000));
            prop_assert!(oracle_valid(target.actor.as_str().as_bytes()));
            prop_assert!(!line.path().contains(&b'?'), "no query string is kept");
        }
        Classified::InvalidTarget(line, _) => prop_assert!(line.method().len() <= 16),
        Classified::Ignore => {}
    }
    Ok(())
}

/// Go durations as operators type them, near misses, and overflow.
fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[-+]?([0-9]{0,22}(\\.[0-9]{0,12})?(ns|us|µs|ms|s|m|h)){1,4}",
        "[-+]?[0-9.]{0,30}[a-zµ]{0,3}",
        any::<String>(),
    ]
}

/// A value for any flag: numbers, floats, durations, addresses, garbage.
fn flag_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?[0-9]{1,22}",
        "-?[0-9]{0,5}\\.?[0-9]{0,5}(e[-+]?[0-9]{1,3})?",
        Just("NaN".to_string()),
        Just("inf".to_string()),
        duration_text(),
        "(\\[?[0-9a-f:.]{0,20}\\]?)?:[0-9]{0,6}",
        "[0-9]{0,22}(Ki|Mi|Gi|Ti|K|G|i)?",
        "([0-9a-f:.]{0,16}/[0-9]{0,3},?){0,3}",
        "[ -~]{0,12}",
    ]
}

const FLAGS: &[&str] = &[
    "--parked-request-budget",
    "--parked-request-max",
    "--parked-request-retry-interval",
    "--parked-request-retry-factor",
    "--parked-request-retry-jitter",
    "--extproc-max-requests",
    "--flight-max",
    "--grpc-threads",
    "--worker-port",
    "--port-extproc",
    "--metrics-listen-addr",
    "--status-port",
    "--drain-delay",
    "--drain-timeout",
    "--route-timeout",
    "--late-serve-limit",
    "--log-level",
    "--port-http",
    "--envoy-admin-address",
    "--envoy-max-heap",
    "--envoy-trusted-ranges",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    /// Duration parsing never panics, and a parse is exact: formatting the
    /// value and parsing it again gives the same value.
    #[test]
    fn durations_parse_or_refuse_cleanly(text in duration_text()) {
        if let Ok(d) = godur::parse(&text) {
            prop_assert!(d.magnitude.as_nanos() <= i64::MAX as u128);
            prop_assert_eq!(godur::parse(&godur::format(d.magnitude)).unwrap().magnitude, d.magnitude);
        }
    }

    /// Size parsing (`--envoy-max-heap`) never panics, and what it reads
    /// formats back to the same number of bytes.
    #[test]
    fn sizes_parse_or_refuse_cleanly(text in "[ -~]{0,4}[0-9]{0,22}(Ki|Mi|Gi|Ti|K|G|i)?[ -~]{0,2}") {
        if let Ok(bytes) = size::parse(&text) {
            prop_assert_eq!(size::parse(&size::format(bytes)), Ok(bytes));
        }
    }

    #[test]
    fn durations_round_trip(nanos in 0u64..=i64::MAX as u64) {
        let d = std::time::Duration::from_nanos(nanos);
        prop_assert_eq!(godur::parse(&godur::format(d)).unwrap().magnitude, d);
    }

    /// Any values for any flags: a valid configuration (and its Envoy
    /// bootstrap), or an error that says it is one and names a flag. Never a
    /// panic (B37, B59).
    #[test]
    fn flag_validation_never_panics(
        picks in proptest::collection::vec((0..FLAGS.len(), flag_value()), 0..6),
        equals_form in any::<bool>(),
    ) {
        let mut args: Vec<String> = vec!["--ateapi-insecure".into()];
        for (i, value) in &picks {
            if equals_form {
                args.push(format!("{}={value}", FLAGS[*i]));
            } else {
                args.push(FLAGS[*i].to_string());
                args.push(value.clone());
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match parse_serve_args(&args) {
            Ok(config) => {
                let yaml = bootstrap::bootstrap(&config);
                prop_assert!(yaml.contains("static_resources"));
            }
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.starts_with("invalid router configuration: "), "{}", message);
                prop_assert!(message.contains("--"), "names a flag: {}", message);
            }
        }
    }

    /// PEM parsing never panics on arbitrary bytes or on damaged real
    /// bundles, and what it accepts is what gRPC needs: text without NUL,
    /// complete blocks, a key that matches its certificate.
    #[test]
    fn pem_parsing_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        check_pem(&bytes)?;
        let mut bundle = bundle().to_vec();
        for (at, byte) in flips {
            let i = at.index(bundle.len());
            bundle[i] ^= byte;
        }
        bundle.truncate(cut.index(bundle.len() + 1));
        check_pem(&bundle)?;
    }

    /// Deadline headers (B68): gRPC's format exactly, or ignored.
    #[test]
    fn deadline_headers_parse_exactly_or_are_ignored(value in prop_oneof![
        "[0-9]{0,10}[HMSmunx]?",
        "[ -~]{0,12}",
    ]) {
        let parsed = deadline::grpc_timeout(value.as_bytes());
        let (digits, unit) = value.split_at(value.len().saturating_sub(1));
        let well_formed = (1..=8).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
            && matches!(unit, "H" | "M" | "S" | "m" | "u" | "n");
        prop_assert_eq!(parsed.is_some(), well_formed);
        let millis = deadline::millis(value.as_bytes());
        let number = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) && value.parse::<u64>().is_ok();
        prop_assert_eq!(millis.is_some(), number);
    }

    /// The admin stats parser never panics and sums exactly the non-admin
    /// `downstream_cx_active` gauges.
    #[test]
    fn admin_stats_parser(
        lines in proptest::collection::vec(
            (prop_oneof![
                Just("http.ingress.downstream_cx_active".to_string()),
                Just("http.admin.downstream_cx_active".to_string()),
                Just("listener.0.0.0.0_8080.downstream_cx_active".to_string()),
                Just("http.ingress.downstream_cx_total".to_string()),
                "[a-z._0-9]{0,30}",
            ], prop_oneof!["[0-9]{1,6}", "[ -~]{0,8}"]),
            0..12,
        ),
        noise in "[ -~\n]{0,40}",
    ) {
        let mut text = String::new();
        let mut expected = 0u64;
        for (name, value) in &lines {
            text.push_str(&format!("{name}: {value}\n"));
            let not_traffic = ["admin", "atenet_health", "atenet_stats"];
            if name.ends_with("downstream_cx_active") && !not_traffic.iter().any(|n| name.contains(n)) {
                expected += value.trim().parse::<u64>().unwrap_or(0);
            }
        }
        prop_assert_eq!(drain::active_connections(&text), expected);
        let _ = drain::active_connections(&format!("{noise}{text}"));
    }
}

/// A real bundle (a self-signed P-256 certificate, then its key), made
/// once with the `openssl` crate, for mutation.
fn bundle() -> &'static [u8] {
    static BUNDLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BUNDLE.get_or_init(|| {
        use openssl::{asn1::Asn1Time, ec, hash::MessageDigest, nid::Nid, pkey::PKey, x509};
        let group = ec::EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(ec::EcKey::generate(&group).unwrap()).unwrap();
        let mut name = x509::X509Name::builder().unwrap();
        name.append_entry_by_text("CN", "fuzz").unwrap();
        let name = name.build();
        let mut cert = x509::X509::builder().unwrap();
        cert.set_subject_name(&name).unwrap();
        cert.set_issuer_name(&name).unwrap();
        cert.set_pubkey(&key).unwrap();
        cert.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
        cert.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        [cert.build().to_pem().unwrap(), key.private_key_to_pem_pkcs8().unwrap()].concat()
    })
}

fn check_pem(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(blocks) = pem::blocks(bytes) {
        prop_assert!(!bytes.contains(&0));
        for block in blocks {
            prop_assert!(block.text.starts_with("-----BEGIN ") && block.text.ends_with("-----"));
        }
    }
    let now = pem::unix_now();
    if let Ok((chain, key, _)) = pem::split_bundle(bytes, now) {
        prop_assert!(!chain.contains(&0) && !key.contains(&0));
        // What gRPC gets is what the checks accept, again.
        prop_assert!(pem::split_bundle(&[chain, key].concat(), now).is_ok());
    }
    let _ = pem::certificates(bytes);
    Ok(())
}
