//! The shape of `src/`: no module depends on itself through others, and a
//! folder reaches only down the layers, with one arrow up at most.
//!
//! The graph is read from the source: every `crate::a::b` path outside
//! comments and `#[cfg(test)]` code is an edge to the module it names (test
//! code may use anything, as it only consumes). This is coarser than the
//! compiler's view, which is the point: a reference the compiler would
//! accept but the layering forbids still fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, from the bottom: a module may name modules of its own
/// folder and of the folders below it. Top-level files (`proto`, `unary`, `router`)
/// are layers of their own; the crate root may use everything. Each
/// folder's `mod.rs` says the same in words.
const LAYERS: &[&str] = &[
    "proto",
    "unary",
    "tls",
    "trace",
    "actor",
    "parking",
    "telemetry",
    "cli",
    "ateapi",
    "envoy",
    "lifecycle",
    "admin",
    "router",
    "tools",
];

/// The one arrow up the layers: the metrics registry names the route
/// outcomes of the Envoy side, which records into it.
const UPWARD: &[(&str, &str)] = &[("telemetry::metrics", "envoy::verdict")];

/// Exactly which modules of a lower folder a module may name, where the
/// layering alone is wider than what the design allows.
const NARROW: &[(&str, &[&str])] = &[
    // Parking knows the trace vocabulary (spans and contexts), never the
    // exporter.
    ("parking", &["proto", "actor", "trace::span", "trace::context"]),
    // The configuration derives the retry and share policies and parses
    // log settings; it never reaches what runs.
    ("cli", &["parking::backoff", "parking::share", "telemetry::logging"]),
];

#[test]
fn modules_form_no_cycle() {
    let graph = module_graph();
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn folders_reach_only_down_the_layers() {
    let (upward, offences) = offences(&module_graph());
    assert!(offences.is_empty(), "dependencies the layering does not allow:\n  {}", offences.join("\n  "));
    assert!(upward.len() <= 1, "more than one arrow up the layers:\n  {}", upward.join("\n  "));
}

/// The arrows that go up the layers, and every arrow the layering does not
/// allow (an upward one other than [`UPWARD`]'s, or a narrow rule broken).
fn offences(graph: &Graph) -> (Vec<String>, Vec<String>) {
    let (mut upward, mut offences) = (Vec::new(), Vec::new());
    for (from, targets) in graph {
        let Some(from_layer) = layer(from) else { continue };
        let narrow = NARROW.iter().find(|(f, _)| Some(*f) == folder(from)).map(|(_, m)| *m);
        for to in targets {
            let Some(to_layer) = layer(to) else { continue };
            if to_layer == from_layer {
                continue;
            }
            let arrow = format!("{from} -> {to}");
            if to_layer > from_layer {
                let listed =
                    UPWARD.iter().any(|(f, t)| from == f && (to == t || to.starts_with(&format!("{t}::"))));
                if !listed {
                    offences.push(arrow.clone());
                }
                upward.push(arrow);
            } else if narrow
                .is_some_and(|modules| !modules.iter().any(|m| to == m || to.starts_with(&format!("{m}::"))))
            {
                offences.push(arrow);
            }
        }
    }
    (upward, offences)
}

/// Where `module` sits in [`LAYERS`]; `None` for the crate root.
fn layer(module: &str) -> Option<usize> {
    let unit = module.split("::").next().filter(|u| !u.is_empty())?;
    let at = LAYERS.iter().position(|l| *l == unit);
    Some(at.unwrap_or_else(|| panic!("{unit} has no place in LAYERS")))
}

#[test]
fn a_second_upward_arrow_fails() {
    // The check itself: an arrow up the layers besides the allowed one is
    // an offence and a second upward arrow.
    let mut graph = module_graph();
    graph.entry("parking::lot".to_string()).or_default().insert("telemetry::metrics".to_string());
    let (upward, offences) = offences(&graph);
    assert!(upward.len() >= 2, "{upward:?}");
    assert_eq!(offences, ["parking::lot -> telemetry::metrics"]);
}

#[test]
fn every_path_the_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    assert!(
        doc.contains("\n## The repository\n"),
        "docs/architecture.md maps the repository (the README's old Layout)"
    );
    let mut missing = Vec::new();
    let mut named = 0;
    for path in doc.split('`').skip(1).step_by(2).filter(|t| looks_like_path(t)) {
        named += 1;
        let path = path.trim_end_matches('/');
        if !root.join(path).exists() && !root.join("src").join(path).exists() {
            missing.push(format!("docs/architecture.md: {path}"));
        }
    }
    assert!(named > 30, "only {named} paths found: is the reader broken?");
    assert!(missing.is_empty(), "paths named but absent:\n  {}", missing.join("\n  "));
}

/// `parking/lot.rs`, `tests/system/`, `router.rs`: a file or folder, not a
/// flag, an endpoint or a URL.
fn looks_like_path(text: &str) -> bool {
    !text.is_empty()
        && !text.contains(char::is_whitespace)
        && !text.starts_with(['/', '-', '$'])
        && !text.contains("://")
        && !text.contains(['*', '<', '{', '='])
        && (text.ends_with(".rs") || text.ends_with(".md") || text.ends_with(".py") || text.ends_with('/'))
}

#[test]
fn the_reader_sees_real_edges() {
    // A reader that found nothing would pass both tests above.
    let graph = module_graph();
    let edges = |m: &str| graph.get(m).cloned().unwrap_or_default();
    assert!(edges("parking::flight").contains("parking::timer"), "{graph:#?}");
    assert!(edges("cli::config").contains("cli::flags"), "{graph:#?}");
    assert!(!edges("cli::flags").contains("cli::config"), "flags must not know the configuration");
    assert!(!edges("parking::lot").contains("telemetry::metrics"), "test code is not an edge");
    assert!(find_cycle(&BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]))
    .is_some());
}

/// The folder a module lives in, or `None` for a top-level file.
fn folder(module: &str) -> Option<&str> {
    module.split_once("::").map(|(folder, _)| folder)
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every library module under `src/` (the binaries are separate crates),
/// with the modules it names.
fn module_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> =
        files.into_iter().filter_map(|path| module_name(&src, &path).map(|name| (name, path))).collect();
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    modules
        .iter()
        .map(|(name, path)| {
            let text = without_tests(&without_comments(&fs::read_to_string(path).unwrap()));
            let targets = crate_paths(&text)
                .iter()
                .filter_map(|p| longest_module(&names, p))
                .filter(|target| target != name && !target.is_empty())
                .collect();
            (name.clone(), targets)
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                collect(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/parking/flight.rs` is `parking::flight`, `src/parking/mod.rs` is
/// `parking`, `src/lib.rs` the root (""); `src/main.rs` is no module.
fn module_name(src: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts.join("::"))
}

/// The longest known module that `path` starts with.
fn longest_module(names: &BTreeSet<&str>, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| names.contains(m.as_str()))
}

/// The paths after each `crate::`, a `crate::{a::b, c}` group expanded.
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident =
            rest[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(
                group[..end].split(',').map(|item| path_prefix(item.trim())).filter(|p| !p.is_empty()),
            );
        } else {
            out.push(path_prefix(rest));
        }
    }
    out
}

/// The leading `a::b::c` of `text`.
fn path_prefix(text: &str) -> String {
    let end = text.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(text.len());
    text[..end].trim_end_matches(':').to_string()
}

/// The text with `//` comments (doc comments included) blanked out. Links
/// in docs are no dependency.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_string => {
                out.push(c);
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '"' => {
                in_string = !in_string;
                out.push(c);
            }
            '/' if !in_string && chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The text without the items marked `#[cfg(test)]`: from the attribute to
/// the item's closing brace (or semicolon), braces inside string and char
/// literals skipped.
fn without_tests(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        rest = &rest[at + MARK.len()..];
        rest = &rest[item_end(rest)..];
    }
    out.push_str(rest);
    out
}

/// Where the item at the start of `text` ends.
fn item_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A char literal such as '{' or '\'' (a lifetime has no closing quote).
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += 1;
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    text.len()
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(node: &str, graph: &Graph, marks: &mut BTreeMap<String, Mark>, path: &mut Vec<String>) -> bool {
        match marks.get(node) {
            Some(Mark::Done) => return false,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap();
                path.drain(..start);
                path.push(node.to_string());
                return true;
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if visit(next, graph, marks, path) {
                return true;
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        false
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        let mut path = Vec::new();
        if visit(node, graph, &mut marks, &mut path) {
            return Some(path);
        }
    }
    None
}
