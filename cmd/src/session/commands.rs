//! `hostd session commands <S>`: the session's command inbox as the store holds it — for each
//! command its id, kind, state, outcome, the actor who admitted it (its recorded principal; a
//! `gate_response`'s is who answered the gate; `unknown` when none was recorded), the
//! residency epoch attempting (or claiming) it and,
//! when that epoch is the session's live lease, the Host holding it (the store keeps no Host
//! for an older epoch). Read-only; never admits, claims or settles anything.

use std::process::ExitCode;

use anyhow::Result;
use sessionstore::{CommandRecord, HostId, Millis};

use super::{Ctx, known_session, session_id};

/// One page of the inbox.
const PAGE: usize = sessionstore::limits::MAX_PAGE;

/// Prints every command of the session, in acceptance order.
pub(super) async fn list(ctx: &Ctx, session: &str) -> Result<ExitCode> {
    let session = session_id(session)?;
    let record = known_session(ctx, &session).await?;
    let store = ctx.controller.store();
    // Which Host holds each residency epoch is only known for the live lease; older epochs
    // are named by the epoch alone.
    let lease = store.residency(&record.tenant, &record.session).await?;
    let mut after = 0;
    let mut any = false;
    loop {
        let page = store
            .list_commands(&record.tenant, &record.session, after, PAGE)
            .await?;
        for c in &page {
            any = true;
            let epoch = residency_epoch(c);
            let host = lease
                .as_ref()
                .filter(|l| epoch.is_some_and(|e| l.epoch.0 == e))
                .and_then(|l| l.host.clone());
            print(ctx, c, epoch, host.as_ref())?;
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.accepted_order,
            _ => break,
        }
    }
    if !any && !ctx.out.is_json() {
        ctx.out
            .note(format_args!("session {session} has no commands"));
    }
    Ok(ExitCode::SUCCESS)
}

/// The residency epoch that attempted the command, else the one claiming it, else none.
fn residency_epoch(c: &CommandRecord) -> Option<u64> {
    c.attempt
        .as_ref()
        .map(|a| a.residency_epoch.0)
        .or_else(|| c.claim.as_ref().map(|cl| cl.epoch.0))
        .filter(|e| *e > 0)
}

fn print(ctx: &Ctx, c: &CommandRecord, epoch: Option<u64>, host: Option<&HostId>) -> Result<()> {
    let outcome = c.outcome.map(|o| o.as_str()).unwrap_or("-");
    let host_text = host.map_or("-", |h| h.as_str());
    let epoch_text = epoch.map_or_else(|| "-".to_owned(), |e| e.to_string());
    let settled = c.settled_at_ms.map(millis_text).unwrap_or_default();
    ctx.out.record(
        format_args!(
            "{}\t{}\t{}\t{}\tby {}\thost {}\tepoch {}{}",
            c.command,
            c.kind.as_str(),
            c.state.as_str(),
            outcome,
            crate::output::actor_text(c.principal.as_deref()),
            host_text,
            epoch_text,
            if settled.is_empty() {
                String::new()
            } else {
                format!("\tsettled {settled}")
            }
        ),
        || {
            serde_json::json!({
                "command_id": c.command.as_str(),
                "order": c.accepted_order,
                "kind": c.kind.as_str(),
                "state": c.state.as_str(),
                "outcome": c.outcome.map(|o| o.as_str()),
                "reason": c.reason,
                "actor": c.principal,
                "attempting_host": host.map(|h| h.as_str()),
                "epoch": epoch,
                "attempted": c.attempt.is_some(),
                "settled_at_ms": c.settled_at_ms,
            })
        },
    )
}

fn millis_text(ms: Millis) -> String {
    let secs = u64::try_from(ms / 1000).unwrap_or(0);
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}
