//! The controller workload: one client per session, each admitting commands one after
//! another through the controller library (most) or `hostd session send` (some), the way a
//! controller must — an admission retried under the same command id while its fate is
//! unknown, a delivery over a HostLink link it places itself when it has none (through the
//! Host's client proxy), the outcome awaited from the store, and a command closed without
//! being applied resent under a new id with the same payload. Every step is recorded in the
//! history as it happens. Owns the clients and their choices (drawn from the run's seed);
//! never injects a fault and never judges anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use controller::client::ClientOptions;
use controller::{Controller, Placed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CommandKind, CompatibilityId, Outcome, SessionId, SessionRecord, Store,
};
use testkit::history::Recorder;

/// The scripted agent `hostd serve` registers by default (its id and build).
const AGENT: &str = "assistant";
const BUILD: &str = "hostd-scripted-1";

/// How long a client waits for an admission before it calls its fate unknown.
const ADMIT_BOUND: Duration = Duration::from_secs(10);
/// How many times an admission whose fate is unknown is sent again (same id).
const ADMIT_TRIES: u32 = 3;
/// How long a client waits for a command's outcome before it moves on.
const OBSERVE_BOUND: Duration = Duration::from_secs(20);
/// Every this long without an outcome, the client places and delivers again (on a single
/// Host there is no fleet reconciler: a session whose Host died comes back only when a client
/// attaches it).
const REDELIVER_EVERY: Duration = Duration::from_secs(3);
/// How many times a command closed without being applied is resent (new ids).
const RESENDS: u32 = 3;
/// How long `hostd session send` may run.
const CLI_BOUND: Duration = Duration::from_secs(90);
/// The apply deadline of every command admitted.
pub const APPLY_WITHIN: Duration = Duration::from_secs(120);

/// What every client shares.
#[derive(Clone)]
pub struct Shared {
    pub controller: Controller,
    pub history: Recorder,
    /// The run's folder (`hostd session send` runs there).
    pub dir: std::path::PathBuf,
    /// The store as the command line reaches it.
    pub store_url: String,
    pub token: String,
    pub stop: Arc<AtomicBool>,
}

impl Shared {
    /// The controller every client uses: the store reached directly, Hosts dialled with
    /// short timeouts (a black-holed link costs a few seconds, not thirty).
    pub fn controller(store: Store, token: &str) -> Controller {
        let tenant =
            sessionstore::TenantId::new(crate::fleet::TENANT).expect("a valid literal tenant id");
        let mut c = Controller::new(store, tenant, token).with_client(ClientOptions {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
        });
        c.apply_within = APPLY_WITHIN;
        c
    }
}

/// What a client counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientStats {
    pub commands: u64,
    pub via_cli: u64,
    pub resends: u64,
    pub gave_up: u64,
    pub placements: u64,
}

/// One session's client.
pub struct Client {
    index: usize,
    pub record: SessionRecord,
    shared: Shared,
    rng: StdRng,
    placed: Option<Placed>,
    next: u64,
    pub stats: ClientStats,
}

/// What a client sends next.
struct Choice {
    body: CommandBodyV1,
    marker: Option<String>,
    /// Sent through `hostd session send` (plain inputs only).
    via_cli: bool,
}

impl Client {
    /// Creates session `index` (recording its create command) and its client, whose choices
    /// follow `seed`.
    pub async fn create(index: usize, shared: Shared, seed: u64) -> Result<Client, String> {
        let session = SessionId::new(format!("s{index}")).map_err(|e| e.to_string())?;
        let create = CommandId::new(format!("s{index}-create")).map_err(|e| e.to_string())?;
        shared
            .history
            .invoke(&session, &create, CommandKind::Create, None);
        let (record, rec) = shared
            .controller
            .create_session(
                session.clone(),
                AgentId::new(AGENT).map_err(|e| e.to_string())?,
                CompatibilityId::new(BUILD).map_err(|e| e.to_string())?,
                None,
                create.clone(),
            )
            .await
            .map_err(|e| format!("creating session {session}: {e}"))?;
        shared
            .history
            .admitted(&session, &create, rec.accepted_order);
        Ok(Client {
            index,
            record,
            shared,
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            placed: None,
            next: 0,
            stats: ClientStats::default(),
        })
    }

    fn session(&self) -> &SessionId {
        &self.record.session
    }

    /// Sends commands until the run says stop.
    pub async fn run(mut self) -> Client {
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.step().await;
            let pause = self.rng.random_range(50..300);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        self
    }

    fn choose(&mut self, n: u64) -> Choice {
        // `mk-` starts every marker and appears nowhere else, and each ends in `-`: no marker
        // is a part of another.
        let marker = format!("mk-{}-{n}-", self.index);
        let roll = self.rng.random_range(0..100);
        let (text, via_cli) = match roll {
            0..8 => {
                return Choice {
                    body: CommandBodyV1::Interrupt,
                    marker: None,
                    via_cli: false,
                };
            }
            8..20 => (format!("/tool echo {{\"text\":\"{marker}\"}}"), false),
            20..35 => (format!("/slow 150 {marker} takes a while"), false),
            35..45 => (format!("hello {marker} from the command line"), true),
            _ => (format!("hello {marker}"), false),
        };
        Choice {
            body: CommandBodyV1::Input { text },
            marker: Some(marker),
            via_cli,
        }
    }

    /// One command, resent under new ids while it ends without being applied.
    async fn step(&mut self) {
        self.next += 1;
        let n = self.next;
        let choice = self.choose(n);
        let mut id = format!("{}-{n}", self.session());
        for resend in 0..=RESENDS {
            let Ok(command) = CommandId::new(id.clone()) else {
                return;
            };
            self.stats.commands += 1;
            let outcome = if choice.via_cli && resend == 0 {
                self.send_cli(&command, &choice).await
            } else {
                self.send(&command, &choice).await
            };
            match outcome {
                Some(Outcome::NotApplied | Outcome::Rejected) if resend < RESENDS => {
                    self.stats.resends += 1;
                    id = format!("{}-{n}-r{}", self.session(), resend + 1);
                }
                _ => return,
            }
        }
    }

    /// Through the controller library: admit (same id again while its fate is unknown),
    /// deliver, observe.
    async fn send(&mut self, command: &CommandId, choice: &Choice) -> Option<Outcome> {
        let history = self.shared.history.clone();
        let session = self.session().clone();
        let kind = choice.body.kind();
        let mut admitted = None;
        for _ in 0..ADMIT_TRIES {
            history.invoke(&session, command, kind, choice.marker.as_deref());
            let admit =
                self.shared
                    .controller
                    .admit(&session, command.clone(), choice.body.clone());
            match tokio::time::timeout(ADMIT_BOUND, admit).await {
                Ok(Ok(rec)) => {
                    history.admitted(&session, command, rec.accepted_order);
                    admitted = Some(rec);
                    break;
                }
                Ok(Err(e)) => history.uncertain(&session, command, e.to_string()),
                Err(_) => history.uncertain(&session, command, "no answer within 10 s"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let rec = admitted?;
        if rec.state.is_terminal() {
            if let Some(o) = rec.outcome {
                history.observed(&session, command, o);
            }
            return rec.outcome;
        }
        self.deliver(command).await;
        self.observe(command).await
    }

    /// Through `hostd session send --json --command-id`: exit 0 applied, 3 ended without
    /// being applied, 4 admitted with its outcome not yet known (then awaited like any
    /// other); anything else leaves the admission's fate unknown.
    async fn send_cli(&mut self, command: &CommandId, choice: &Choice) -> Option<Outcome> {
        let CommandBodyV1::Input { text } = &choice.body else {
            return self.send(command, choice).await;
        };
        self.stats.via_cli += 1;
        let history = self.shared.history.clone();
        let session = self.session().clone();
        history.invoke(
            &session,
            command,
            CommandKind::Input,
            choice.marker.as_deref(),
        );
        history.note(Some(&session), format!("{command} via hostd session send"));
        let mut cli =
            tokio::process::Command::from(testkit::process::hostd_command(&self.shared.dir));
        cli.args([
            "session",
            "send",
            session.as_str(),
            text,
            "--command-id",
            command.as_str(),
            "--json",
            "--store",
            &self.shared.store_url,
            "--tenant",
            crate::fleet::TENANT,
        ])
        .env("HOST_TENANT_TOKEN", &self.shared.token)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
        let out = match tokio::time::timeout(CLI_BOUND, cli.output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                history.uncertain(&session, command, format!("hostd did not run: {e}"));
                return None;
            }
            Err(_) => {
                history.uncertain(&session, command, "hostd session send ran past 90 s");
                return None;
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let outcome_in = |text: &str, path: &[&str]| -> Option<Outcome> {
            let v: serde_json::Value = serde_json::from_str(text.lines().last()?).ok()?;
            let mut at = &v;
            for p in path {
                at = at.get(*p)?;
            }
            at.as_str()?.parse().ok()
        };
        match out.status.code() {
            Some(0) => {
                history.admitted_unordered(&session, command);
                let o = outcome_in(&stdout, &["outcome"]);
                if let Some(o) = o {
                    history.observed(&session, command, o);
                }
                o
            }
            Some(3) => {
                history.admitted_unordered(&session, command);
                let o = outcome_in(&stderr, &["error", "code"]);
                match o {
                    Some(o) => history.observed(&session, command, o),
                    None => history.note(Some(&session), format!("hostd exited 3: {stderr}")),
                }
                o
            }
            Some(4) => {
                history.admitted_unordered(&session, command);
                history.note(
                    Some(&session),
                    format!(
                        "hostd exited 4 (admitted, outcome not yet known): {}",
                        stderr.trim()
                    ),
                );
                self.observe(command).await
            }
            other => {
                history.uncertain(
                    &session,
                    command,
                    format!("hostd exited {other:?}: {}", stderr.trim()),
                );
                None
            }
        }
    }

    /// Places the session (attach over HostLink through the Host's client proxy, bind,
    /// subscribe) when this client has no open link; failures are noted, not fatal.
    async fn place(&mut self) {
        if self.placed.as_ref().is_some_and(|p| p.client.is_closed()) {
            self.placed = None;
        }
        if self.placed.is_some() {
            return;
        }
        let session = self.session().clone();
        let c = &self.shared.controller;
        let placed = match tokio::time::timeout(Duration::from_secs(10), c.place(&session)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                self.shared
                    .history
                    .note(Some(&session), format!("placement failed: {e}"));
                return;
            }
            Err(_) => {
                self.shared
                    .history
                    .note(Some(&session), "placement did not answer within 10 s");
                return;
            }
        };
        self.stats.placements += 1;
        match tokio::time::timeout(Duration::from_secs(10), c.bind_and_stream(&placed, false)).await
        {
            Ok(Ok(mut feed)) => {
                // The stream is not read here (the store is the truth); it is drained so the
                // link never sees a slow consumer.
                tokio::spawn(async move { while feed.recv().await.is_some() {} });
                self.shared.history.note(
                    Some(&session),
                    format!(
                        "placed on {} at lease epoch {}",
                        placed.observation.host_id, placed.observation.lease_epoch
                    ),
                );
                self.placed = Some(placed);
            }
            Ok(Err(e)) => self
                .shared
                .history
                .note(Some(&session), format!("bind failed: {e}")),
            Err(_) => self
                .shared
                .history
                .note(Some(&session), "bind did not answer within 10 s"),
        }
    }

    /// Wakes the session's consumer for `command` over the client's link.
    async fn deliver(&mut self, command: &CommandId) {
        self.place().await;
        let Some(placed) = &self.placed else { return };
        let delivered = tokio::time::timeout(
            Duration::from_secs(5),
            self.shared.controller.deliver(placed, command),
        )
        .await;
        if !matches!(delivered, Ok(Ok(()))) {
            // A refused or lost delivery: the link is suspect; place again next time.
            self.placed = None;
        }
    }

    /// Waits for `command`'s outcome in the store, placing and delivering again every
    /// [`REDELIVER_EVERY`], up to [`OBSERVE_BOUND`].
    async fn observe(&mut self, command: &CommandId) -> Option<Outcome> {
        let started = tokio::time::Instant::now();
        let mut redeliver = started + REDELIVER_EVERY;
        let session = self.session().clone();
        loop {
            let read =
                self.shared
                    .controller
                    .store()
                    .command(&self.record.tenant, &session, command);
            if let Ok(Ok(rec)) = tokio::time::timeout(Duration::from_secs(5), read).await
                && rec.state.is_terminal()
            {
                if let Some(o) = rec.outcome {
                    self.shared.history.observed(&session, command, o);
                }
                return rec.outcome;
            }
            if started.elapsed() >= OBSERVE_BOUND {
                self.stats.gave_up += 1;
                self.shared.history.gave_up(
                    &session,
                    command,
                    format!("not ended within {OBSERVE_BOUND:?}"),
                );
                return None;
            }
            if tokio::time::Instant::now() >= redeliver {
                self.placed = None;
                self.deliver(command).await;
                redeliver = tokio::time::Instant::now() + REDELIVER_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last command of the run, sent once everything is healed: it must apply (a session
    /// that cannot is wedged). Waits up to `bound`.
    pub async fn final_probe(&mut self, bound: Duration) -> Option<Outcome> {
        let id = CommandId::new(format!("{}-final", self.session())).ok()?;
        let marker = format!("mk-{}-final-", self.index);
        let choice = Choice {
            body: CommandBodyV1::Input {
                text: format!("final {marker}"),
            },
            marker: Some(marker),
            via_cli: false,
        };
        let started = tokio::time::Instant::now();
        let mut outcome = self.send(&id, &choice).await;
        while outcome.is_none() && started.elapsed() < bound {
            outcome = self.observe(&id).await;
        }
        outcome
    }
}
