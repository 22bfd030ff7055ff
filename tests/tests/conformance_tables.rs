//! The conformance tables in `docs/conformance/` keep to their own rules: every row's verdict
//! is one of the five words, the counts section (at the top, before the rows) says how many
//! rows have each verdict, every `match` row names a test, and every test a note names exists
//! in the workspace (a renamed or deleted test would otherwise leave a row claiming evidence
//! that is gone). On a mismatch the test prints every problem at once, with the counts section
//! as it should read, ready to paste.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const VERDICTS: &[&str] = &[
    "match",
    "deliberately changed",
    "differs",
    "missing",
    "n.a.",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tables() -> Vec<(String, String)> {
    let dir = root().join("docs/conformance");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            (name, text)
        })
        .collect();
    out.sort();
    out
}

/// A table line's cells; `\\|` inside a cell is a literal bar, not a border.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut escaped = false;
    for ch in inner.chars() {
        match ch {
            '|' if !escaped => out.push(String::new()),
            _ => {
                escaped = ch == '\\';
                if let Some(cell) = out.last_mut() {
                    cell.push(ch);
                }
                continue;
            }
        }
        escaped = false;
    }
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The table's rows as (row number, verdict, whole line), and the problems found reading it.
fn rows(name: &str, text: &str, problems: &mut Vec<String>) -> Vec<(u32, String, String)> {
    let mut verdict_col = None;
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("| # |") {
            verdict_col = cells(line)
                .iter()
                .position(|c| c.eq_ignore_ascii_case("verdict"));
            if verdict_col.is_none() {
                problems.push(format!("{name}: the table header has no Verdict column"));
            }
            continue;
        }
        let c = cells(line);
        let Some(Ok(number)) = line
            .starts_with("| ")
            .then(|| c.first().map(|n| n.parse::<u32>()))
            .flatten()
        else {
            continue;
        };
        let Some(col) = verdict_col else {
            problems.push(format!("{name}: row {number} comes before a header"));
            continue;
        };
        let verdict = c.get(col).cloned().unwrap_or_default();
        if !VERDICTS.contains(&verdict.as_str()) {
            problems.push(format!(
                "{name}: row {number} has the verdict {verdict:?}; the words are {VERDICTS:?}"
            ));
        }
        if !seen.insert(number) {
            problems.push(format!("{name}: row {number} appears twice"));
        }
        out.push((number, verdict, line.to_owned()));
    }
    if out.is_empty() {
        problems.push(format!("{name}: no rows found"));
    }
    out
}

/// The counts section as written: `- <verdict>: <n>` lines after `## Counts`.
fn written_counts(text: &str) -> Option<BTreeMap<String, usize>> {
    let start = text.find("\n## Counts")? + 1;
    let mut counts = BTreeMap::new();
    for line in text[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let Some(rest) = line.trim().strip_prefix("- ") else {
            continue;
        };
        if let Some((word, n)) = rest.rsplit_once(':')
            && let Ok(n) = n.trim().parse::<usize>()
        {
            counts.insert(word.trim().to_owned(), n);
        }
    }
    Some(counts)
}

fn counts_section(actual: &BTreeMap<String, usize>, total: usize) -> String {
    let mut s = String::from("## Counts\n\n");
    for v in VERDICTS {
        s.push_str(&format!(
            "- {v}: {}\n",
            actual.get(*v).copied().unwrap_or(0)
        ));
    }
    s.push_str(&format!("- total: {total}\n"));
    s
}

/// Every `fn` name in the workspace's Rust sources (tests included; build output, vendored
/// packages and the fuzz corpus left out).
fn workspace_fns() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(
                    name.as_str(),
                    "target" | "node_modules" | ".git" | "corpus" | "artifacts"
                ) {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                let Ok(text) = std::fs::read_to_string(&p) else {
                    continue;
                };
                for piece in text.split("fn ").skip(1) {
                    let ident: String = piece
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !ident.is_empty() {
                        out.insert(ident);
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&root(), &mut out);
    out
}

/// Names in backticks that read like a test's sentence: four or more lowercase words joined
/// by underscores (metric names, which end in a unit, are left out). A name cut short with
/// `…` is a prefix.
fn cited_tests(line: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for (i, piece) in line.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let (name, prefix) = match piece.strip_suffix('…') {
            Some(p) => (p.trim_end_matches('_'), true),
            None => (piece, false),
        };
        let words: Vec<&str> = name.split('_').collect();
        let sentence = words.len() >= 4
            && words.iter().all(|w| {
                !w.is_empty()
                    && w.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            })
            && words[0]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase());
        let metric = ["total", "seconds", "bytes", "count", "info"]
            .iter()
            .any(|unit| name.ends_with(&format!("_{unit}")));
        if sentence && !metric {
            out.push((name.to_owned(), prefix));
        }
    }
    out
}

#[test]
fn every_conformance_table_uses_the_five_verdicts_and_counts_them_truly() {
    let mut problems = Vec::new();
    for (name, text) in tables() {
        let rows = rows(&name, &text, &mut problems);
        let mut actual: BTreeMap<String, usize> = BTreeMap::new();
        for (_, verdict, _) in &rows {
            *actual.entry(verdict.clone()).or_default() += 1;
        }
        let expected = counts_section(&actual, rows.len());
        if let (Some(counts), Some(table)) = (text.find("\n## Counts"), text.find("\n| # |"))
            && counts > table
        {
            problems.push(format!(
                "{name}: the counts section belongs at the top, before the table"
            ));
        }
        match written_counts(&text) {
            None => problems.push(format!(
                "{name}: no counts section; add at the end:\n\n{expected}"
            )),
            Some(written) => {
                let mut want: BTreeMap<String, usize> = VERDICTS
                    .iter()
                    .map(|v| (v.to_string(), actual.get(*v).copied().unwrap_or(0)))
                    .collect();
                want.insert("total".into(), rows.len());
                if written != want {
                    problems.push(format!(
                        "{name}: the counts section says {written:?}; it should read:\n\n{expected}"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_test_a_conformance_row_names_exists() {
    let fns = workspace_fns();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, text) in tables() {
        let rows = rows(&name, &text, &mut Vec::new());
        for (number, _, line) in rows {
            for (test, prefix) in cited_tests(&line) {
                checked += 1;
                let found = if prefix {
                    fns.iter().any(|f| f.starts_with(&test))
                } else {
                    fns.contains(&test)
                };
                if !found {
                    problems.push(format!(
                        "{name} row {number}: no fn `{test}` in the workspace"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} cited tests found: the reader is broken"
    );
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_match_row_names_a_test() {
    let mut problems = Vec::new();
    let mut matches = 0;
    for (name, text) in tables() {
        for (number, verdict, line) in rows(&name, &text, &mut Vec::new()) {
            if verdict != "match" {
                continue;
            }
            matches += 1;
            if cited_tests(&line).is_empty() {
                problems.push(format!(
                    "{name} row {number}: says `match` but names no test (a test that fails without the behaviour, in backticks)"
                ));
            }
        }
    }
    assert!(
        matches > 100,
        "only {matches} match rows found: the reader is broken"
    );
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
