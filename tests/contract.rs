//! The contract is self-contained: every rule id (`B<n>`) cited anywhere in
//! the repository is defined, exactly once, in `docs/behavior.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Rule ids in `text`: a `B` followed by digits, not inside a longer word.
fn rule_ids(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let mut ids = Vec::new();
    for (i, _) in text.match_indices('B') {
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
            continue;
        }
        let digits: String = text[i + 1..].chars().take_while(char::is_ascii_digit).collect();
        let after = bytes.get(i + 1 + digits.len()).copied();
        if digits.is_empty() || after.is_some_and(|b| b.is_ascii_alphabetic() || b == b'_') {
            continue;
        }
        ids.push(digits.parse().expect("digits"));
    }
    ids
}

/// Rule definitions: lines of the form `- B<n>. ...`.
fn defined(contract: &str) -> BTreeMap<u32, usize> {
    let mut rules = BTreeMap::new();
    for line in contract.lines() {
        if let Some(rest) = line.strip_prefix("- B") {
            if let Some((number, _)) = rest.split_once(". ") {
                if let Ok(n) = number.parse() {
                    *rules.entry(n).or_default() += 1;
                }
            }
        }
    }
    rules
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "__pycache__" {
            continue;
        }
        if path.is_dir() {
            files(&path, out);
        } else if std::fs::read_to_string(&path).is_ok() {
            out.push(path);
        }
    }
}

#[test]
fn every_cited_rule_is_defined_once_in_docs_behavior_md() {
    let root = Path::new(ROOT);
    let contract = std::fs::read_to_string(root.join("docs/behavior.md")).expect("docs/behavior.md exists");
    let rules = defined(&contract);
    assert!(rules.len() >= 46, "the contract defines B1-B46 at least: {rules:?}");
    let twice: Vec<_> = rules.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
    assert!(twice.is_empty(), "rules defined more than once: {twice:?}");
    let expected: BTreeSet<u32> = (1..=*rules.keys().max().unwrap()).collect();
    let missing: Vec<_> = expected.iter().filter(|id| !rules.contains_key(id)).collect();
    assert!(missing.is_empty(), "gaps in the rule numbering: {missing:?}");

    let mut paths = Vec::new();
    for dir in ["src", "tests", "benches", "docs", "packaging", ".ci"] {
        files(&root.join(dir), &mut paths);
    }
    for file in ["README.md", "BENCHMARKS.md", "Makefile", "Cargo.toml"] {
        paths.push(root.join(file));
    }
    let mut undefined = Vec::new();
    let mut cited = 0;
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        for id in rule_ids(&text) {
            cited += 1;
            if !rules.contains_key(&id) {
                undefined.push(format!("B{id} in {}", path.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(cited > 100, "the scan found the citations ({cited})");
    assert!(undefined.is_empty(), "cited but not defined in docs/behavior.md: {undefined:#?}");
}

#[test]
fn rule_id_scanner() {
    assert_eq!(rule_ids("B1-B5, (B24) B30. xB7 B8x B12_ SHA256B3"), vec![1, 5, 24, 30]);
    let rules = defined("- B1. one\n- B2. two\n  - B3. nested is not a rule\n- B10. ten");
    assert_eq!(rules.keys().copied().collect::<Vec<_>>(), vec![1, 2, 10]);
}
