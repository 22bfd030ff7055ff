//! `hostd hosts` and `hostd controller`: the fleet as an operator sees it. `hosts ls` lists the
//! Host registry (every advertisement not yet collected: id, endpoint, generation, last
//! heartbeat, capacity used and free, draining and who asked, sessions held); `hosts drains`
//! lists who asked which Host incarnation to drain, and when; `controller` runs the fleet
//! reconciler alone, for users who place sessions apart from their Hosts. Both read the store
//! the location flags name (`--store`, else the data folder's; an operator's view: no tenant
//! token); neither writes a command or a lease.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use fleet::{Reconciler, sessions_by_host};
use sessionstore::Store;

use crate::config::FleetOptions;
use crate::output::{Output, Table};
use crate::reach::HostLocation;
use crate::signals::StopSignals;

/// The Host registry of the store.
#[derive(Debug, Args)]
pub struct HostsArgs {
    #[command(flatten)]
    location: HostLocation,
    #[command(subcommand)]
    command: HostsCommand,
}

#[derive(Debug, Subcommand)]
enum HostsCommand {
    /// List every Host of the registry: id, endpoint, generation, last heartbeat, capacity
    /// used/free, draining (and who asked), sessions held (expired ones until they are
    /// collected).
    Ls,
    /// List who asked a Host to drain, and when: every incarnation of HOST, or of every Host,
    /// the newest first (kept after the Host is gone).
    Drains {
        /// A Host id (default: every Host).
        host: Option<String>,
    },
}

/// Run the fleet reconciler alone: place sessions that have admitted work and no live Host
/// on live, accepting Hosts (one reconciler of a fleet acts at a time). Stops on SIGTERM or
/// SIGINT.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    location: HostLocation,
    /// This reconciler's name in the leadership (default: hostd-controller-<pid>).
    #[arg(long = "name")]
    name: Option<String>,
    #[command(flatten)]
    fleet: crate::config::FleetFlags,
}

pub async fn hosts(args: HostsArgs, out: Output) -> Result<ExitCode> {
    let store = args.location.open_store("hostd hosts").await?;
    match args.command {
        HostsCommand::Ls => list(&store, &out).await?,
        HostsCommand::Drains { host } => {
            let host = host
                .map(sessionstore::HostId::new)
                .transpose()
                .context("the Host id")?;
            drains(&store, host.as_ref(), &out).await?
        }
    }
    store.close().await;
    Ok(ExitCode::SUCCESS)
}

async fn list(store: &Store, out: &Output) -> Result<()> {
    let now = store.now_ms().await?;
    let targets = store.targets(false).await?;
    let held = sessions_by_host(&store.host_loads().await?);
    if targets.is_empty() && !out.is_json() {
        out.note("no Host is registered");
        return Ok(());
    }
    let mut table = Table::new(&[
        "HOST",
        "ENDPOINT",
        "GENERATION",
        "STATE",
        "HEARTBEAT",
        "USED",
        "FREE",
        "SESSIONS",
    ])
    .right(2)
    .right(5)
    .right(6);
    for t in targets {
        let (sessions, placing) = held.get(&t.host).copied().unwrap_or((0, 0));
        let used = t.weight_used;
        let free = t.capacity.saturating_sub(used);
        let live = t.is_live(now);
        let state = match (live, t.accepting) {
            (false, _) => "expired",
            (true, true) => "accepting",
            (true, false) => "draining",
        };
        let since = (now - t.observed_at_ms).max(0);
        let drain = store.drain_request(&t.host, t.generation).await?;
        let state = match (&drain, state) {
            (Some(d), "draining") => format!("draining (asked by {})", d.requested_by),
            _ => state.to_owned(),
        };
        if out.is_json() {
            out.line(serde_json::json!({
                "host_id": t.host.as_str(),
                "endpoint": t.endpoint,
                "generation": t.generation,
                "placement": t.placement.as_str(),
                "isolation_class": t.isolation_class,
                "last_heartbeat_ms": t.observed_at_ms,
                "expires_at_ms": t.expires_at_ms,
                "live": live,
                "accepting": t.accepting,
                "draining": live && !t.accepting,
                "drain_requested_by": drain.as_ref().map(|d| d.requested_by.as_str()),
                "capacity": t.capacity,
                "capacity_used": used,
                "capacity_free": free,
                "sessions": sessions,
                "placing": placing,
            }))?;
            continue;
        }
        table.row([
            t.host.to_string(),
            t.endpoint.clone(),
            t.generation.to_string(),
            state,
            format!("{:.1}s ago", since as f64 / 1000.0),
            format!("{used}/{}", t.capacity),
            free.to_string(),
            if placing > 0 {
                format!("{sessions} (+{placing} placing)")
            } else {
                sessions.to_string()
            },
        ]);
    }
    if !out.is_json() {
        out.table(&table)?;
    }
    Ok(())
}

async fn drains(store: &Store, host: Option<&sessionstore::HostId>, out: &Output) -> Result<()> {
    let records = store.drain_requests(host).await?;
    if out.is_json() {
        let rows: Vec<_> = records
            .iter()
            .map(|d| {
                serde_json::json!({
                    "host_id": d.host.as_str(),
                    "generation": d.generation,
                    "requested_by": d.requested_by,
                    "requested_at_ms": d.requested_at_ms,
                })
            })
            .collect();
        return out.line(serde_json::json!({ "drains": rows }));
    }
    if records.is_empty() {
        out.note("no drain was requested");
        return Ok(());
    }
    let mut table = Table::new(&["HOST", "GENERATION", "REQUESTED BY", "REQUESTED AT"]).right(1);
    for d in &records {
        table.row([
            d.host.to_string(),
            d.generation.to_string(),
            d.requested_by.clone(),
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_millis(
                        u64::try_from(d.requested_at_ms).unwrap_or(0),
                    ),
            )
            .to_string(),
        ]);
    }
    out.table(&table)
}

pub async fn controller(args: ControllerArgs, out: Output) -> Result<ExitCode> {
    let mut stop = StopSignals::listen()?;
    let mut fleet = FleetOptions::default();
    args.fleet.overlay(&mut fleet);
    let options = fleet
        .reconciler_options()
        .context("the fleet reconciler's options")?;
    let store = args.location.open_store("hostd controller").await?;
    let who = args
        .name
        .unwrap_or_else(|| format!("hostd-controller-{}", std::process::id()));
    let reconciler = Reconciler::new(store.clone(), options, &who)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(reconciler.run(shutdown.clone()));
    out.note(format_args!("fleet reconciler {who} running"));
    let signal = stop.next().await;
    tracing::info!(signal, "stopping the fleet reconciler");
    shutdown.cancel();
    let _ = running.await;
    store.close().await;
    Ok(ExitCode::SUCCESS)
}
