//! The official JavaScript Centrifuge SDK (`tests/sdk/jwt_refresh.mjs`) on JWT connection
//! tokens against the real Host: a token that expires every 2 s is refreshed by the SDK's own
//! `getToken` callback (the connect and refresh replies carry `expires`/`ttl`) while its
//! subscription carries on with contiguous offsets; a callback that returns a bad token ends
//! the link with the documented code (4500). Credentials come from a real credential file.
//! Runs on SQLite and PostgreSQL.

mod cases {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use hostlink::jwt::{JwtAlgorithm, SigningKey};
    use hostlink::live_credentials::LiveCredentials;
    use hostlink_server::LinkOptions;
    use serde_json::Value;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;

    const SECRET: &str = "a test secret shared by the Host and the SDK script";

    /// A Host whose `acme` tenant is on HS256 JWTs from a credential file; the controller
    /// holds a long-lived token of its own.
    async fn jwt_host(ts: &TestStore, dir: &Path, name: &str) -> Served {
        std::fs::write(dir.join("acme.secret"), SECRET).unwrap();
        let file = dir.join("credentials");
        std::fs::write(&file, "acme jwt hs256 acme.secret\n").unwrap();
        let live = Arc::new(LiveCredentials::load(Some(file), None).unwrap());
        let controller_token =
            SigningKey::from_file(JwtAlgorithm::Hs256, &dir.join("acme.secret"), None)
                .unwrap()
                .mint("acme", "controller", 3600, None, None)
                .unwrap();
        serve_with_verifier(
            ts,
            name,
            |o| o.reconcile_interval = Duration::from_millis(100),
            LinkOptions::default(),
            Box::new(live),
            vec![(TenantId::new("acme").unwrap(), controller_token)],
        )
        .await
    }

    fn sdk_dir() -> std::path::PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
        assert!(
            dir.join("node_modules/centrifuge").is_dir(),
            "the SDK is not installed: run `npm ci` in tests/sdk (.ci/run does)"
        );
        dir
    }

    fn events(output: &std::process::Output) -> (Vec<Value>, String) {
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "SDK script failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let events = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (events, stdout)
    }

    fn script(
        s: &Served,
        session: &SessionId,
        mode: &str,
        expected: &str,
    ) -> tokio::process::Command {
        let url = controller::client::hostlink_url(&s.base, &TenantId::new("acme").unwrap());
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg(sdk_dir().join("jwt_refresh.mjs")).args([
            url.as_str(),
            "acme",
            session.as_str(),
            s.service.config().host_id.as_str(),
            &s.service.generation().to_string(),
            BUILD,
            AGENT,
            SECRET,
            "2",
            mode,
            expected,
        ]);
        cmd
    }

    pub async fn the_sdk_refreshes_a_two_second_token_by_its_own_callback_and_its_offsets_stay_contiguous(
        ts: &TestStore,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = jwt_host(ts, dir.path(), "jwt-sdk-refresh").await;
        let f = factory(ts, &s, "acme");
        let session = sid("jwt-sdk");
        create(&f, &session, None, "create").await;
        let node = script(&s, &session, "refresh", "8").output();
        let node = tokio::spawn(node);
        let acme = TenantId::new("acme").unwrap();
        wait_until("the SDK to bind", || {
            s.server.links().tenant_bindings(&acme) > 0
        })
        .await;
        f.admit(
            &session,
            CommandId::new("jwt-1").unwrap(),
            input("before the refreshes"),
        )
        .await
        .unwrap();
        // Long enough for the 2 s token to be refreshed twice.
        tokio::time::sleep(Duration::from_millis(4500)).await;
        f.admit(
            &session,
            CommandId::new("jwt-2").unwrap(),
            input("after the refreshes"),
        )
        .await
        .unwrap();
        let output = tokio::time::timeout(Duration::from_secs(60), node)
            .await
            .expect("the SDK script finished")
            .unwrap()
            .expect("node runs");
        let (mut events, stdout) = events(&output);
        // What happened before the script's own disconnect.
        let end = events
            .iter()
            .position(|e| e["event"] == "still_connected")
            .expect("the script saw every publication");
        assert_eq!(events[end]["state"], "connected", "{stdout}");
        events.truncate(end);
        let of = |name: &str| events.iter().filter(|e| e["event"] == name).count();
        assert!(of("get_token") >= 2, "{stdout}");
        // One connection throughout: the SDK's first `connecting` only, no reconnect.
        assert_eq!(of("connected"), 1, "{stdout}");
        assert_eq!(of("connecting"), 1, "{stdout}");
        assert_eq!(of("disconnected") + of("unsubscribed"), 0, "{stdout}");
        // Both turns, across the refreshes, with no gap (the subscription starts after the
        // session's creation record).
        let offsets: Vec<u64> = events
            .iter()
            .filter(|e| e["event"] == "publication")
            .map(|e| e["offset"].as_u64().unwrap())
            .collect();
        let first = offsets[0];
        assert_eq!(offsets, (first..first + 8).collect::<Vec<_>>(), "{stdout}");
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_get_token_callback_that_returns_a_bad_token_ends_the_link_with_4500(
        ts: &TestStore,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = jwt_host(ts, dir.path(), "jwt-sdk-bad").await;
        let session = sid("jwt-sdk-bad");
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            script(&s, &session, "bad", "0").output(),
        )
        .await
        .expect("the SDK script finished")
        .expect("node runs");
        let (events, stdout) = events(&output);
        let done = events.iter().find(|e| e["event"] == "done").unwrap();
        assert_eq!(done["code"], 4500, "{stdout}");
        assert!(events.iter().any(|e| e["event"] == "get_token"), "{stdout}");
        s.server.shutdown();
        s.server.wait().await;
    }
}

sessionstore::both_backends!(cases =>
    the_sdk_refreshes_a_two_second_token_by_its_own_callback_and_its_offsets_stay_contiguous,
    a_get_token_callback_that_returns_a_bad_token_ends_the_link_with_4500,
);
