//! A fleet of two `hostd serve` processes on one PostgreSQL database. The Host holding a
//! session is killed with SIGKILL while commands are in flight; the session is taken over by
//! the other Host once the dead one's residency lease lapses, and the exactly-once checker
//! (`testkit::checker`) judges the client's recorded history against the store: every
//! admitted command ended exactly once from the runtime's own evidence, no input was applied
//! twice, and nothing was lost (a command closed `not_applied` is resent, as a controller
//! must, and applies on the survivor).

use std::path::Path;

use controller::Controller;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CommandKind, CommandRecord, CompatibilityId, Outcome, SessionId, Store,
    StoreOptions, TenantId,
};
use testkit::checker::{StoreView, check};
use testkit::history::Recorder;
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, tenant_credentials};
use testkit::{eventually, terminal};

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
            "300ms",
            "--registry-expiry",
            "1200ms",
            "--reconcile-interval",
            "200ms",
            // A claim the dead Host held blocks its command until the claim expires.
            "--claim-ttl",
            "2s",
        ],
    )
}

/// Admits an input whose text is its marker, recording the invocation and the
/// acknowledgement in `history`.
async fn admit_input(
    c: &Controller,
    history: &Recorder,
    session: &SessionId,
    id: &str,
    text: &str,
) -> CommandRecord {
    let id = CommandId::new(id).unwrap();
    history.invoke(session, &id, CommandKind::Input, Some(text));
    let rec = c
        .admit(
            session,
            id,
            CommandBodyV1::Input {
                text: text.to_owned(),
            },
        )
        .await
        .unwrap();
    history.admitted(session, &rec.command, rec.accepted_order);
    rec
}

/// Waits for the command to end and records the outcome the client saw.
async fn observe(
    store: &Store,
    history: &Recorder,
    record: &sessionstore::SessionRecord,
    command: &CommandId,
) -> CommandRecord {
    let done = terminal(store, record, command).await;
    if let Some(o) = done.outcome {
        history.observed(&record.session, command, o);
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_a_killed_host_is_taken_over_by_the_other_with_nothing_lost_or_duplicated() {
    let Some(db) = FreshDatabase::create("failover").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (token, credentials) = tenant_credentials(dir, "acme");
    let hosts = [
        fleet_host(dir, "fleet-a", &db.url, &credentials),
        fleet_host(dir, "fleet-b", &db.url, &credentials),
    ];

    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .expect("the fleet's store");
    let tenant = TenantId::new("acme").unwrap();
    let c = Controller::new(store.clone(), tenant.clone(), &token);
    let session = SessionId::new("failover-1").unwrap();
    let (record, create) = c
        .create_session(
            session.clone(),
            AgentId::new(AGENT).unwrap(),
            CompatibilityId::new(BUILD).unwrap(),
            None,
            CommandId::new("create").unwrap(),
        )
        .await
        .unwrap();
    let placed = c.place(&session).await.expect("placed on a live Host");
    // A delivery travels on a link that holds the session's bind.
    let _feed = c.bind_and_stream(&placed, false).await.expect("bound");
    let resident = placed.observation.host_id.to_string();
    assert_eq!(
        terminal(&store, &record, &create.command).await.outcome,
        Some(Outcome::Applied)
    );
    let history = Recorder::new(None);
    for i in 0..3 {
        let cmd = admit_input(
            &c,
            &history,
            &session,
            &format!("before-{i}"),
            &format!("before {i}"),
        )
        .await;
        c.deliver(&placed, &cmd.command).await.unwrap();
        let done = observe(&store, &history, &record, &cmd.command).await;
        assert_eq!(done.outcome, Some(Outcome::Applied));
    }

    // Commands in flight, then the resident Host dies at whatever instruction it is on.
    let mut in_flight = Vec::new();
    for i in 0..4 {
        let text = format!("in flight {i}");
        let cmd = admit_input(&c, &history, &session, &format!("flight-{i}"), &text).await;
        let _ = c.deliver(&placed, &cmd.command).await;
        in_flight.push((cmd, text));
    }
    let [a, b] = hosts;
    let (victim, survivor) = if resident == "fleet-a" {
        (a, b)
    } else {
        (b, a)
    };
    history.fault("kill", format!("SIGKILL {resident} (pid {})", victim.pid()));
    let (_, _) = victim.kill_dead();
    drop(placed);

    // The survivor takes the session over once the dead Host's lease lapses.
    let taken = eventually("the survivor to take the session over", async || {
        match c.place(&session).await {
            Ok(p) => Ok(p),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert_ne!(taken.observation.host_id.to_string(), resident);
    let _feed = c.bind_and_stream(&taken, false).await.expect("bound");
    assert!(taken.observation.lease_epoch.get() >= 2);

    // Every in-flight command ends; one never accepted is closed not_applied and resent (the
    // same text, so the checker holds the pair to one application).
    for (cmd, text) in in_flight {
        let done = observe(&store, &history, &record, &cmd.command).await;
        match done.outcome {
            Some(Outcome::Applied) => {}
            Some(Outcome::NotApplied) => {
                let resent = format!("{}-resent", cmd.command);
                let again = admit_input(&c, &history, &session, &resent, &text).await;
                c.deliver(&taken, &again.command).await.unwrap();
                let done = observe(&store, &history, &record, &again.command).await;
                assert_eq!(done.outcome, Some(Outcome::Applied));
            }
            other => panic!("command {} ended {other:?}: {done:?}", cmd.command),
        }
    }
    // Not wedged: a new command applies on the survivor.
    let after = admit_input(&c, &history, &session, "after", "after the kill").await;
    c.deliver(&taken, &after.command).await.unwrap();
    let done = observe(&store, &history, &record, &after.command).await;
    assert_eq!(done.outcome, Some(Outcome::Applied));

    // Each input applied exactly once (its text once in the journal), none lost, every
    // command ended honestly.
    let view = StoreView::read(&store, std::slice::from_ref(&record))
        .await
        .expect("the store reads");
    check(&history.history(), &view).assert_clean();

    drop(taken);
    let (status, log) = survivor.terminate();
    assert!(status.success(), "the survivor's drain failed:\n{log}");
    store.close().await;
    // The dead Host's connections are forced off with the database.
    db.drop_now().await;
}
