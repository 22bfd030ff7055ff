//! The README's "How it is built" section is true: its crate table names every workspace crate
//! with exactly the workspace crates it depends on, its layer picture is the one `cargo
//! metadata` gives, and the rules it states (what `host` and `controller` never compile) hold
//! transitively. On a mismatch the test prints the table column and the picture as they should
//! read, ready to paste.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Crates that must never be reached, even through another crate: a Host runs any
/// department's runtimes and hosts runs only through its extension seam; a controller
/// compiles no server and no reconciler.
const NEVER: &[(&str, &[&str])] = &[
    (
        "host",
        &[
            "harness",
            "flow",
            "runnable",
            "workflow",
            "strict-yaml",
            "run-hosting",
            "console",
            "controller",
            "cmd",
        ],
    ),
    (
        "controller",
        &[
            "host",
            "hostlink-server",
            "fleet",
            "harness",
            "run-hosting",
            "console",
            "cmd",
        ],
    ),
    ("hostlink-server", &["host", "harness", "department"]),
    ("fleet", &["host", "hostlink", "hostlink-server", "harness"]),
    (
        "workflow",
        &["host", "hostlink", "hostlink-server", "run-hosting"],
    ),
];

/// Each workspace crate (examples left out) and the workspace crates it depends on (normal
/// dependencies only: tests and benches may use more).
fn workspace() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let examples = root
        .join("examples")
        .canonicalize()
        .expect("examples folder");
    let members: Vec<&Value> = packages
        .iter()
        .filter(|p| {
            let manifest = Path::new(p["manifest_path"].as_str().unwrap_or_default());
            !manifest.starts_with(&examples)
        })
        .collect();
    let names: BTreeSet<String> = members
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    members
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(*d))
                .map(str::to_owned)
                .collect();
            (p["name"].as_str().unwrap_or_default().to_owned(), deps)
        })
        .collect()
}

fn readme_section() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme
        .find("\n## How it is built")
        .expect("a '## How it is built' section");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_owned()
}

/// The table's rows: crate name (first column, in backticks) and its "depends on" column.
fn readme_table(section: &str) -> BTreeMap<String, BTreeSet<String>> {
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let name = cells[0].trim_matches('`').to_owned();
            let deps = cells
                .last()
                .copied()
                .unwrap_or_default()
                .split(',')
                .map(|d| d.trim().trim_matches('`').to_owned())
                .filter(|d| !d.is_empty() && d != "—")
                .collect();
            (name, deps)
        })
        .collect()
}

/// Layer 1 holds crates with no workspace dependency; each other crate sits one layer below
/// its deepest dependency.
fn layers(ws: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn depth(
        c: &str,
        ws: &BTreeMap<String, BTreeSet<String>>,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
        if let Some(d) = memo.get(c) {
            return *d;
        }
        let d = 1 + ws[c]
            .iter()
            .map(|dep| depth(dep, ws, memo))
            .max()
            .unwrap_or(0);
        memo.insert(c.to_owned(), d);
        d
    }
    let mut memo = BTreeMap::new();
    let mut out: Vec<Vec<String>> = Vec::new();
    for c in ws.keys() {
        let d = depth(c, ws, &mut memo);
        if out.len() < d {
            out.resize(d, Vec::new());
        }
        out[d - 1].push(c.clone());
    }
    out
}

fn picture(ws: &BTreeMap<String, BTreeSet<String>>) -> String {
    layers(ws)
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{}  {}", i + 1, l.join("  ")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn reaches(ws: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(c) = todo.pop() {
        for d in ws.get(&c).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_readme_crate_table_names_every_crate_with_exactly_its_dependencies() {
    let ws = workspace();
    let table = readme_table(&readme_section());
    let expected: Vec<String> = ws
        .iter()
        .map(|(c, deps)| {
            let deps: Vec<String> = deps.iter().map(|d| format!("`{d}`")).collect();
            let deps = if deps.is_empty() {
                "—".to_owned()
            } else {
                deps.join(", ")
            };
            format!("`{c}`: {deps}")
        })
        .collect();
    assert_eq!(
        table,
        ws,
        "the README's crate table does not match cargo metadata; its 'depends on' column should read:\n{}",
        expected.join("\n")
    );
}

#[test]
fn the_readme_layer_picture_is_the_one_cargo_metadata_gives() {
    let ws = workspace();
    let want = picture(&ws);
    let section = readme_section();
    let fenced = section
        .split("```text\n")
        .nth(1)
        .and_then(|s| s.split("\n```").next())
        .expect("a ```text block with the layers");
    assert_eq!(
        fenced.trim(),
        want,
        "the README's layer picture should read:\n{want}"
    );
}

#[test]
fn no_crate_reaches_one_the_readme_says_it_never_compiles() {
    let ws = workspace();
    for (from, never) in NEVER {
        assert!(ws.contains_key(*from), "no crate {from}");
        let reached = reaches(&ws, from);
        for n in *never {
            assert!(
                !reached.contains(*n),
                "{from} depends on {n} (directly or through another crate)"
            );
        }
    }
}
