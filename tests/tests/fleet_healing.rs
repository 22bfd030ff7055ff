//! A fleet that heals itself: three `hostd serve` processes on one PostgreSQL database, each
//! running the fleet reconciler (one leads). Sessions are never placed by a client here: the
//! reconciler places every session that has admitted work and no live Host, spreading them by
//! free weight. A Host is killed (SIGKILL), frozen (SIGSTOP, then SIGCONT) or replaced by one
//! under a new id; every command admitted on its sessions afterwards is applied on a survivor
//! with no client action, and a checker confirms every admitted command ended exactly once,
//! honestly, and no session is wedged.

use std::collections::HashMap;
use std::path::Path;

use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CommandRecord, CompatibilityId, HostId, NewCommand, NewSession, Outcome,
    RuntimeSessionId, SessionBinding, SessionId, SessionRecord, Store, StoreOptions, TenantId,
    local_binding,
};
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, tenant_credentials};
use testkit::{check, check_exactly_once, eventually, terminal};

/// The scripted agent `hostd serve` registers by default (its id and build).
const AGENT: &str = "assistant";
const BUILD: &str = "hostd-scripted-1";

fn fleet_host(dir: &Path, name: &str, store: &str, credentials: &Path) -> Serve {
    Serve::fleet_member(
        dir,
        name,
        store,
        credentials,
        &[
            "--registry-heartbeat",
            "200ms",
            "--registry-expiry",
            "800ms",
            "--registry-retention",
            "1s",
            "--reconcile-interval",
            "100ms",
            "--claim-ttl",
            "2s",
            "--fleet-interval",
            "150ms",
            "--fleet-leader-ttl",
            "600ms",
            "--fleet-assignment-ttl",
            "2s",
            "--pg-idle-transaction-timeout",
            "1s",
        ],
    )
}

/// One fleet at a time: each is three `hostd` processes, and fleets running side by side on a
/// small machine only measure each other.
static ONE_FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Fleet {
    db: FreshDatabase,
    dir: tempfile::TempDir,
    credentials: std::path::PathBuf,
    hosts: HashMap<String, Serve>,
    store: Store,
    tenant: TenantId,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Fleet {
    async fn start(label: &str, names: &[&str]) -> Option<Fleet> {
        let db = FreshDatabase::create(label).await?;
        let serial = ONE_FLEET.lock().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, credentials) = tenant_credentials(dir.path(), "acme");
        let mut hosts = HashMap::new();
        for n in names {
            hosts.insert(
                (*n).to_owned(),
                fleet_host(dir.path(), n, &db.url, &credentials),
            );
        }
        let store = Store::open(StoreOptions::new(db.url.clone()))
            .await
            .expect("the fleet's store");
        Some(Fleet {
            db,
            dir,
            credentials,
            hosts,
            store,
            tenant: TenantId::new("acme").unwrap(),
            _serial: serial,
        })
    }

    fn add(&mut self, name: &str) {
        let h = fleet_host(self.dir.path(), name, &self.db.url, &self.credentials);
        self.hosts.insert(name.to_owned(), h);
    }

    /// A session with its create command admitted; nobody places it.
    async fn session(&self, name: &str) -> SessionRecord {
        let s = self
            .store
            .create_session(NewSession {
                tenant: self.tenant.clone(),
                session: SessionId::new(name).unwrap(),
                agent: AgentId::new(AGENT).unwrap(),
                compatibility: CompatibilityId::new(BUILD).unwrap(),
                binding: SessionBinding {
                    runtime_session_id: RuntimeSessionId::mint(),
                    storage_binding_id: local_binding(),
                    binding_version: 1,
                },
            })
            .await
            .unwrap();
        self.admit(&s, "create", CommandBodyV1::Create { text: None })
            .await;
        s
    }

    async fn admit(&self, s: &SessionRecord, id: &str, body: CommandBodyV1) -> CommandRecord {
        self.store
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: CommandId::new(id).unwrap(),
                kind: body.kind(),
                body: sessionstore::CommandBody::Inline(sessionstore::wire::encode_command_body(
                    &body,
                )),
                principal: Some("test".into()),
                metadata: None,
                apply_within: std::time::Duration::from_secs(600),
                trace: None,
            })
            .await
            .unwrap()
    }

    async fn input(&self, s: &SessionRecord, id: &str) -> CommandRecord {
        self.admit(
            s,
            id,
            CommandBodyV1::Input {
                text: format!("{id} on {}", s.session),
            },
        )
        .await
    }

    /// The Host holding each session's live lease now.
    async fn holders(&self, sessions: &[SessionRecord]) -> HashMap<SessionId, Option<HostId>> {
        let now = self.store.now_ms().await.unwrap();
        let mut out = HashMap::new();
        for s in sessions {
            let lease = self.store.residency(&s.tenant, &s.session).await.unwrap();
            let holder = lease.filter(|l| l.is_live(now)).and_then(|l| l.host);
            out.insert(s.session.clone(), holder);
        }
        out
    }

    /// Waits until every session is resident somewhere; returns who holds each.
    async fn all_resident(&self, sessions: &[SessionRecord]) -> HashMap<SessionId, HostId> {
        eventually("every session to be resident", async || {
            let h = self.holders(sessions).await;
            let missing: Vec<_> = h.iter().filter(|(_, v)| v.is_none()).collect();
            check(missing.is_empty(), || format!("not resident: {missing:?}"))?;
            Ok(h.into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect())
        })
        .await
    }

    async fn applied(&self, s: &SessionRecord, c: &CommandRecord) {
        let done = terminal(&self.store, s, &c.command).await;
        assert_eq!(done.outcome, Some(Outcome::Applied), "{done:?}");
    }

    /// Every command of every session ended once and honestly; each session still applies.
    async fn check_all(&self, sessions: &[SessionRecord]) {
        for s in sessions {
            let after = self.input(s, "check-not-wedged").await;
            self.applied(s, &after).await;
            check_exactly_once(&self.store, s).await;
        }
    }

    async fn close(mut self) {
        for (name, h) in self.hosts.drain() {
            let (status, log) = h.terminate();
            assert!(status.success(), "{name}'s drain failed:\n{log}");
        }
        self.store.close().await;
        self.db.drop_now().await;
    }
}

fn count_by_host(holders: &HashMap<SessionId, HostId>) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for h in holders.values() {
        *out.entry(h.to_string()).or_default() += 1;
    }
    out
}

/// The Host holding the most sessions (the best victim).
fn busiest(holders: &HashMap<SessionId, HostId>) -> String {
    count_by_host(holders)
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(h, _)| h)
        .expect("some Host holds sessions")
}

async fn sessions(fleet: &Fleet, prefix: &str, n: usize) -> Vec<SessionRecord> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(fleet.session(&format!("{prefix}-{i}")).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hosts_admitted_commands_are_applied_on_survivors_with_no_client_action() {
    let Some(mut fleet) = Fleet::start("heal_kill", &["heal-a", "heal-b", "heal-c"]).await else {
        return;
    };
    let ss = sessions(&fleet, "k", 9).await;
    let holders = fleet.all_resident(&ss).await;
    for s in &ss {
        let create = fleet
            .store
            .command(&s.tenant, &s.session, &CommandId::new("create").unwrap())
            .await
            .unwrap();
        fleet.applied(s, &create).await;
    }
    let victim = busiest(&holders);
    let orphaned: Vec<SessionRecord> = ss
        .iter()
        .filter(|s| holders[&s.session].as_str() == victim)
        .cloned()
        .collect();
    // In flight when the Host dies: each ends applied or closed not_applied, never twice.
    let mut in_flight = Vec::new();
    for s in &orphaned {
        in_flight.push((s.clone(), fleet.input(s, "in-flight").await));
    }
    let (_, _) = fleet.hosts.remove(&victim).expect("the victim").kill_dead();
    // Admitted after the death; nobody places, attaches or delivers anything.
    let mut after = Vec::new();
    for s in &orphaned {
        after.push((s.clone(), fleet.input(s, "after-kill").await));
    }
    for (s, c) in &after {
        fleet.applied(s, c).await;
    }
    for (s, c) in &in_flight {
        let done = terminal(&fleet.store, s, &c.command).await;
        assert!(
            matches!(
                done.outcome,
                Some(Outcome::Applied) | Some(Outcome::NotApplied)
            ),
            "{done:?}"
        );
    }
    let now = fleet.all_resident(&ss).await;
    assert!(now.values().all(|h| h.as_str() != victim));
    fleet.check_all(&ss).await;
    fleet.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_hosts_sessions_move_and_once_thawed_it_writes_nothing_under_its_old_epochs() {
    let Some(fleet) = Fleet::start("heal_stop", &["stop-a", "stop-b", "stop-c"]).await else {
        return;
    };
    let ss = sessions(&fleet, "f", 6).await;
    let holders = fleet.all_resident(&ss).await;
    let victim = busiest(&holders);
    let mut moved = Vec::new();
    for s in ss.iter().filter(|s| holders[&s.session].as_str() == victim) {
        let lease = fleet.store.residency(&s.tenant, &s.session).await.unwrap();
        let epoch = lease
            .map(|l| l.epoch)
            .expect("a resident session has a lease");
        moved.push((s.clone(), epoch));
    }
    fleet.hosts[&victim].freeze();
    let mut after = Vec::new();
    for (s, _) in &moved {
        after.push((s.clone(), fleet.input(s, "while-frozen").await));
    }
    for (s, c) in &after {
        fleet.applied(s, c).await;
    }
    fleet.hosts[&victim].thaw();
    // At once, before the thawed Host's first heartbeat can end the residencies it lost: its
    // consumers still believe they hold these sessions under their old epochs, and a command
    // admitted now has a mark of 0. The store fences the claim by the session's residency, so
    // each command is applied by the new holder, never claimed and then closed not-applied
    // under the old epoch.
    let mut thawed = Vec::new();
    for round in 0..3 {
        for (s, frozen_epoch) in &moved {
            let c = fleet.input(s, &format!("after-thaw-{round}")).await;
            thawed.push((s.clone(), *frozen_epoch, c));
        }
    }
    for (s, frozen_epoch, c) in &thawed {
        let done = terminal(&fleet.store, s, &c.command).await;
        let attempt = done
            .attempt
            .as_ref()
            .unwrap_or_else(|| panic!("no attempt: {done:?}"));
        // Never attempted under the frozen Host's old epoch.
        assert!(
            attempt.residency_epoch > *frozen_epoch,
            "{:?} attempted under {:?}, not after the frozen {frozen_epoch:?}",
            c.command,
            attempt.residency_epoch
        );
        // Applied by the new holder; or, when the session moved once more while the command
        // was in flight (a holder whose heartbeat ran late on a loaded machine loses its
        // leases at the 800 ms expiry), closed honestly as not applied by that later holder.
        match done.outcome {
            Some(Outcome::Applied) => {}
            Some(Outcome::NotApplied) => assert!(
                done.epoch_mark > attempt.residency_epoch,
                "not applied with no later holder: {done:?}"
            ),
            other => panic!("{:?} ended {other:?}: {done:?}", c.command),
        }
        let lease = fleet.store.residency(&s.tenant, &s.session).await.unwrap();
        let now = lease.map(|l| l.epoch).expect("a lease");
        assert!(now > *frozen_epoch, "{now:?} after {frozen_epoch:?}");
    }
    fleet.check_all(&ss).await;
    fleet.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_restarted_under_a_new_id_takes_work_and_the_dead_ids_row_is_collected() {
    let Some(mut fleet) = Fleet::start("heal_new", &["new-a", "new-b"]).await else {
        return;
    };
    let ss = sessions(&fleet, "n", 6).await;
    let holders = fleet.all_resident(&ss).await;
    let victim = busiest(&holders);
    let (_, _) = fleet.hosts.remove(&victim).expect("the victim").kill_dead();
    fleet.add("new-c");
    let mut after = Vec::new();
    for s in &ss {
        after.push((s.clone(), fleet.input(s, "after-restart").await));
    }
    for (s, c) in &after {
        fleet.applied(s, c).await;
    }
    // The dead id's advertisement is collected once expired longer than the retention.
    eventually("the dead Host's row to be collected", async || {
        let ids: Vec<String> = fleet
            .store
            .targets(false)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|t| t.host.to_string())
            .collect();
        check(!ids.contains(&victim), || format!("{ids:?}"))
    })
    .await;
    fleet.check_all(&ss).await;
    fleet.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_sessions_placed_by_the_reconciler_spread_over_three_hosts() {
    let Some(fleet) = Fleet::start("heal_spread", &["spread-a", "spread-b", "spread-c"]).await
    else {
        return;
    };
    let ss = sessions(&fleet, "sp", 30).await;
    let holders = fleet.all_resident(&ss).await;
    let counts = count_by_host(&holders);
    assert_eq!(counts.values().sum::<usize>(), 30);
    assert!(
        counts.values().all(|n| *n <= 12),
        "no Host may hold more than 12: {counts:?}"
    );
    for s in &ss {
        let create = fleet
            .store
            .command(&s.tenant, &s.session, &CommandId::new("create").unwrap())
            .await
            .unwrap();
        fleet.applied(s, &create).await;
        check_exactly_once(&fleet.store, s).await;
    }
    fleet.close().await;
}
