//! The contract is self-contained and its ids never move: every rule id
//! (`B<n>`) from B1 to the highest is defined exactly once in
//! `docs/behavior.md` (a withdrawn rule stays defined, as "Withdrawn"), none
//! was dropped from the end, and every id cited anywhere in the repository is
//! one of them.

use std::collections::BTreeMap;
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

/// The highest id the contract had defined when ids stopped moving: a rule is
/// withdrawn, never deleted, so the highest defined can only grow. Raise it
/// when you add rules; lowering it is deleting one.
const HIGHEST_ASSIGNED: u32 = 133;

/// What is wrong with the contract's ids: reused (defined more than once),
/// missing (a gap between B1 and the highest), or dropped from the end.
fn id_faults(rules: &BTreeMap<u32, usize>) -> Vec<String> {
    let mut faults = Vec::new();
    let twice: Vec<_> = rules.iter().filter(|(_, n)| **n > 1).map(|(id, _)| format!("B{id}")).collect();
    if !twice.is_empty() {
        faults.push(format!("defined more than once (an id is never reused): {}", twice.join(", ")));
    }
    let highest = rules.keys().max().copied().unwrap_or(0);
    let missing: Vec<_> =
        (1..=highest).filter(|id| !rules.contains_key(id)).map(|id| format!("B{id}")).collect();
    if !missing.is_empty() {
        faults.push(format!("missing (withdraw a rule, never delete it): {}", missing.join(", ")));
    }
    if highest < HIGHEST_ASSIGNED {
        let first = highest + 1;
        let span = if first == HIGHEST_ASSIGNED {
            format!("B{first}")
        } else {
            format!("B{first} to B{HIGHEST_ASSIGNED}")
        };
        faults.push(format!("{span} missing at the end (withdraw a rule, never delete it)"));
    }
    faults
}

#[test]
fn every_cited_rule_is_defined_once_in_docs_behavior_md() {
    let root = Path::new(ROOT);
    let contract = std::fs::read_to_string(root.join("docs/behavior.md")).expect("docs/behavior.md exists");
    let rules = defined(&contract);
    let faults = id_faults(&rules);
    assert!(faults.is_empty(), "docs/behavior.md's rule ids:\n  {}", faults.join("\n  "));

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

#[test]
fn a_reused_a_missing_or_a_dropped_id_is_a_fault() {
    let numbered = |ids: &[u32]| ids.iter().map(|id| format!("- B{id}. rule {id}\n")).collect::<String>();
    let all: Vec<u32> = (1..=HIGHEST_ASSIGNED).collect();
    assert!(id_faults(&defined(&numbered(&all))).is_empty());
    let withdrawn = numbered(&all).replace("- B7. rule 7", "- B7. Withdrawn: it no longer holds");
    assert!(id_faults(&defined(&withdrawn)).is_empty(), "a withdrawn rule still defines its id");
    let mut reused = all.clone();
    reused.push(7);
    assert!(id_faults(&defined(&numbered(&reused)))[0].contains("B7"), "reused");
    let missing: Vec<u32> = all.iter().copied().filter(|id| *id != 40).collect();
    assert!(id_faults(&defined(&numbered(&missing)))[0].contains("B40"), "missing");
    let dropped = &all[..all.len() - 1];
    assert!(id_faults(&defined(&numbered(dropped)))[0].contains(&format!("B{HIGHEST_ASSIGNED}")), "dropped");
    let added: Vec<u32> = (1..=HIGHEST_ASSIGNED + 6).collect();
    assert!(id_faults(&defined(&numbered(&added))).is_empty(), "new rules take the next numbers");
}
