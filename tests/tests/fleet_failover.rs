//! A fleet of two `hostd serve` processes on one PostgreSQL database. The Host holding a
//! session is killed with SIGKILL while commands are in flight; the session is taken over by
//! the other Host once the dead one's residency lease lapses, and a checker confirms that
//! every admitted command ended exactly once from the runtime's own evidence, that no input
//! was applied twice, and that nothing was lost (a command closed `not_applied` is resent, as
//! a controller must, and applies on the survivor).

use std::path::Path;

use controller::Controller;
use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    AgentId, CommandId, CompatibilityId, Outcome, SessionId, Store, StoreOptions, TenantId,
};
use testkit::pg::FreshDatabase;
use testkit::process::{Serve, tenant_credentials};
use testkit::{check_exactly_once, eventually, terminal};

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

async fn inputs_applied(c: &Controller, session: &SessionId) -> Vec<String> {
    let page = c
        .journal(session, 0, None, 1000)
        .await
        .expect("the journal");
    page.events
        .iter()
        .filter_map(|e| serde_json::from_slice::<serde_json::Value>(&e.body).ok())
        .filter(|b| b["type"] == "user_message")
        .filter_map(|b| b["text"].as_str().map(str::to_owned))
        .collect()
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
    let mut texts = Vec::new();
    for i in 0..3 {
        let text = format!("before {i}");
        let cmd = c
            .admit(
                &session,
                CommandId::new(format!("before-{i}")).unwrap(),
                CommandBodyV1::Input { text: text.clone() },
            )
            .await
            .unwrap();
        c.deliver(&placed, &cmd.command).await.unwrap();
        assert_eq!(
            terminal(&store, &record, &cmd.command).await.outcome,
            Some(Outcome::Applied)
        );
        texts.push(text);
    }

    // Commands in flight, then the resident Host dies at whatever instruction it is on.
    let mut in_flight = Vec::new();
    for i in 0..4 {
        let text = format!("in flight {i}");
        let cmd = c
            .admit(
                &session,
                CommandId::new(format!("flight-{i}")).unwrap(),
                CommandBodyV1::Input { text: text.clone() },
            )
            .await
            .unwrap();
        let _ = c.deliver(&placed, &cmd.command).await;
        in_flight.push((cmd, text));
    }
    let [a, b] = hosts;
    let (victim, survivor) = if resident == "fleet-a" {
        (a, b)
    } else {
        (b, a)
    };
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

    // Every in-flight command ends; one never accepted is closed not_applied and resent.
    for (cmd, text) in in_flight {
        let done = terminal(&store, &record, &cmd.command).await;
        match done.outcome {
            Some(Outcome::Applied) => texts.push(text),
            Some(Outcome::NotApplied) => {
                let again = c
                    .admit(
                        &session,
                        CommandId::new(format!("{}-resent", cmd.command)).unwrap(),
                        CommandBodyV1::Input { text: text.clone() },
                    )
                    .await
                    .unwrap();
                c.deliver(&taken, &again.command).await.unwrap();
                assert_eq!(
                    terminal(&store, &record, &again.command).await.outcome,
                    Some(Outcome::Applied)
                );
                texts.push(text);
            }
            other => panic!("command {} ended {other:?}: {done:?}", cmd.command),
        }
    }
    // Not wedged: a new command applies on the survivor.
    let after = c
        .admit(
            &session,
            CommandId::new("after").unwrap(),
            CommandBodyV1::Input {
                text: "after the kill".into(),
            },
        )
        .await
        .unwrap();
    c.deliver(&taken, &after.command).await.unwrap();
    assert_eq!(
        terminal(&store, &record, &after.command).await.outcome,
        Some(Outcome::Applied)
    );
    texts.push("after the kill".into());

    check_exactly_once(&store, &record).await;
    let mut applied = inputs_applied(&c, &session).await;
    applied.sort();
    texts.sort();
    assert_eq!(applied, texts, "each input applied exactly once, none lost");

    drop(taken);
    let (status, log) = survivor.terminate();
    assert!(status.success(), "the survivor's drain failed:\n{log}");
    store.close().await;
    // The dead Host's connections are forced off with the database.
    db.drop_now().await;
}
