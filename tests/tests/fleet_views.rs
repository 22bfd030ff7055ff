//! The fleet's views from the command line, against a real `hostd serve` (embedded default):
//! `hostd hosts ls` lists the Host with its generation, capacity used and free, draining and
//! sessions; `hostd session commands <S>` lists a session's commands with their state,
//! outcome, attempting Host and epoch. Text and `--json` alike.

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::process::{Serve, hostd_run, ok, tenant_credentials};

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("one JSON value per line"))
        .collect()
}

#[test]
fn hosts_ls_and_session_commands_show_the_registry_and_a_sessions_inbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let host = Serve::start(
        dir,
        "views",
        &[
            "--data-dir",
            ".hostd",
            "--host-id",
            "views-host",
            "--registry-heartbeat",
            "200ms",
            "--registry-expiry",
            "1s",
        ],
    );
    let s = ok(hostd_run(
        dir,
        &["session", "create", "--message", "hello"],
        &[],
    ));
    ok(hostd_run(dir, &["session", "send", &s, "again"], &[]));

    // The registry: one live Host holding the session (its heartbeat publishes the weight).
    let hosts = eventually_blocking("the heartbeat to publish the weight", || {
        let hosts = lines(&ok(hostd_run(
            dir,
            &["hosts", "ls", "--json", "--data-dir", ".hostd"],
            &[],
        )));
        match hosts.first() {
            Some(h) if h["capacity_used"] == 1 => Ok(hosts),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    let h = &hosts[0];
    assert_eq!(h["host_id"], "views-host");
    assert_eq!(h["generation"], 1);
    assert_eq!(h["live"], true);
    assert_eq!(h["draining"], false);
    assert_eq!(h["sessions"], 1);
    assert_eq!(
        h["capacity_free"].as_u64().unwrap() + 1,
        h["capacity"].as_u64().unwrap()
    );
    let text = ok(hostd_run(
        dir,
        &["hosts", "ls", "--data-dir", ".hostd"],
        &[],
    ));
    assert!(
        text.contains("views-host") && text.contains("accepting"),
        "{text}"
    );

    // The session's inbox: the create and the input, applied by epoch 1 on this Host.
    let commands = lines(&ok(hostd_run(
        dir,
        &["session", "commands", &s, "--json"],
        &[],
    )));
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert_eq!(commands[0]["kind"], "create");
    assert_eq!(commands[1]["kind"], "input");
    for c in &commands {
        assert_eq!(c["state"], "applied");
        assert_eq!(c["outcome"], "applied");
        assert_eq!(c["epoch"], 1);
        assert_eq!(c["attempting_host"], "views-host");
    }
    let text = ok(hostd_run(dir, &["session", "commands", &s], &[]));
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains("host views-host"), "{text}");

    let (status, log) = host.terminate();
    assert!(status.success(), "{log}");
}

/// `hostd controller` alone places a session with admitted work on a Host whose own
/// reconciler is off, and stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostd_controller_alone_places_what_hosts_without_a_reconciler_leave() {
    use sessionstore::wire::{CommandBodyV1, encode_command_body};
    use sessionstore::*;

    let Some(db) = testkit::pg::FreshDatabase::create("controller_alone").await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    tenant_credentials(dir, "acme");
    let host = Serve::start(
        dir,
        "alone-host",
        &[
            "--store",
            &db.url,
            "--credentials-file",
            "credentials",
            "--data-dir",
            ".hostd-alone",
            "--host-id",
            "alone-host",
            "--fleet-reconciler",
            "off",
            "--registry-heartbeat",
            "200ms",
            "--registry-expiry",
            "1s",
            "--reconcile-interval",
            "100ms",
        ],
    );
    let store = Store::open(StoreOptions::new(db.url.clone()))
        .await
        .unwrap();
    let s = store
        .create_session(NewSession {
            tenant: TenantId::new("acme").unwrap(),
            session: SessionId::new("alone-1").unwrap(),
            agent: AgentId::new("assistant").unwrap(),
            compatibility: CompatibilityId::new("hostd-scripted-1").unwrap(),
            binding: SessionBinding {
                runtime_session_id: RuntimeSessionId::mint(),
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .unwrap();
    let body = CommandBodyV1::Create {
        text: Some("hello".into()),
    };
    let create = store
        .admit(NewCommand {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: CommandId::new("create").unwrap(),
            kind: body.kind(),
            body: CommandBody::Inline(encode_command_body(&body)),
            principal: None,
            metadata: None,
            apply_within: std::time::Duration::from_secs(600),
            trace: None,
        })
        .await
        .unwrap();
    let mut controller = testkit::process::hostd_command(dir)
        .args([
            "controller",
            "--store",
            &db.url,
            "--name",
            "alone",
            "--fleet-interval",
            "100ms",
            "--fleet-leader-ttl",
            "1s",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("hostd controller starts");
    let done = testkit::terminal(&store, &s, &create.command).await;
    assert_eq!(done.outcome, Some(Outcome::Applied), "{done:?}");
    let lease = store
        .residency(&s.tenant, &s.session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.host.as_ref().map(|h| h.as_str()), Some("alone-host"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(controller.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = controller.wait().unwrap();
    assert!(status.success(), "{status}");
    testkit::check_exactly_once(&store, &s).await;
    let (status, log) = host.terminate();
    assert!(status.success(), "{log}");
    store.close().await;
    db.drop_now().await;
}
