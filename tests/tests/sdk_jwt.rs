//! The official JavaScript Centrifuge SDK (`tests/sdk/jwt_refresh.mjs`) on JWT connection
//! tokens against the real Host: a token that expires every 2 s is refreshed by the SDK's own
//! `getToken` callback (the connect and refresh replies carry `expires`/`ttl`) while its
//! subscription carries on with contiguous offsets; a callback that returns a bad token ends
//! the link with the documented code (4500); HS256, RS256, ES256 and JWKS tokens connect, while
//! `alg: none`, a wrong key, a wrong tenant claim and a wrong audience are refused alike
//! (4500, counted by reason in /metrics) and an expired token is answered "token expired";
//! editing the credential file while links are up closes exactly the links whose credential
//! went (4502). Credentials come from real files; keys are generated at test time. Runs on
//! SQLite and PostgreSQL.

mod cases {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use hostlink::jwt::{JwtAlgorithm, SigningKey, unix_now};
    use hostlink::live_credentials::{LiveCredentials, POLL_INTERVAL};
    use hostlink_server::LinkOptions;
    use serde_json::Value;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::jwt_keys::{KeyPair, write_jwks, write_secret};
    use testkit::*;
    use tokio::io::{AsyncBufReadExt, BufReader, Lines};
    use tokio::process::{Child, ChildStdout};

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

    /// One SDK link held by `jwt_hold.mjs`, and what it prints.
    struct Hold {
        child: Child,
        lines: Lines<BufReader<ChildStdout>>,
    }

    impl Hold {
        fn start(s: &Served, tenant: &str, token: &str) -> Hold {
            let url = controller::client::hostlink_url(&s.base, &TenantId::new(tenant).unwrap());
            let mut child = tokio::process::Command::new("node")
                .arg(sdk_dir().join("jwt_hold.mjs"))
                .args([url.as_str(), token])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("node runs");
            let lines = BufReader::new(child.stdout.take().unwrap()).lines();
            Hold { child, lines }
        }

        /// The next event the SDK reported (errors skipped).
        async fn next(&mut self) -> Value {
            loop {
                let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                    .await
                    .expect("the SDK said something in time")
                    .unwrap()
                    .expect("the SDK script is still running");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["event"] != "client_error" {
                    return v;
                }
            }
        }

        async fn connected(mut self) -> Hold {
            let e = self.next().await;
            assert_eq!(e["event"], "connected", "{e}");
            self
        }

        /// The code the link ended with.
        async fn disconnect_code(&mut self) -> i64 {
            let e = self.next().await;
            assert_eq!(e["event"], "disconnected", "{e}");
            e["code"].as_i64().unwrap()
        }

        /// Still holding its link after `wait` (the SDK reported nothing).
        async fn still_up_after(&mut self, wait: Duration) -> bool {
            tokio::time::timeout(wait, self.lines.next_line())
                .await
                .is_err()
                && self.child.try_wait().unwrap().is_none()
        }
    }

    fn unsigned(claims: Value) -> String {
        use base64::Engine;
        let b64 = |v: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.",
            b64(r#"{"alg":"none","typ":"JWT"}"#.into()),
            b64(claims.to_string())
        )
    }

    pub async fn hs256_rs256_es256_and_jwks_tokens_connect_and_every_mismatch_is_refused_alike(
        ts: &TestStore,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let hs = write_secret(&d.join("acme.secret"), SECRET);
        let rs = KeyPair::generate(JwtAlgorithm::Rs256, d, "rs");
        let es = KeyPair::generate(JwtAlgorithm::Es256, d, "es");
        write_jwks(&d.join("keys.jwks"), &[&rs, &es]);
        let file = d.join("credentials");
        std::fs::write(
            &file,
            "acme jwt hs256 acme.secret aud=hostlink leeway=0\nrsa-t jwt rs256 rs.pub\nec-t jwt es256 es.pub\njwks-t jwt jwks keys.jwks\n",
        )
        .unwrap();
        let live = Arc::new(LiveCredentials::load(Some(file), None).unwrap());
        let s = serve_with_verifier(
            ts,
            "jwt-sdk-kinds",
            |_| {},
            LinkOptions::default(),
            Box::new(live),
            vec![],
        )
        .await;
        let aud = Some("hostlink");
        for (tenant, token) in [
            ("acme", hs.mint("acme", "alice", 60, aud, None).unwrap()),
            ("rsa-t", rs.mint("rsa-t", "alice", 60, None)),
            ("ec-t", es.mint("ec-t", "alice", 60, None)),
            ("jwks-t", rs.mint("jwks-t", "alice", 60, None)),
            ("jwks-t", es.mint("jwks-t", "alice", 60, None)),
        ] {
            Hold::start(&s, tenant, &token).connected().await;
        }
        let exp = unix_now() + 60;
        let other = write_secret(
            &d.join("other.secret"),
            "not the tenant's secret, but as long",
        );
        for (what, token) in [
            (
                "alg none",
                unsigned(
                    serde_json::json!({"sub": "alice", "tenant": "acme", "exp": exp, "aud": "hostlink"}),
                ),
            ),
            (
                "a wrong key",
                other.mint("acme", "alice", 60, aud, None).unwrap(),
            ),
            (
                "a wrong tenant claim",
                hs.mint("globex", "alice", 60, aud, None).unwrap(),
            ),
            (
                "a wrong audience",
                hs.mint("acme", "alice", 60, Some("elsewhere"), None)
                    .unwrap(),
            ),
            (
                "an RS256 key for the HS256 tenant",
                rs.mint("acme", "alice", 60, aud),
            ),
        ] {
            let mut held = Hold::start(&s, "acme", &token);
            assert_eq!(held.disconnect_code().await, 4500, "{what}");
        }
        // An expired token is answered "token expired": the SDK asks for a fresh one, and
        // with no getToken to ask it gives up by itself (its own code 1, "unauthorized").
        let expired = hs.mint("acme", "alice", 1, aud, None).unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut held = Hold::start(&s, "acme", &expired);
        assert_eq!(held.disconnect_code().await, 1);
        let (_, metrics) = get(&s.http("/metrics")).await;
        for reason in [
            "algorithm_not_allowed",
            "bad_signature",
            "wrong_tenant",
            "wrong_audience",
            "expired",
        ] {
            let line = format!("host_link_credential_refusals_total{{reason=\"{reason}\"}}");
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with(&line) && !l.ends_with(" 0")),
                "{line} in:\n{metrics}"
            );
        }
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn editing_the_credential_file_while_links_are_up_closes_only_the_links_whose_credential_went(
        ts: &TestStore,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let es = KeyPair::generate(JwtAlgorithm::Es256, d, "es");
        let globex = write_secret(&d.join("globex.secret"), SECRET);
        let file = d.join("credentials");
        std::fs::write(
            &file,
            "acme jwt es256 es.pub\nglobex jwt hs256 globex.secret\n",
        )
        .unwrap();
        let live = Arc::new(LiveCredentials::load(Some(file.clone()), None).unwrap());
        tokio::spawn(live.clone().follow(POLL_INTERVAL));
        let s = serve_with_verifier(
            ts,
            "jwt-sdk-rotate",
            |_| {},
            LinkOptions::default(),
            Box::new(live),
            vec![],
        )
        .await;
        let mut acme = Hold::start(&s, "acme", &es.mint("acme", "alice", 600, None))
            .connected()
            .await;
        let mut g = Hold::start(
            &s,
            "globex",
            &globex.mint("globex", "bob", 600, None, None).unwrap(),
        )
        .connected()
        .await;

        // Rotation: acme's line now names a new key; its link closes, globex's does not.
        let es2 = KeyPair::generate(JwtAlgorithm::Es256, d, "es2");
        std::fs::write(
            &file,
            "acme jwt es256 es2.pub\nglobex jwt hs256 globex.secret\n",
        )
        .unwrap();
        let edited = std::time::Instant::now();
        assert_eq!(acme.disconnect_code().await, 4502);
        assert!(
            edited.elapsed() < Duration::from_secs(2),
            "{:?}",
            edited.elapsed()
        );
        assert!(g.still_up_after(Duration::from_secs(1)).await);
        let _acme = Hold::start(&s, "acme", &es2.mint("acme", "alice", 600, None))
            .connected()
            .await;
        let mut stale = Hold::start(&s, "acme", &es.mint("acme", "alice", 600, None));
        assert_eq!(stale.disconnect_code().await, 4500);

        // Revocation: globex's line is removed; its link closes within 2 s.
        std::fs::write(&file, "acme jwt es256 es2.pub\n").unwrap();
        let edited = std::time::Instant::now();
        assert_eq!(g.disconnect_code().await, 4502);
        assert!(
            edited.elapsed() < Duration::from_secs(2),
            "{:?}",
            edited.elapsed()
        );
        s.server.shutdown();
        s.server.wait().await;
    }
}

sessionstore::both_backends!(cases =>
    the_sdk_refreshes_a_two_second_token_by_its_own_callback_and_its_offsets_stay_contiguous,
    a_get_token_callback_that_returns_a_bad_token_ends_the_link_with_4500,
    hs256_rs256_es256_and_jwks_tokens_connect_and_every_mismatch_is_refused_alike,
    editing_the_credential_file_while_links_are_up_closes_only_the_links_whose_credential_went,
);
