//! `hostd runnable releases` and `hostd runnable prune`: the workspace's recorded releases,
//! listed with how each stands against its folder, and removed on request — never one a live
//! run (running or needing attention) in the reachable session store is pinned to.

use std::process::ExitCode;

use ::runnable::RunnableError;
use ::runnable::Runner;
use ::runnable::recorded::{self, RecordState, RecordedRelease};
use anyhow::Result;
use clap::Args;
use serde_json::{Value, json};
use sessionstore::{Store, StoreOptions};

use crate::output::Table;
use crate::reach::{HostLocation, TenantFlags};
use crate::runnable::report::{EXIT_REFUSED, print_json, refuse};

/// How many live runs pinned to a release are named when it is kept.
const RUNS_NAMED: usize = 5;

#[derive(Debug, Args)]
#[command(
    after_help = "Without names, prune removes the stale releases: `changed` (the folder no \
longer packages to the recorded digest, so building it again under the same version is a \
conflict), `orphan` (no declaration left) and `unreadable`. Name releases (`name` for every \
version, or `name@version`) to remove those whatever their state, or give --all.\n\n\
A release a live run is pinned to (same identity and digest, run running or needing attention) \
is kept: the session store is read from --store, else the data folder's Host's; a data folder \
without a store has no runs. Removed releases are only the workspace's records: packages already \
published to the store, and unpacked copies a Host may be running, stay.\n\n\
While developing, to change a handler under a version already built: `hostd runnable prune \
name@version`, then build (or invoke) again. Exit status: 0 done; 1 something named was not \
found, or a release was kept because a live run is pinned to it (what was removed is still \
printed)."
)]
pub struct PruneArgs {
    /// Releases to remove: `name` (every version) or `name@version`.
    references: Vec<String>,
    /// Remove every recorded release (still never one a live run is pinned to).
    #[arg(long, conflicts_with = "references")]
    all: bool,
    /// Say what would be removed and kept; remove nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    location: HostLocation,
    // Declared as for every family; recorded releases are not a tenant's, so they go unused.
    #[command(flatten)]
    _tenant: TenantFlags,
    /// Set from the global `--json` flag.
    #[arg(skip)]
    pub json: bool,
}

fn row(r: &RecordedRelease) -> Value {
    json!({
        "identity": r.identity,
        "digest": r.digest.as_ref().map(|d| d.to_string()),
        "size": r.size,
        "state": r.state.as_str(),
        "note": r.note,
    })
}

/// `hostd runnable releases`.
pub fn list(runner: &Runner, json: bool) -> ExitCode {
    let releases = match recorded::recorded(runner.workspace()) {
        Ok(r) => r,
        Err(e) => return refuse(&e, json),
    };
    if json {
        print_json(&Value::Array(releases.iter().map(row).collect()));
        return ExitCode::SUCCESS;
    }
    if releases.is_empty() {
        println!(
            "no recorded releases in workspace {} (build or invoke records one)",
            runner.workspace().name
        );
        return ExitCode::SUCCESS;
    }
    let table =
        Table::new(&["RELEASE", "STATE", "DIGEST", "SIZE"]).rows(releases.iter().map(|r| {
            [
                r.release.clone(),
                r.state.as_str().to_owned(),
                r.digest
                    .as_ref()
                    .map(|d| format!("{}…", &d.as_str()[..19]))
                    .unwrap_or_else(|| "-".into()),
                r.size.to_string(),
            ]
        }));
    print!("{}", table.render());
    for r in releases.iter().filter(|r| r.state != RecordState::Current) {
        if let Some(note) = &r.note {
            eprintln!("hostd: {} is {}: {note}", r.release, r.state.as_str());
        }
    }
    ExitCode::SUCCESS
}

/// Which recorded releases `a` asks to remove, or the first reference that matches none.
fn selected<'a>(
    releases: &'a [RecordedRelease],
    a: &PruneArgs,
    workspace: &str,
) -> Result<Vec<&'a RecordedRelease>, RunnableError> {
    if a.all {
        return Ok(releases.iter().collect());
    }
    if a.references.is_empty() {
        return Ok(releases.iter().filter(|r| r.state.stale()).collect());
    }
    let mut out: Vec<&RecordedRelease> = Vec::new();
    for reference in &a.references {
        let bare = reference
            .strip_prefix(&format!("{workspace}/"))
            .unwrap_or(reference);
        let matching: Vec<&RecordedRelease> = releases
            .iter()
            .filter(|r| {
                r.release == bare || r.release.split_once('@').is_some_and(|(n, _)| n == bare)
            })
            .collect();
        if matching.is_empty() {
            // The recorded releases of the name asked for (`wc@9` → `wc@1.0.0`), if any.
            let name = bare.split_once('@').map_or(bare, |(n, _)| n);
            return Err(RunnableError::NotFound {
                reference: reference.clone(),
                available: releases
                    .iter()
                    .filter(|r| r.release.split_once('@').is_some_and(|(n, _)| n == name))
                    .map(|r| r.release.clone())
                    .collect(),
            });
        }
        for r in matching {
            if !out.iter().any(|o| o.path == r.path) {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// `hostd runnable prune`.
pub async fn prune(runner: &Runner, a: PruneArgs) -> Result<ExitCode> {
    let releases = match recorded::recorded(runner.workspace()) {
        Ok(r) => r,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    let candidates = match selected(&releases, &a, &runner.workspace().name) {
        Ok(c) => c,
        Err(e) => return Ok(refuse(&e, a.json)),
    };
    // The live runs pinned to each candidate, from the store if there is one.
    let url = a.location.existing_store_url("hostd runnable prune")?;
    let mut pinned: Vec<Vec<String>> = vec![Vec::new(); candidates.len()];
    if let Some(url) = &url
        && !candidates.is_empty()
    {
        let store = Store::open(StoreOptions::new(url.clone())).await.map_err(|e| {
            anyhow::anyhow!(
                "[store] cannot open the session store to see which releases live runs are pinned to: {e}; nothing was removed"
            )
        })?;
        let mut failure = None;
        for (i, r) in candidates.iter().enumerate() {
            let Some(digest) = &r.digest else { continue };
            match store.live_runs_pinned_to(&r.identity, RUNS_NAMED).await {
                Ok(runs) => {
                    pinned[i] = runs
                        .into_iter()
                        .filter(|(_, pin)| pin.digest == digest.as_str())
                        .map(|(run, _)| run.as_str().to_owned())
                        .collect();
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        store.close().await;
        if let Some(e) = failure {
            anyhow::bail!("[store] {e}; nothing was removed");
        }
    }
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for (r, runs) in candidates.iter().zip(pinned) {
        if !runs.is_empty() {
            kept.push((*r, runs));
            continue;
        }
        if !a.dry_run
            && let Err(e) = recorded::remove(r)
        {
            report(&removed, &kept, a.dry_run, a.json);
            return Ok(refuse(&e, a.json));
        }
        removed.push(*r);
    }
    report(&removed, &kept, a.dry_run, a.json);
    Ok(if kept.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    })
}

fn report(
    removed: &[&RecordedRelease],
    kept: &[(&RecordedRelease, Vec<String>)],
    dry_run: bool,
    json: bool,
) {
    if json {
        print_json(&json!({
            "dry_run": dry_run,
            "removed": removed.iter().map(|r| row(r)).collect::<Vec<_>>(),
            "kept": kept
                .iter()
                .map(|(r, runs)| {
                    let mut v = row(r);
                    v["pinned_by"] = json!(runs);
                    v
                })
                .collect::<Vec<_>>(),
        }));
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    for r in removed {
        let digest = r.digest.as_ref().map(|d| d.to_string()).unwrap_or_default();
        if json {
            eprintln!(
                "hostd: {verb} {} {digest} ({})",
                r.release,
                r.state.as_str()
            );
        } else {
            println!("{verb} {} {digest} ({})", r.release, r.state.as_str());
        }
    }
    for (r, runs) in kept {
        eprintln!(
            "hostd: [pinned] kept {}: live run{} {} pinned to it",
            r.release,
            if runs.len() == 1 { "" } else { "s" },
            runs.join(", ")
        );
    }
    if removed.is_empty() && kept.is_empty() {
        eprintln!("hostd: nothing to prune");
    }
}
