//! The official JavaScript Centrifuge SDK (`centrifuge` on npm, installed by `npm ci` in
//! `tests/sdk`) drives the real Host over a real socket: connect, attach, bind, subscribe,
//! and the committed events of an admitted input pushed back to it. Runs on SQLite and
//! PostgreSQL.

mod cases {
    use std::time::Duration;

    use serde_json::Value;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;

    pub async fn the_official_javascript_sdk_drives_the_real_host(ts: &TestStore) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
        assert!(
            dir.join("node_modules/centrifuge").is_dir(),
            "the SDK is not installed: run `npm ci` in tests/sdk (.ci/run does)"
        );
        let s = serve(ts, "link-sdk", |o| {
            o.reconcile_interval = Duration::from_millis(100)
        })
        .await;
        let f = factory(ts, &s, "acme");
        let session = sid("sdk");
        create(&f, &session, None, "create").await;
        let url = controller::client::hostlink_url(&s.base, &TenantId::new("acme").unwrap());
        let generation = s.service.generation().to_string();
        let host_id = s.service.config().host_id.to_string();
        let token = s.token("acme");
        let script = dir.join("hostlink_client.mjs");
        let session_arg = session.to_string();
        let node = tokio::spawn(async move {
            tokio::process::Command::new("node")
                .arg(script)
                .args([
                    &url,
                    &token,
                    "acme",
                    &session_arg,
                    &host_id,
                    &generation,
                    BUILD,
                    AGENT,
                    "4",
                    "500",
                ])
                .output()
                .await
        });
        // Once the SDK holds the bind, admit an input: the Host applies it and pushes its events.
        let acme = TenantId::new("acme").unwrap();
        wait_until("the SDK to bind", || {
            s.server.links().tenant_bindings(&acme) > 0
        })
        .await;
        f.admit(
            &session,
            CommandId::new("sdk-command-1").unwrap(),
            input("hello from the SDK"),
        )
        .await
        .unwrap();
        let output = tokio::time::timeout(Duration::from_secs(40), node)
            .await
            .expect("the SDK script finished")
            .unwrap()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "SDK script failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let events: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let of = |name: &str| {
            events
                .iter()
                .filter(|e| e["event"] == name)
                .collect::<Vec<_>>()
        };
        assert_eq!(of("connected")[0]["data"]["version"], 1);
        assert_eq!(of("attach")[0]["data"]["residency"], "resident");
        let bodies: Vec<&Value> = of("publication")
            .iter()
            .map(|p| &p["data"]["body"])
            .collect();
        assert_eq!(bodies.len(), 4, "{stdout}");
        assert_eq!(bodies[0]["type"], "user_message");
        assert_eq!(bodies[0]["cause"]["command_id"], "sdk-command-1");
        assert!(
            bodies
                .iter()
                .any(|b| b["type"] == "assistant_message"
                    && b["text"] == "You said: hello from the SDK"),
            "{stdout}"
        );
        assert!(
            of("publication")
                .iter()
                .all(|p| p["tags"]["record"] == "enduring_publication")
        );
        s.server.shutdown();
        s.server.wait().await;
    }
}

sessionstore::both_backends!(cases => the_official_javascript_sdk_drives_the_real_host);
