//! Who did what, from outside, on SQLite and PostgreSQL alike: a real `hostd serve` takes JWT
//! credentials, and each `hostd` client command acts with a token naming its own principal. A
//! command admitted by one actor shows that actor in `hostd session commands` (human and
//! `--json`), a gate answered by another shows the answerer, a run started by a third shows its
//! starter (and its answerer) in `hostd run status`, a record that names nobody reads as
//! `unknown` (never a made-up name), and the SIGTERM that drains the Host is recorded as the
//! drain's requester, read back by `hostd hosts drains` after the Host is gone.

use std::path::Path;

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::pg::FreshDatabase;
use testkit::process::{HostdClient as Client, Serve, hostd_run, ok};

const PROGRAM: &str = "\
steps:
  - name: approve
    ask: \"Ship it?\"
    answer: {type: boolean}
";

/// A token for tenant `acme` naming `sub`, signed with the tenant's HS256 secret.
fn token(dir: &Path, sub: &str) -> String {
    ok(hostd_run(
        dir,
        &[
            "token",
            "mint",
            "--tenant",
            "acme",
            "--ttl",
            "1h",
            "--key",
            "acme.secret",
            "--sub",
            sub,
        ],
        &[],
    ))
}

/// The client flags of `store` acting with `token`.
fn client(store: &str, token: String) -> Client {
    Client {
        args: vec![
            "--store".into(),
            store.to_owned(),
            "--tenant".into(),
            "acme".into(),
        ],
        env: vec![("HOST_TENANT_TOKEN".into(), token)],
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn commands(dir: &Path, c: &Client, session: &str) -> Vec<Value> {
    c.run(dir, &["--json", "session", "commands", session])
        .lines()
        .map(json)
        .collect()
}

fn attributes_each_act_to_its_actor(dir: &Path, store: &str) {
    std::fs::write(
        dir.join("acme.secret"),
        "the HS256 secret of tenant acme, long enough to sign\n",
    )
    .unwrap();
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let credentials = dir.join("credentials");
    std::fs::write(&credentials, "acme jwt hs256 acme.secret\n").unwrap();
    let host = Serve::fleet_member(dir, "attr-host", store, &credentials, &[]);
    let xavier = client(store, token(dir, "xavier"));
    let yolanda = client(store, token(dir, "yolanda"));
    let zed = client(store, token(dir, "zed"));

    // A session created and written to by xavier; its gate answered by yolanda.
    let s = xavier.run(dir, &["session", "create"]);
    xavier.run(
        dir,
        &["session", "send", &s, r#"/tool write_note {"text":"x"}"#],
    );
    let gate = eventually_blocking("a gate to open", || {
        let gates = json(&xavier.run(dir, &["--json", "session", "gates", &s]));
        match gates.as_array().and_then(|a| a.first()) {
            Some(g) => Ok(g["gate_id"].as_str().unwrap_or_default().to_owned()),
            None => Err(gates.to_string()),
        }
    });
    yolanda.run(dir, &["session", "answer", &s, &gate, "approve"]);

    let listed = commands(dir, &xavier, &s);
    let actors: Vec<(&str, &str)> = listed
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap_or_default(),
                c["actor"].as_str().unwrap_or("<none>"),
            )
        })
        .collect();
    assert_eq!(
        actors,
        [
            ("create", "xavier"),
            ("input", "xavier"),
            ("gate_response", "yolanda")
        ],
        "{listed:?}"
    );
    let human = xavier.run(dir, &["session", "commands", &s]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), 3, "{human}");
    assert!(lines[0].contains("\tby xavier\t"), "{human}");
    assert!(lines[2].contains("gate_response") && lines[2].contains("\tby yolanda\t"));

    // A command admitted by a controller that named nobody: unknown, plainly.
    let anonymous = anonymous_command(store, &s);
    let listed = commands(dir, &xavier, &s);
    let unknown = listed
        .iter()
        .find(|c| c["command_id"] == anonymous.as_str())
        .expect("the anonymous command is listed");
    assert!(unknown["actor"].is_null(), "{unknown}");
    let human = xavier.run(dir, &["session", "commands", &s]);
    let line = human
        .lines()
        .find(|l| l.starts_with(&anonymous))
        .expect("a line for it");
    assert!(line.contains("\tby unknown\t"), "{human}");

    // A run started by zed, its ask answered by yolanda.
    let run = zed.run(dir, &["run", "start", "program.yaml"]);
    assert!(run.starts_with("run-"), "{run}");
    eventually_blocking("the run to park at its ask", || {
        let v = json(&zed.run(dir, &["--json", "run", "status", &run]));
        match v["checkpoint"]["name"].as_str() {
            Some("approve") => Ok(()),
            _ => Err(v.to_string()),
        }
    });
    yolanda.run(dir, &["run", "answer", &run, "approve", "true"]);
    let status = json(&xavier.run(dir, &["--json", "run", "status", &run]));
    assert_eq!(status["started_by"], "zed", "{status}");
    assert_eq!(status["answers"][0]["checkpoint"], "approve", "{status}");
    assert_eq!(status["answers"][0]["answerer"], "yolanda", "{status}");
    let human = xavier.run(dir, &["run", "status", &run]);
    assert!(human.contains("started by zed"), "{human}");
    assert!(human.contains("answered approve by yolanda"), "{human}");

    // SIGTERM drains the Host; the signal is recorded as who asked, and stays after it exits.
    let (exit, log) = host.terminate();
    assert!(exit.success(), "{log}");
    let operator = Client {
        args: vec!["--store".into(), store.to_owned()],
        env: Vec::new(),
    };
    let drains = json(&operator.run(dir, &["--json", "hosts", "drains", "attr-host"]));
    let drains = drains["drains"].as_array().expect("a list of drains");
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert_eq!(drains[0]["requested_by"], "signal:SIGTERM", "{drains:?}");
    assert_eq!(drains[0]["host_id"], "attr-host");
    let human = operator.run(dir, &["hosts", "drains"]);
    assert!(
        human.contains("attr-host") && human.contains("signal:SIGTERM"),
        "{human}"
    );
}

/// Admits an input to `session` straight into the store with no principal (as a controller
/// that names nobody does); its id.
fn anonymous_command(store: &str, session: &str) -> String {
    let id = format!("anon-{}", uuid::Uuid::now_v7().simple());
    let (store, session, command) = (store.to_owned(), session.to_owned(), id.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let store = sessionstore::Store::open(sessionstore::StoreOptions::new(store))
            .await
            .expect("the store opens");
        let body =
            sessionstore::wire::encode_command_body(&sessionstore::wire::CommandBodyV1::Input {
                text: "nobody said this".into(),
            });
        store
            .admit(sessionstore::NewCommand {
                tenant: sessionstore::TenantId::new("acme").unwrap(),
                session: sessionstore::SessionId::new(session).unwrap(),
                command: sessionstore::CommandId::new(command).unwrap(),
                kind: sessionstore::CommandKind::Input,
                body: sessionstore::CommandBody::Inline(body),
                principal: None,
                metadata: None,
                trace: None,
                apply_within: std::time::Duration::from_secs(600),
            })
            .await
            .expect("the store admits it");
        store.close().await;
    });
    id
}

#[test]
fn each_act_is_attributed_to_its_actor_on_sqlite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", tmp.path().join("attr.db").display());
    attributes_each_act_to_its_actor(tmp.path(), &store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_act_is_attributed_to_its_actor_on_postgres() {
    let Some(db) = FreshDatabase::create("attribution").await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || attributes_each_act_to_its_actor(&dir, &url))
        .await
        .expect("the case ran");
    db.drop_now().await;
}
