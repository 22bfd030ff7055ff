//! The official JavaScript Centrifuge SDK follows a workflow run over its channel on the real
//! Host (real socket, real store, SQLite and PostgreSQL): it starts the run, subscribes to the
//! run's channel, sees the steps begin, finish and park, answers the ask, and sees the answer
//! taken and the run finish. Another tenant's channel and an unknown run's are refused alike.

mod cases {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    use host::Host;
    use hostlink::auth::{CredentialStore, credential_digest_hex, mint_credential};
    use run_hosting::agents::ServiceAgents;
    use run_hosting::hosting::{RunHost, RunHosting, RunOptions};
    use serde_json::Value;
    use sessionstore::TenantId;
    use sessionstore::testing::TestStore;
    use testkit::*;
    use tokio::net::TcpListener;
    use workflow::{StoreReleases, WorkspaceRunnables};

    const PROGRAM: &str = "\
steps:
  - name: warm-up
    sleep: 1s
  - name: approve
    ask: Go on?
    answer: {type: boolean}
  - name: greet
    agent: assistant
    prompt: \"hello ${input.name}\"
";

    pub async fn the_official_javascript_sdk_follows_a_runs_channel(ts: &TestStore) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
        assert!(
            dir.join("node_modules/centrifuge").is_dir(),
            "the SDK is not installed: run `npm ci` in tests/sdk (.ci/run does)"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut opts = options("link-sdk-runs");
        opts.internal_endpoint = Some(format!("ws://{addr}"));
        let (service, _) = started(ts, opts).await;
        let (token, _) = mint_credential();
        let token = token.expose_secret().to_owned();
        let mut creds = CredentialStore::empty();
        let acme = TenantId::new("acme").unwrap();
        creds
            .add(acme.clone(), &credential_digest_hex(&token))
            .unwrap();
        let agents = ServiceAgents::new(service.clone());
        let env = Arc::new(WorkspaceRunnables {
            runner: None,
            agents: agents.agents().into_iter().collect::<BTreeSet<_>>(),
        });
        let state = tempfile::tempdir().unwrap();
        let releases = Arc::new(StoreReleases::new(
            service.store().clone(),
            None,
            state.path(),
        ));
        let runs = RunHost::new(RunHosting {
            store: service.store().clone(),
            host_id: service.config().host_id.clone(),
            env,
            releases: releases.clone(),
            invoker: releases,
            agents: Some(Arc::new(agents)),
            options: RunOptions {
                poll: Duration::from_millis(20),
                ..RunOptions::default()
            },
            metrics: None,
        });
        let server = Host::builder(service.clone())
            .auth(Box::new(creds))
            .extension(Arc::new(runs.clone()))
            .serve(listener)
            .await
            .unwrap();
        eventually("the run reconcile", async || {
            check(runs.ready(), || "not ready".into())
        })
        .await;
        let tmp = tempfile::tempdir().unwrap();
        let program = tmp.path().join("program.yaml");
        std::fs::write(&program, PROGRAM).unwrap();
        let url = controller::client::hostlink_url(&format!("ws://{addr}"), &acme);
        let output = tokio::time::timeout(
            Duration::from_secs(40),
            tokio::process::Command::new("node")
                .arg(dir.join("run_channel.mjs"))
                .args([&url, &token, "acme", program.to_str().unwrap()])
                .output(),
        )
        .await
        .expect("the SDK script finished")
        .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "SDK script failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let refused: Vec<(String, i64)> = lines
            .iter()
            .filter(|l| l["event"] == "refused")
            .map(|l| {
                (
                    l["which"].as_str().unwrap().to_owned(),
                    l["code"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        assert_eq!(
            refused,
            [("foreign".to_owned(), 103), ("unknown".to_owned(), 103)],
            "{stdout}"
        );
        let seen: Vec<(String, String, String)> = lines
            .iter()
            .filter(|l| l["event"] == "publication")
            .map(|l| {
                let d = &l["data"];
                (
                    d["step"].as_str().unwrap_or_default().to_owned(),
                    d["kind"].as_str().unwrap_or_default().to_owned(),
                    d["phase"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let t = |s: &str, k: &str, p: &str| (s.to_owned(), k.to_owned(), p.to_owned());
        // Subscribed during the 1 s sleep (its start may come before or after the subscribe):
        // everything from its end on, in order.
        let from_sleep_end: Vec<_> = seen
            .iter()
            .skip_while(|e| **e == t("warm-up", "sleep", "started"))
            .cloned()
            .collect();
        assert_eq!(
            from_sleep_end,
            [
                t("warm-up", "sleep", "finished"),
                t("approve", "ask", "started"),
                t("approve", "ask", "parked"),
                t("approve", "ask", "answered"),
                // The answer woke the parked run: a new driver replays and goes on.
                t("warm-up", "sleep", "replayed"),
                t("approve", "ask", "started"),
                t("approve", "ask", "finished"),
                t("greet", "agent", "started"),
                t("greet", "agent", "finished"),
                t("greet", "run", "finished"),
            ],
            "{stdout}"
        );
        let last = lines
            .iter()
            .rfind(|l| l["event"] == "done")
            .expect("a done line");
        assert_eq!(last["outcome"], "completed", "{stdout}");
        let every_run = lines
            .iter()
            .filter(|l| l["event"] == "publication")
            .all(|l| l["data"]["run_id"] == lines[1]["run_id"]);
        assert!(every_run, "only the run's own events: {stdout}");
        server.shutdown();
        server.wait().await;
    }
}

sessionstore::both_backends!(cases => the_official_javascript_sdk_follows_a_runs_channel);
