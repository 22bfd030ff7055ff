//! `hostd session`: the command line as a controller. Owns argument parsing and rendering;
//! every action is `host::controller`'s. In the embedded default it finds the store, the Host
//! and the local tenant's token in the data folder `hostd serve` wrote; against PostgreSQL each
//! is given by flag or environment.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use controller::client::Publication;
use controller::{Controller, Placed};
use serde_json::Value;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CommandRecord, CompatibilityId, SessionId, Store, StoreOptions, TenantId,
};

use crate::agents::{SCRIPTED_AGENT, build_of};
use crate::local::{DataDir, LOCAL_TENANT};
use crate::output::Output;
use crate::signals::StopSignals;

/// Create sessions, send them messages, answer their gates, and watch them — as a controller.
#[derive(Debug, Args)]
#[command(
    after_help = "With `hostd serve` running with its defaults, no flags are needed:\n  \
S=$(hostd session create)\n  hostd session send $S \"hello\"\n  hostd session watch $S\n\
Against a fleet: --store postgres://... --tenant T --token ... (or HOST_STORE_URL, HOST_TENANT, HOST_TENANT_TOKEN)."
)]
pub struct SessionArgs {
    /// The data folder of the local `hostd serve`.
    #[arg(long, global = true, env = "HOST_DATA_DIR", default_value = "./.hostd")]
    data_dir: PathBuf,
    /// Store URL (default: the local `hostd serve`'s).
    #[arg(long, global = true, env = "HOST_STORE_URL")]
    store: Option<String>,
    /// Tenant (default: the local tenant).
    #[arg(long, global = true, env = "HOST_TENANT")]
    tenant: Option<String>,
    /// The tenant's HostLink token (default: read from the data folder).
    #[arg(long, global = true, env = "HOST_TENANT_TOKEN", hide_env_values = true)]
    token: Option<String>,
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
    },
    /// Send a message and wait until the Host has applied it.
    Send {
        /// The session id (as `hostd session create` printed it).
        session: String,
        /// The message text.
        text: String,
        /// A command id, to make retries idempotent (default: a fresh one).
        #[arg(long)]
        command_id: Option<String>,
    },
    /// Interrupt the turn in flight.
    Interrupt {
        /// The session id.
        session: String,
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
    /// List the tenant's sessions.
    Ls,
}

struct Ctx {
    controller: Controller,
    out: Output,
}

async fn context(args: &SessionArgs, out: Output) -> Result<Ctx> {
    let data = DataDir::new(&args.data_dir);
    let runtime = data.read_runtime()?;
    let store_url = match (&args.store, &runtime) {
        (Some(s), _) => s.clone(),
        (None, Some(r)) => r.store.clone(),
        (None, None) => {
            let path = data.store_path();
            if !path.exists() {
                bail!(
                    "no store: start `hostd serve` (it keeps one in {}), or pass --store",
                    args.data_dir.display()
                );
            }
            data.store_url()?
        }
    };
    let tenant = match &args.tenant {
        Some(t) => t.clone(),
        None => runtime
            .as_ref()
            .map(|r| r.tenant.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| LOCAL_TENANT.to_owned()),
    };
    let token = match &args.token {
        Some(t) => t.clone(),
        None => data.token(&tenant)?,
    };
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
    Ok(Ctx {
        controller: Controller::new(store, TenantId::new(tenant).context("--tenant")?, token),
        out,
    })
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

fn session_id(s: &str) -> Result<SessionId> {
    SessionId::new(s).context("session id")
}

async fn place(ctx: &Ctx, session: &SessionId) -> Result<Placed> {
    ctx.controller
        .place(session)
        .await
        .with_context(|| format!("placing session {session} on a Host (is `hostd serve` running?)"))
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

async fn admit_and_deliver(
    ctx: &Ctx,
    session: &SessionId,
    command: CommandId,
    body: CommandBodyV1,
) -> Result<ExitCode> {
    let rec = ctx.controller.admit(session, command, body).await?;
    deliver_and_report(ctx, session, &rec).await
}

/// Places the session, delivers the admitted command `rec` and waits for it to end, printing
/// its outcome; the exit code says whether it was applied. A command not ended within the
/// wait stays in the inbox for the Host's own pass.
async fn deliver_and_report(
    ctx: &Ctx,
    session: &SessionId,
    rec: &CommandRecord,
) -> Result<ExitCode> {
    let placed = place(ctx, session).await?;
    if let Err(e) = ctx.controller.bind_and_stream(&placed, false).await {
        tracing::debug!(error = %e, "bind before delivery failed; the Host's own pass will pick the command up");
    }
    let _ = ctx.controller.deliver(&placed, &rec.command).await;
    match ctx
        .controller
        .wait_terminal(session, &rec.command, Duration::from_secs(60))
        .await?
    {
        Some(done) => {
            ctx.out.record(outcome_line(&done), || {
                serde_json::json!({"command_id": done.command.as_str(), "kind": done.kind.as_str(), "state": done.state.as_str(), "outcome": done.outcome.map(|o| o.as_str()), "reason": done.reason})
            })?;
            Ok(if done.state == sessionstore::CommandState::Applied {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        None => {
            ctx.out.warn(format_args!(
                "command {} admitted but not yet applied (it stays in the inbox)",
                rec.command
            ));
            Ok(ExitCode::FAILURE)
        }
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
    let ctx = context(&args, out).await?;
    match args.command {
        SessionCommand::Create {
            session,
            agent,
            build,
            message,
        } => {
            let session = session_id(&session.unwrap_or_else(|| new_id("s")))?;
            let build = match build.or_else(|| build_of(&agent).map(str::to_owned)) {
                Some(b) => b,
                None => bail!("unknown agent {agent}: give its --build"),
            };
            let command = CommandId::new(new_id("create"))?;
            let (_, create) = ctx
                .controller
                .create_session(
                    session.clone(),
                    AgentId::new(agent).context("--agent")?,
                    CompatibilityId::new(build).context("--build")?,
                    message,
                    command,
                )
                .await?;
            let placed = place(&ctx, &session).await?;
            let _ = ctx.controller.deliver(&placed, &create.command).await;
            ctx.out.record(&session, || {
                serde_json::json!({"session_id": session.as_str(), "host_id": placed.observation.host_id.as_str(), "lease_epoch": placed.observation.lease_epoch.get()})
            })?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Send {
            session,
            text,
            command_id,
        } => {
            let id = CommandId::new(command_id.unwrap_or_else(|| new_id("input")))?;
            admit_and_deliver(
                &ctx,
                &session_id(&session)?,
                id,
                CommandBodyV1::Input { text },
            )
            .await
        }
        SessionCommand::Interrupt { session } => {
            let id = CommandId::new(new_id("interrupt"))?;
            admit_and_deliver(&ctx, &session_id(&session)?, id, CommandBodyV1::Interrupt).await
        }
        SessionCommand::Answer {
            session,
            gate,
            action,
            text,
        } => {
            let session = session_id(&session)?;
            let gate = if gate == "next" {
                match open_gates(&ctx, &session, Some(Duration::from_secs(30)))
                    .await?
                    .first()
                {
                    Some(g) => g.gate.to_string(),
                    None => bail!("session {session} has no open gate"),
                }
            } else {
                gate
            };
            let gate = uuid::Uuid::parse_str(&gate)
                .context("a gate id is a UUID (see `hostd session gates`)")?;
            let rec = ctx
                .controller
                .answer(
                    &session,
                    CommandId::new(new_id("answer"))?,
                    gate,
                    &action,
                    text,
                )
                .await?;
            deliver_and_report(&ctx, &session, &rec).await
        }
        SessionCommand::Gates { session, wait } => {
            let bound = wait.then_some(Duration::from_secs(30));
            let gates = open_gates(&ctx, &session_id(&session)?, bound).await?;
            if ctx.out.is_json() {
                let v: Vec<Value> = gates
                    .iter()
                    .map(|g| serde_json::json!({"gate_id": g.gate.as_str(), "kind": g.kind, "prompt": g.prompt_summary, "opened_seq": g.opened_seq, "deadline_ms": g.deadline_ms}))
                    .collect();
                ctx.out.line(Value::Array(v))?;
            } else if gates.is_empty() {
                ctx.out.line("no open gates")?;
            } else {
                ctx.out
                    .line(format_args!("{:<38} {:<11} PROMPT", "GATE", "KIND"))?;
                for g in gates {
                    ctx.out.line(format_args!(
                        "{:<38} {:<11} {}",
                        g.gate, g.kind, g.prompt_summary
                    ))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Watch { session, previews } => {
            let session = session_id(&session)?;
            // The durable past first, then the live tail.
            let page = ctx.controller.journal(&session, 0, None, 1000).await?;
            let mut last = 0;
            for e in &page.events {
                last = e.seq;
                print_event(&ctx, e.seq, &e.body)?;
            }
            let placed = place(&ctx, &session).await?;
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
                            ctx.out.warn("the Host ended the stream; run watch again to continue");
                            return Ok(ExitCode::FAILURE);
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
        SessionCommand::Ls => {
            let sessions = ctx
                .controller
                .store()
                .list_sessions(ctx.controller.tenant(), None, 1000)
                .await?;
            let w = sessions
                .iter()
                .map(|s| s.session.as_str().len())
                .max()
                .unwrap_or(7)
                .max(7);
            if !ctx.out.is_json() {
                ctx.out.line(format_args!(
                    "{:<w$} {:<12} {:<10} HOST",
                    "SESSION", "AGENT", "RESIDENCY"
                ))?;
            }
            for s in sessions {
                let reg = ctx
                    .controller
                    .store()
                    .registration(&s.tenant, &s.session)
                    .await?;
                let host = reg
                    .as_ref()
                    .map(|r| r.host.to_string())
                    .unwrap_or_else(|| "-".into());
                let residency = reg.as_ref().map(|r| r.residency.as_str()).unwrap_or("none");
                ctx.out.record(
                    format_args!(
                        "{:<w$} {:<12} {:<10} {}",
                        s.session.as_str(),
                        s.agent.as_str(),
                        residency,
                        host
                    ),
                    || serde_json::json!({"session_id": s.session.as_str(), "agent_id": s.agent.as_str(), "residency": residency, "host_id": host}),
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The open gates, waiting up to `bound` for at least one (a gate opens shortly after the
/// command that leads to it is applied).
async fn open_gates(
    ctx: &Ctx,
    session: &SessionId,
    bound: Option<Duration>,
) -> Result<Vec<sessionstore::GateRecord>> {
    let deadline = tokio::time::Instant::now() + bound.unwrap_or_default();
    loop {
        let gates = ctx.controller.gates(session).await?;
        if !gates.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(gates);
        }
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
