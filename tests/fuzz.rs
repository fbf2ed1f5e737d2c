//! Fuzz targets for actor addressing and the ProcessingRequest handler,
//! run as property tests for a bounded number of cases (`PROPTEST_CASES`
//! raises it for longer runs, e.g. `PROPTEST_CASES=2000000 cargo test
//! --release --test fuzz`).

use std::collections::HashMap;

use atenet_router::extproc::{classify, Classified};
use atenet_router::proto::base::{HeaderMap, HeaderValue};
use atenet_router::proto::external_processor::ProcessingRequest;
use atenet_router::target::{self, ActorId};
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

    /// B1-B5 never panic; the port is always a valid port; the target, when
    /// any, is what the first actor header (or the attribute) says.
    #[test]
    fn addressing_never_panics(pairs in header_pairs(), attrs in attributes()) {
        let map = header_map(&pairs);
        let port = target::target_port(&map, &attrs);
        prop_assert!(port >= 1);
        if let Ok(t) = target::resolve(&map, &attrs) {
            prop_assert!(oracle_valid(t.actor.as_str().as_bytes()));
            prop_assert_eq!(t.port, port);
        }
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
        Classified::Route(target, line) => {
            prop_assert!(oracle_valid(target.actor.as_str().as_bytes()));
            prop_assert!(!line.path().contains(&b'?'), "no query string is kept");
        }
        Classified::InvalidTarget(line) => prop_assert!(line.method().len() <= 16),
        Classified::Ignore => {}
    }
    Ok(())
}
