//! `hostd session`: the command line as a controller. Owns argument parsing and rendering;
//! every action is `controller`'s. In the embedded default it finds the store, the Host and
//! the local tenant's token in the data folder `hostd serve` wrote (waiting a bounded time for
//! a Host that is starting); against PostgreSQL each is given by flag or environment.
//!
//! Before it reads or admits anything it authenticates the token: against the data folder's
//! credentials (the digests the local Host checks) or, against a fleet, by a HostLink
//! handshake with a live Host. A command it admitted is always named by its id, on success and
//! on failure, and one whose outcome is not yet known ends with its own exit status
//! ([`crate::exit::ADMITTED_PENDING`]) and the exact command that resends it idempotently.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use controller::client::{ClientError, HostLinkClient, Publication};
use controller::{Controller, ControllerError};
use hostlink::auth::CredentialStore;
use serde_json::Value;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CommandRecord, CommandState, CompatibilityId, ErrorCode, GateState,
    ResidencyState, SessionId, SessionRecord, Store, StoreOptions, TenantId,
};

use crate::agents::{SCRIPTED_AGENT, build_of};
use crate::exit::{CliError, controller_code};
use crate::local::{DataDir, LocalHost};
use crate::output::{Output, Progress, Table};
use crate::reach::{ClientFlags, WaitForHost};
use crate::signals::StopSignals;

mod commands;

/// How long `send`, `interrupt` and `answer` wait for the Host to apply what they admitted.
const APPLY_WAIT: Duration = Duration::from_secs(60);
/// How long `gates --wait` and `answer ... next` wait for a gate to open.
const GATE_WAIT: Duration = Duration::from_secs(30);
/// One page of `ls`.
const LIST_PAGE: usize = sessionstore::limits::MAX_PAGE;

/// Create sessions, send them messages, answer their gates, and watch them — as a controller.
#[derive(Debug, Args)]
#[command(
    after_help = "With `hostd serve` running with its defaults, no flags are needed:\n  \
S=$(hostd session create)\n  hostd session send $S \"hello\"\n  hostd session watch $S\n\
Against a fleet: --store postgres://... --tenant T --token ... (or HOST_STORE_URL, HOST_TENANT, HOST_TENANT_TOKEN).\n\n\
Exit status: 0 done; 1 refused or failed, nothing admitted; 2 usage; 3 the command ended without \
being applied; 4 admitted, outcome not yet known (resend it with --command-id <id>)."
)]
pub struct SessionArgs {
    #[command(flatten)]
    client: ClientFlags,
    #[command(flatten)]
    wait: WaitForHost,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// Create a session (optionally with a first message) and place it on a Host; prints its id.
    Create {
        /// The session id (default: a fresh one).
        #[arg(long)]
        session: Option<String>,
        /// The agent (`assistant` is the scripted one; `openai` when configured).
        #[arg(long, default_value = SCRIPTED_AGENT)]
        agent: String,
        /// The agent's runtime build (default: the default department's build of the agent).
        #[arg(long)]
        build: Option<String>,
        /// A first message.
        #[arg(long)]
        message: Option<String>,
        /// The create command's id, to make a retry idempotent (default: a fresh one).
        #[arg(long)]
        command_id: Option<String>,
    },
    /// Send a message and wait (up to 60 s) until the Host has applied it.
    Send {
        /// The session id (as `hostd session create` printed it).
        session: String,
        /// The message text.
        text: String,
        /// A command id, to make retries idempotent (default: a fresh one, printed).
        #[arg(long)]
        command_id: Option<String>,
    },
    /// Interrupt the turn in flight.
    Interrupt {
        /// The session id.
        session: String,
        /// A command id, to make retries idempotent (default: a fresh one, printed).
        #[arg(long)]
        command_id: Option<String>,
    },
    /// Answer a gate: approve/deny a permission, or `answer --text ...` a question. GATE is a
    /// gate id from `hostd session gates`, or `next` for the oldest open gate.
    Answer {
        /// The session id.
        session: String,
        /// A gate id from `hostd session gates`, or `next` for the oldest open gate.
        gate: String,
        /// The answer: approve or deny (a permission), answer (a question).
        action: String,
        /// The answer's text (for `answer`).
        #[arg(long)]
        text: Option<String>,
        /// A command id, to make retries idempotent (default: a fresh one, printed).
        #[arg(long)]
        command_id: Option<String>,
    },
    /// List the session's open gates.
    Gates {
        /// The session id.
        session: String,
        /// Wait (up to 30 s) until at least one gate is open.
        #[arg(long)]
        wait: bool,
    },
    /// Stream the session's events as they are committed (Ctrl-C to stop).
    Watch {
        /// The session id.
        session: String,
        /// Also show the live text as it is generated.
        #[arg(long)]
        previews: bool,
    },
    /// Print the session's durable public journal.
    Journal {
        /// The session id.
        session: String,
        /// Only events after this journal sequence.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// List the tenant's sessions (all of them, page by page).
    Ls,
    /// List the session's commands: id, kind, state, outcome, attempting Host and epoch.
    Commands {
        /// The session id.
        session: String,
    },
}

impl SessionCommand {
    /// Whether the command needs a Host (to place the session), not just the store.
    fn needs_host(&self) -> bool {
        !matches!(
            self,
            SessionCommand::Gates { .. }
                | SessionCommand::Journal { .. }
                | SessionCommand::Ls
                | SessionCommand::Commands { .. }
        )
    }
}

struct Ctx {
    controller: Controller,
    out: Output,
    /// What the data folder said about its Host (embedded default only).
    local: Option<LocalHost>,
}

/// Waits (bounded) for the data folder's Host when the command needs one or the folder is not
/// set up yet; returns what it last saw.
async fn await_local(
    data: &DataDir,
    bound: Duration,
    needs_host: bool,
    tenant: &str,
    out: &Output,
) -> Result<LocalHost> {
    let started = tokio::time::Instant::now();
    let mut progress = Progress::new(out, "waiting for the local Host to be ready", bound);
    loop {
        let seen = data.probe().await?;
        let settled = match &seen {
            LocalHost::Ready(_) | LocalHost::Gone(_) => true,
            LocalHost::NotReady(_) => {
                !needs_host && data.store_path().exists() && data.token_path(tenant).exists()
            }
        };
        if settled || started.elapsed() >= bound {
            return Ok(seen);
        }
        progress.tick();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn context(
    flags: &ClientFlags,
    wait: &WaitForHost,
    out: Output,
    needs_host: bool,
) -> Result<Ctx> {
    let location = &flags.location;
    location.refuse_endpoint_alone("hostd session")?;
    let data = location.data();
    let local = match &location.store {
        Some(_) => None,
        None => {
            let tenant = flags.tenant.tenant_name(None);
            Some(await_local(&data, wait.bound(), needs_host, &tenant, &out).await?)
        }
    };
    let runtime = local.as_ref().and_then(LocalHost::runtime);
    let store_url = match (&location.store, runtime) {
        (Some(s), _) => s.clone(),
        (None, Some(r)) => r.store.clone(),
        (None, None) => {
            if !data.store_path().exists() {
                return Err(CliError::refused(
                    "no_store",
                    format!(
                        "no store: no Host became ready in {} within {} (start `hostd serve`, \
                         which keeps one there), or pass --store",
                        location.data_dir.display(),
                        humantime::format_duration(wait.bound())
                    ),
                )
                .into());
            }
            data.store_url()?
        }
    };
    let tenant = flags.tenant.tenant(runtime)?;
    let token = flags.tenant.token(&data, &tenant)?;
    let store = Store::open(StoreOptions::new(store_url.clone()))
        .await
        .with_context(|| {
            format!(
                "opening the store {}",
                if store_url.starts_with("postgres") {
                    "postgres://…"
                } else {
                    store_url.as_str()
                }
            )
        })?;
    // The data folder's credentials are the ones its Host checks only in the embedded
    // default (a Host serving another store records no local tenant).
    let embedded = location.store.is_none() && runtime.is_none_or(|r| !r.tenant.is_empty());
    let local_credentials = embedded.then(|| data.credentials_path());
    let actor = authenticate(&store, &tenant, &token, local_credentials.as_deref()).await?;
    Ok(Ctx {
        controller: Controller::new(store, tenant, token)
            .with_client(flags.link.client_options())
            .with_actor(actor),
        out,
        local,
    })
}

fn refused_token(tenant: &TenantId) -> anyhow::Error {
    CliError::refused(
        "unauthenticated",
        format!("the token was refused for tenant {tenant}: nothing was read or admitted"),
    )
    .into()
}

/// Checks the token before anything is read or admitted: against the local Host's credential
/// digests when they are at hand, else by a HostLink handshake with a live Host (which checks
/// it against its own). Returns the actor what this command admits is recorded as: the
/// principal the token names (a JWT's `sub`), else `tenant:<tenant>`.
async fn authenticate(
    store: &Store,
    tenant: &TenantId,
    token: &str,
    local_credentials: Option<&std::path::Path>,
) -> Result<String> {
    if let Some(path) = local_credentials.filter(|p| p.exists()) {
        let creds = CredentialStore::load(Some(path), None)
            .with_context(|| format!("reading the credentials in {}", path.display()))?;
        return creds
            .check(tenant, token)
            .map(|g| g.actor(tenant))
            .map_err(|_| refused_token(tenant));
    }
    let now = store.now_ms().await?;
    let mut last = None;
    for target in store.targets(true).await? {
        if !target.is_live(now) {
            continue;
        }
        match HostLinkClient::connect(&target.endpoint, tenant, token, "hostd-auth").await {
            Ok(link) => {
                link.close();
                // The Host accepted the token: a JWT's `sub` is the principal it verified.
                let principal = hostlink::jwt::decode_unverified(token)
                    .ok()
                    .and_then(|t| t.claims.sub);
                return Ok(hostlink::auth::actor_of(tenant, principal.as_deref()));
            }
            Err(ClientError::Disconnected { code, .. })
                if code == hostlink::Disconnect::AUTHENTICATION_FAILED.code =>
            {
                return Err(refused_token(tenant));
            }
            Err(e) => last = Some(format!("{}: {e}", target.host)),
        }
    }
    Err(CliError::refused(
        "cannot_authenticate",
        format!(
            "cannot check the token for tenant {tenant}: no live Host answered{}; nothing was \
             read or admitted",
            last.map(|l| format!(" (last: {l})")).unwrap_or_default()
        ),
    )
    .into())
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

fn session_id(s: &str) -> Result<SessionId> {
    SessionId::new(s).context("session id")
}

fn command_id(given: Option<String>, prefix: &str) -> Result<CommandId> {
    CommandId::new(given.unwrap_or_else(|| new_id(prefix))).context("--command-id")
}

/// The session's catalog record, or a coded refusal when the tenant has no such session.
async fn known_session(ctx: &Ctx, session: &SessionId) -> Result<SessionRecord> {
    match ctx
        .controller
        .store()
        .session(ctx.controller.tenant(), session)
        .await
    {
        Ok(r) => Ok(r),
        Err(e) if e.code() == ErrorCode::NotFound => Err(CliError::refused(
            "session_not_found",
            format!(
                "tenant {} has no session {session} (see `hostd session ls`)",
                ctx.controller.tenant()
            ),
        )
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// A word safe to paste into a POSIX shell.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Why a command admitted for `session` is not applied yet, in the user's terms.
async fn pending_cause(ctx: &Ctx, session: &SessionId, error: Option<&ControllerError>) -> String {
    let mut cause = match error {
        Some(ControllerError::NoHost(_)) => {
            "no live Host is accepting sessions (start `hostd serve`)".to_owned()
        }
        Some(e) => format!("placing the session failed: {e} [{}]", controller_code(e)),
        None => format!(
            "the Host did not apply it within {} s",
            APPLY_WAIT.as_secs()
        ),
    };
    if let Some(LocalHost::Gone(r)) = &ctx.local {
        cause.push_str(&format!(
            "; the local Host {} (pid {}) is not running: it stopped without draining",
            r.host_id, r.pid
        ));
    }
    let store = ctx.controller.store();
    if let (Ok(Some(reg)), Ok(now)) = (
        store.registration(ctx.controller.tenant(), session).await,
        store.now_ms().await,
    ) && reg.residency == ResidencyState::Resident
        && reg.expires_at_ms > now
        && error.is_some()
    {
        let left = (reg.expires_at_ms - now + 999) / 1000;
        cause.push_str(&format!(
            "; the session is still leased to Host {} (generation {}) for {left} s more, and \
             no other Host may take it before that lease expires",
            reg.host, reg.host_generation
        ));
    }
    cause
}

/// What a command admitted and not yet applied became: the coded error that names it, its
/// cause and how to resend it.
async fn admitted_pending(
    ctx: &Ctx,
    rec: &CommandRecord,
    error: Option<&ControllerError>,
    resend: &str,
) -> anyhow::Error {
    let cause = pending_cause(ctx, &rec.session, error).await;
    CliError::AdmittedPending {
        command: rec.command.to_string(),
        cause,
        resend: resend.to_owned(),
    }
    .into()
}

fn outcome_line(rec: &CommandRecord) -> String {
    format!(
        "{} {}: {}{}",
        rec.kind,
        rec.command,
        rec.outcome
            .map(|o| o.as_str())
            .unwrap_or(rec.state.as_str()),
        rec.reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    )
}

fn command_json(rec: &CommandRecord) -> Value {
    serde_json::json!({
        "command_id": rec.command.as_str(),
        "session_id": rec.session.as_str(),
        "kind": rec.kind.as_str(),
        "state": rec.state.as_str(),
        "outcome": rec.outcome.map(|o| o.as_str()),
        "reason": rec.reason,
    })
}

/// Prints a terminal command's outcome; an outcome other than applied is an error naming it.
fn report_terminal(ctx: &Ctx, done: &CommandRecord) -> Result<ExitCode> {
    ctx.out.record(outcome_line(done), || command_json(done))?;
    if done.state == CommandState::Applied {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(CliError::NotApplied {
            command: done.command.to_string(),
            state: done
                .outcome
                .map(|o| o.as_str())
                .unwrap_or(done.state.as_str())
                .to_owned(),
            reason: done
                .reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
        }
        .into())
    }
}

/// Whether a Host's refusal to attach passes by itself: the previous holder's lease has not
/// expired yet (`epoch_mismatch`), or the session is being released.
fn passes(e: &ControllerError) -> bool {
    use hostlink::codes::HostLinkErrorCode as C;
    matches!(e, ControllerError::Refused(r) if matches!(r.code(), C::EpochMismatch | C::Releasing))
}

/// Places the session, trying again until `deadline` while a live Host refuses for a reason
/// that passes by itself; anything else (no live Host, a Host that does not answer) is
/// returned at once.
async fn place_until(
    ctx: &Ctx,
    session: &SessionId,
    deadline: tokio::time::Instant,
) -> Result<controller::Placed, ControllerError> {
    let bound = deadline.saturating_duration_since(tokio::time::Instant::now());
    let mut progress = Progress::new(
        &ctx.out,
        format!(
            "waiting for a Host to take session {session} (the previous holder's lease must expire)"
        ),
        bound,
    );
    loop {
        match ctx.controller.place(session).await {
            Ok(p) => return Ok(p),
            Err(e) if passes(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "placement refused for now; trying again");
                progress.tick();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Admits `body` (idempotently by `command`), delivers it and waits for its outcome.
async fn admit_and_deliver(
    ctx: &Ctx,
    session: &SessionId,
    command: CommandId,
    body: CommandBodyV1,
    resend: &str,
) -> Result<ExitCode> {
    let rec = ctx.controller.admit(session, command, body).await?;
    deliver_and_report(ctx, session, &rec, resend).await
}

/// Places the session, delivers the admitted command `rec` and waits for it to end, printing
/// its outcome. A command not ended within the wait stays in the inbox for the Host's own
/// pass, and is reported as admitted, not yet applied, with `resend` to wait for it again.
async fn deliver_and_report(
    ctx: &Ctx,
    session: &SessionId,
    rec: &CommandRecord,
    resend: &str,
) -> Result<ExitCode> {
    if rec.state.is_terminal() {
        // A resend of a command that already ended: its outcome, once.
        return report_terminal(ctx, rec);
    }
    let deadline = tokio::time::Instant::now() + APPLY_WAIT;
    let placed = match place_until(ctx, session, deadline).await {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(command = %rec.command, error = %e, "placement failed after admission");
            // The Host's own pass may still have applied it.
            if let Some(done) = ctx
                .controller
                .wait_terminal(session, &rec.command, Duration::ZERO)
                .await?
            {
                return report_terminal(ctx, &done);
            }
            return Err(admitted_pending(ctx, rec, Some(&e), resend).await);
        }
    };
    if let Err(e) = ctx.controller.bind_and_stream(&placed, false).await {
        tracing::debug!(error = %e, "bind before delivery failed; the Host's own pass will pick the command up");
    }
    let _ = ctx.controller.deliver(&placed, &rec.command).await;
    let mut progress = Progress::new(
        &ctx.out,
        format!("waiting for command {} to be applied", rec.command),
        APPLY_WAIT,
    );
    loop {
        let step = Duration::from_millis(250)
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        if let Some(done) = ctx
            .controller
            .wait_terminal(session, &rec.command, step)
            .await?
        {
            drop(progress);
            return report_terminal(ctx, &done);
        }
        if tokio::time::Instant::now() >= deadline {
            drop(progress);
            return Err(admitted_pending(ctx, rec, None, resend).await);
        }
        progress.tick();
    }
}

fn render(body: &Value) -> Option<String> {
    let t = body.get("type")?.as_str()?;
    Some(match t {
        "session_started" => "— session started".to_owned(),
        "user_message" => format!("user: {}", body["text"].as_str().unwrap_or("")),
        "turn_started" => return None,
        "assistant_message" => {
            let text = body["text"].as_str().unwrap_or("");
            let calls: Vec<String> = body["tool_calls"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|c| {
                            format!("{}({})", c["name"].as_str().unwrap_or("?"), c["arguments"])
                        })
                        .collect()
                })
                .unwrap_or_default();
            match (text.is_empty(), calls.is_empty()) {
                (false, true) => format!("assistant: {text}"),
                (true, false) => format!("assistant calls {}", calls.join(", ")),
                (false, false) => format!("assistant: {text} [calls {}]", calls.join(", ")),
                (true, true) => "assistant: (empty)".into(),
            }
        }
        "tool_result" => format!(
            "tool {}{}: {}",
            body["name"].as_str().unwrap_or("?"),
            if body["is_error"].as_bool() == Some(true) {
                " (error)"
            } else {
                ""
            },
            body["content"].as_str().unwrap_or("")
        ),
        "gate_opened" => format!(
            "gate {} ({}): {}  [answer: hostd session answer <session> {} {}]",
            body["gate_id"].as_str().unwrap_or("?"),
            body["kind"].as_str().unwrap_or("?"),
            body["prompt"].as_str().unwrap_or(""),
            body["gate_id"].as_str().unwrap_or("?"),
            body["actions"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join("|"))
                .unwrap_or_default()
        ),
        "gate_resolved" => format!(
            "gate {} resolved: {}",
            body["gate_id"].as_str().unwrap_or("?"),
            body["action"].as_str().unwrap_or("?")
        ),
        "turn_done" => "— turn done".to_owned(),
        "turn_failed" => format!(
            "— turn failed: {}",
            body["error"]["message"].as_str().unwrap_or("")
        ),
        "turn_interrupted" => format!(
            "— turn interrupted ({})",
            body["reason"].as_str().unwrap_or("")
        ),
        other => format!("({other})"),
    })
}

pub async fn run(args: SessionArgs, out: Output) -> Result<ExitCode> {
    let ctx = context(&args.client, &args.wait, out, args.command.needs_host()).await?;
    match args.command {
        SessionCommand::Create {
            session,
            agent,
            build,
            message,
            command_id: given,
        } => {
            let session = session_id(&session.unwrap_or_else(|| new_id("s")))?;
            let build = match build.or_else(|| build_of(&agent).map(str::to_owned)) {
                Some(b) => b,
                None => {
                    return Err(CliError::refused(
                        "unknown_agent",
                        format!("unknown agent {agent}: give its --build"),
                    )
                    .into());
                }
            };
            let command = command_id(given, "create")?;
            let (_, create) = ctx
                .controller
                .create_session(
                    session.clone(),
                    AgentId::new(agent.clone()).context("--agent")?,
                    CompatibilityId::new(build).context("--build")?,
                    message,
                    command,
                )
                .await?;
            let resend = format!(
                "hostd session create --session {} --agent {} --command-id {}",
                shell_word(session.as_str()),
                shell_word(&agent),
                create.command
            );
            let deadline = tokio::time::Instant::now() + APPLY_WAIT;
            let placed = match place_until(&ctx, &session, deadline).await {
                Ok(p) => p,
                Err(e) => {
                    // The session exists and its create command is admitted: name both.
                    ctx.out.record(&session, || {
                        serde_json::json!({"session_id": session.as_str(), "command_id": create.command.as_str(), "state": create.state.as_str()})
                    })?;
                    return Err(admitted_pending(&ctx, &create, Some(&e), &resend).await);
                }
            };
            let _ = ctx.controller.deliver(&placed, &create.command).await;
            // stdout is the session id alone (`S=$(hostd session create)`); the admitted
            // command is named beside it.
            if !ctx.out.is_json() {
                ctx.out.note(format_args!(
                    "created session {session} (command {})",
                    create.command
                ));
            }
            ctx.out.record(&session, || {
                serde_json::json!({"session_id": session.as_str(), "command_id": create.command.as_str(), "host_id": placed.observation.host_id.as_str(), "lease_epoch": placed.observation.lease_epoch.get()})
            })?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Send {
            session,
            text,
            command_id: given,
        } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            let id = command_id(given, "input")?;
            let resend = format!(
                "hostd session send {} {} --command-id {id}",
                shell_word(session.as_str()),
                shell_word(&text)
            );
            admit_and_deliver(&ctx, &session, id, CommandBodyV1::Input { text }, &resend).await
        }
        SessionCommand::Interrupt {
            session,
            command_id: given,
        } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            let id = command_id(given, "interrupt")?;
            let resend = format!(
                "hostd session interrupt {} --command-id {id}",
                shell_word(session.as_str())
            );
            admit_and_deliver(&ctx, &session, id, CommandBodyV1::Interrupt, &resend).await
        }
        SessionCommand::Answer {
            session,
            gate,
            action,
            text,
            command_id: given,
        } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            let gate = if gate == "next" {
                match open_gates(&ctx, &session, Some(GATE_WAIT)).await?.first() {
                    Some(g) => g.gate.to_string(),
                    None => {
                        return Err(CliError::refused(
                            "no_open_gate",
                            format!(
                                "session {session} has no open gate (waited {} s)",
                                GATE_WAIT.as_secs()
                            ),
                        )
                        .into());
                    }
                }
            } else {
                gate
            };
            let gate_id = uuid::Uuid::parse_str(&gate).map_err(|_| {
                CliError::refused(
                    "gate_not_found",
                    format!(
                        "{gate} is not a gate id (a UUID from `hostd session gates {session}`, \
                         or `next`)"
                    ),
                )
            })?;
            check_answer(&ctx, &session, &gate_id.to_string(), &action).await?;
            let id = command_id(given, "answer")?;
            let resend = format!(
                "hostd session answer {} {gate_id} {}{} --command-id {id}",
                shell_word(session.as_str()),
                shell_word(&action),
                text.as_deref()
                    .map(|t| format!(" --text {}", shell_word(t)))
                    .unwrap_or_default()
            );
            let rec = ctx
                .controller
                .answer(&session, id, gate_id, &action, text)
                .await?;
            deliver_and_report(&ctx, &session, &rec, &resend).await
        }
        SessionCommand::Gates { session, wait } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            let bound = wait.then_some(GATE_WAIT);
            let gates = open_gates(&ctx, &session, bound).await?;
            if ctx.out.is_json() {
                let v: Vec<Value> = gates
                    .iter()
                    .map(|g| serde_json::json!({"gate_id": g.gate.as_str(), "kind": g.kind, "prompt": g.prompt_summary, "opened_seq": g.opened_seq, "deadline_ms": g.deadline_ms}))
                    .collect();
                ctx.out.line(Value::Array(v))?;
            } else if gates.is_empty() {
                ctx.out.line("no open gates")?;
            } else {
                let table =
                    Table::new(&["GATE", "KIND", "PROMPT"])
                        .gap(1)
                        .least_width(0, 38)
                        .least_width(1, 11)
                        .rows(gates.iter().map(|g| {
                            [g.gate.to_string(), g.kind.clone(), g.prompt_summary.clone()]
                        }));
                ctx.out.table(&table)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Watch { session, previews } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            // The durable past first, then the live tail.
            let page = ctx.controller.journal(&session, 0, None, 1000).await?;
            let mut last = 0;
            for e in &page.events {
                last = e.seq;
                print_event(&ctx, e.seq, &e.body)?;
            }
            let placed = ctx
                .controller
                .place(&session)
                .await
                .with_context(|| format!("placing session {session} on a Host"))?;
            let mut rx = ctx.controller.bind_and_stream(&placed, previews).await?;
            // What was committed between the first read and the bind: read it again now that
            // the live tail is buffered (events are de-duplicated by sequence).
            let page = ctx.controller.journal(&session, last, None, 1000).await?;
            for e in &page.events {
                last = e.seq;
                print_event(&ctx, e.seq, &e.body)?;
            }
            let mut mid_preview = false;
            let mut stop = StopSignals::listen()?;
            loop {
                tokio::select! {
                    _ = stop.next() => return Ok(ExitCode::SUCCESS),
                    p = rx.recv() => match p {
                        None => {
                            return Err(CliError::refused(
                                "stream_ended",
                                "the Host ended the stream; run watch again to continue",
                            )
                            .into());
                        }
                        Some(Publication::Enduring(e)) => {
                            let seq = e.journal_seq.get();
                            if seq <= last { continue; }
                            last = seq;
                            if mid_preview {
                                ctx.out.line("")?;
                                mid_preview = false;
                            }
                            print_event(&ctx, seq, e.body().get().as_bytes())?;
                        }
                        Some(Publication::Run(_)) => {}
                        Some(Publication::Ephemeral(p)) => {
                            if ctx.out.is_json() {
                                ctx.out.line(serde_json::json!({"preview": p.text}))?;
                            } else {
                                mid_preview = true;
                                ctx.out.partial(&p.text)?;
                            }
                        }
                    }
                }
            }
        }
        SessionCommand::Journal { session, after } => {
            let session = session_id(&session)?;
            known_session(&ctx, &session).await?;
            let mut after = after;
            let mut tip = None;
            loop {
                let page = ctx.controller.journal(&session, after, tip, 500).await?;
                for e in &page.events {
                    print_event(&ctx, e.seq, &e.body)?;
                }
                tip = Some(page.tip);
                if page.next_after >= page.tip || page.events.is_empty() {
                    break;
                }
                after = page.next_after;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Ls => list(&ctx).await,
        SessionCommand::Commands { session } => commands::list(&ctx, &session).await,
    }
}

/// Every session of the tenant, read page by page (no silent cut at a page size).
async fn list(ctx: &Ctx) -> Result<ExitCode> {
    let store = ctx.controller.store();
    let tenant = ctx.controller.tenant();
    let mut sessions = Vec::new();
    let mut after: Option<SessionId> = None;
    loop {
        let page = store
            .list_sessions(tenant, after.as_ref(), LIST_PAGE)
            .await?;
        let full = page.len() >= LIST_PAGE;
        after = page.last().map(|s| s.session.clone());
        sessions.extend(page);
        if !full || after.is_none() {
            break;
        }
    }
    let mut rows = Vec::with_capacity(sessions.len());
    for s in &sessions {
        let reg = store.registration(&s.tenant, &s.session).await?;
        let host = reg
            .as_ref()
            .map(|r| r.host.to_string())
            .unwrap_or_else(|| "-".into());
        let residency = reg.as_ref().map(|r| r.residency.as_str()).unwrap_or("none");
        rows.push((s.session.as_str(), s.agent.as_str(), residency, host));
    }
    if ctx.out.is_json() {
        let v: Vec<Value> = rows
            .iter()
            .map(|(s, a, r, h)| serde_json::json!({"session_id": s, "agent_id": a, "residency": r, "host_id": h}))
            .collect();
        return ctx.out.line(Value::Array(v)).map(|()| ExitCode::SUCCESS);
    }
    let table = Table::new(&["SESSION", "AGENT", "RESIDENCY", "HOST"])
        .gap(1)
        .least_width(1, 12)
        .least_width(2, 10)
        .rows(
            rows.into_iter()
                .map(|(s, a, r, h)| [s.to_owned(), a.to_owned(), r.to_owned(), h]),
        );
    ctx.out.table(&table)?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses an answer that cannot land: a gate the session never opened, one already
/// resolved, or an action its kind does not offer.
async fn check_answer(ctx: &Ctx, session: &SessionId, gate: &str, action: &str) -> Result<()> {
    let all = ctx
        .controller
        .store()
        .gates(ctx.controller.tenant(), session, false)
        .await?;
    let Some(g) = all.iter().find(|g| g.gate.as_str() == gate) else {
        return Err(CliError::refused(
            "gate_not_found",
            format!("session {session} has no gate {gate} (see `hostd session gates {session}`)"),
        )
        .into());
    };
    if g.state != GateState::Open {
        return Err(CliError::refused(
            "gate_closed",
            format!("gate {gate} of session {session} is {}", g.state.as_str()),
        )
        .into());
    }
    let offered = gate_actions(&g.kind);
    if !offered.contains(&action) {
        return Err(CliError::refused(
            "unknown_action",
            format!(
                "a {} gate is answered with {}, not {action}",
                g.kind,
                offered.join(" or ")
            ),
        )
        .into());
    }
    Ok(())
}

/// The actions a gate of `kind` offers (as the agents' runtime defines them).
fn gate_actions(kind: &str) -> &'static [&'static str] {
    serde_json::from_value::<harness::events::GateKind>(Value::from(kind))
        .map(harness::events::GateKind::actions)
        .unwrap_or(&[])
}

/// The open gates, waiting up to `bound` for at least one (a gate opens shortly after the
/// command that leads to it is applied).
async fn open_gates(
    ctx: &Ctx,
    session: &SessionId,
    bound: Option<Duration>,
) -> Result<Vec<sessionstore::GateRecord>> {
    let bound = bound.unwrap_or_default();
    let deadline = tokio::time::Instant::now() + bound;
    let mut progress = Progress::new(
        &ctx.out,
        format!("waiting for a gate of session {session} to open"),
        bound,
    );
    loop {
        let gates = ctx.controller.gates(session).await?;
        if !gates.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(gates);
        }
        progress.tick();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn print_event(ctx: &Ctx, seq: u64, body: &[u8]) -> Result<()> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => return Ok(()),
    };
    if ctx.out.is_json() {
        ctx.out.line(serde_json::json!({"seq": seq, "body": value}))
    } else if let Some(line) = render(&value) {
        ctx.out.line(line)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_line_quotes_what_the_shell_would_split() {
        assert_eq!(shell_word("s-01"), "s-01");
        assert_eq!(shell_word("transfer 100 EUR"), "'transfer 100 EUR'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn each_gate_kind_offers_its_actions_and_an_unknown_kind_none() {
        assert_eq!(gate_actions("permission"), ["approve", "deny"]);
        assert_eq!(gate_actions("ask_user"), ["answer"]);
        assert!(gate_actions("frobnicate").is_empty());
    }
}
