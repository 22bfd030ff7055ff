//! The operator console's JSON API over a real socket, on SQLite and PostgreSQL: who gets in
//! (operators only, never a tenant token), what each role may do (a read-only operator cannot
//! answer a gate or drain), a gate answered from the console runs its tool once through the
//! command path and is attributed to the operator, paging, stable error codes, and that no
//! runtime-private id leaves it.

use std::sync::Arc;

use console::{Console, Operators};
use hostlink::auth::mint_credential;
use serde_json::{Value, json};
use sessionstore::testing::TestStore;
use sessionstore::{CommandId, TenantId};
use testkit::*;

/// `text` percent-encoded for a query string.
fn urlencoding(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Fixture {
    base: String,
    http: reqwest::Client,
    read: String,
    operate: String,
    tenant_token: String,
    svc: host::Service,
    rocket: Arc<CountingTool>,
    c: Controller,
    task: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(ts: &TestStore, host: &str) -> Fixture {
        let (svc, rocket) = started(ts, options(host)).await;
        let (read, read_digest) = mint_credential();
        let (operate, operate_digest) = mint_credential();
        let (tenant_token, _) = mint_credential();
        let text = format!(
            "# test operators\nreader read {read_digest}\nalice operate {operate_digest}\n"
        );
        let operators = Operators::parse("test", &text).unwrap();
        let router = Console::new(
            svc.clone(),
            None,
            vec![TenantId::new("acme").unwrap()],
            operators,
        )
        .router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Fixture {
            base: format!("http://{addr}/console/api/v1"),
            http: reqwest::Client::new(),
            read: read.expose_secret().to_owned(),
            operate: operate.expose_secret().to_owned(),
            tenant_token: tenant_token.expose_secret().to_owned(),
            svc,
            rocket,
            c: Controller::new(ts),
            task,
        }
    }

    async fn get(&self, token: Option<&str>, path: &str) -> (u16, Value) {
        let mut r = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, token: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        let mut r = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn stop(self) {
        self.task.abort();
        self.svc.stop().await;
    }
}

mod cases {
    use super::*;

    pub async fn only_an_operator_credential_opens_the_console_and_a_tenant_token_gets_nothing(
        ts: &TestStore,
    ) {
        let f = Fixture::start(ts, "h-console-auth").await;
        for path in [
            "/whoami",
            "/hosts",
            "/sessions",
            "/gates",
            "/runs",
            "/metrics",
        ] {
            for token in [None, Some(f.tenant_token.as_str()), Some("not-a-token")] {
                let (status, body) = f.get(token, path).await;
                assert_eq!(status, 401, "{path} with {token:?}: {body}");
                assert_eq!(body["error"]["code"], "unauthenticated", "{body}");
            }
            let (status, _) = f.get(Some(&f.read), path).await;
            assert_eq!(status, 200, "{path} as a reader");
        }
        let (_, me) = f.get(Some(&f.read), "/whoami").await;
        assert_eq!(me["operator"], json!({"name": "reader", "role": "read"}));
        // The login sets an HttpOnly, same-site cookie and refuses a tenant token.
        let (status, body) = f
            .post(None, "/login", json!({"token": f.tenant_token}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (401, json!("unauthenticated"))
        );
        let resp = f
            .http
            .post(format!("{}/login", f.base))
            .json(&json!({"token": f.operate}))
            .send()
            .await
            .unwrap();
        let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        let value = cookie.split(';').next().unwrap().to_owned();
        let me = f
            .http
            .get(format!("{}/whoami", f.base))
            .header("cookie", value)
            .send()
            .await
            .unwrap();
        assert_eq!(me.status().as_u16(), 200);
        // An unknown API path is a JSON refusal with a stable code too.
        let (status, body) = f.get(Some(&f.read), "/nothing-here").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (404, json!("not_found"))
        );
        f.stop().await;
    }

    pub async fn a_gate_answered_from_the_console_runs_its_tool_once_and_names_the_operator(
        ts: &TestStore,
    ) {
        let f = Fixture::start(ts, "h-console-gate").await;
        let s = f.c.session().await;
        f.c.attach(&f.svc, &s).await;
        f.c.admit(&s, input("/tool launch_rocket {}")).await;
        let gate = f.c.open_gate(&s).await;
        let (_, gates) = f.get(Some(&f.read), "/gates").await;
        assert_eq!(gates["gates"][0]["gate_id"], gate.to_string(), "{gates}");
        let path = format!("/gates/acme/{}/{gate}", s.session);
        // A read-only operator is refused, and nothing is admitted.
        let (status, body) = f
            .post(Some(&f.read), &path, json!({"action": "approve"}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (403, json!("forbidden"))
        );
        assert_eq!(f.rocket.runs.load(std::sync::atomic::Ordering::SeqCst), 0);
        let (status, body) = f
            .post(Some(&f.operate), &path, json!({"action": "approve"}))
            .await;
        assert_eq!(status, 200, "{body}");
        let command = CommandId::new(body["command_id"].as_str().unwrap()).unwrap();
        let done = terminal(&ts.store, &s, &command).await;
        assert_eq!(done.outcome, Some(sessionstore::Outcome::Applied));
        assert_eq!(done.principal.as_deref(), Some("operator:alice"));
        let (_, view) = f
            .get(Some(&f.read), &format!("/sessions/acme/{}", s.session))
            .await;
        let answer = view["commands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["command_id"] == command.as_str())
            .cloned()
            .unwrap();
        assert_eq!(answer["actor"], "operator:alice", "{answer}");
        f.c.wait_events(&s, "the turn to end", |evs| count(evs, "turn_done") >= 1)
            .await;
        assert_eq!(f.rocket.runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The gate is closed: answering again is not found, and the tool never runs twice.
        let (status, _) = f
            .post(Some(&f.operate), &path, json!({"action": "approve"}))
            .await;
        assert_eq!(status, 404);
        assert_eq!(f.rocket.runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        f.c.check_exactly_once(&s).await;
        f.stop().await;
    }

    pub async fn a_session_view_shows_commands_gates_and_journal_and_no_runtime_private_id(
        ts: &TestStore,
    ) {
        let f = Fixture::start(ts, "h-console-private").await;
        let s = f.c.session().await;
        f.c.attach(&f.svc, &s).await;
        let cmd = f.c.admit(&s, input("hello")).await;
        terminal(&ts.store, &s, &cmd.command).await;
        f.c.wait_events(&s, "the turn to end", |evs| count(evs, "turn_done") >= 1)
            .await;
        let (status, view) = f
            .get(Some(&f.read), &format!("/sessions/acme/{}", s.session))
            .await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["session"]["resident_here"], true);
        assert_eq!(view["session"]["command_blocked"], false);
        assert_eq!(
            view["session"]["last_command"],
            json!({"command_id": cmd.command.as_str(), "kind": "input", "state": "applied"})
        );
        // Newest first.
        assert_eq!(view["commands"][0]["command_id"], cmd.command.as_str());
        let ids: Vec<&str> = view["commands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["command_id"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&cmd.command.as_str()), "{view}");
        assert!(
            view["journal"]["events"].as_array().unwrap().len() >= 3,
            "{view}"
        );
        let text = view.to_string();
        let stored = ts
            .store
            .command(&s.tenant, &s.session, &cmd.command)
            .await
            .unwrap();
        let attempt = stored.attempt.as_ref().map(|a| a.id.to_string()).unwrap();
        for private in [
            s.binding.runtime_session_id.to_string(),
            stored.runtime_command.to_string(),
            attempt,
        ] {
            assert!(!text.contains(&private), "{private} leaked in {text}");
        }
        // An unknown session and a tenant the console does not list are not found.
        let (status, body) = f.get(Some(&f.read), "/sessions/acme/nope").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (404, json!("not_found"))
        );
        let (status, _) = f
            .get(Some(&f.read), &format!("/sessions/globex/{}", s.session))
            .await;
        assert_eq!(status, 404);
        f.stop().await;
    }

    pub async fn sessions_page_with_a_cursor_and_a_bad_limit_is_a_stable_refusal(ts: &TestStore) {
        let f = Fixture::start(ts, "h-console-pages").await;
        let mut made = Vec::new();
        for _ in 0..3 {
            made.push(f.c.session().await.session.to_string());
        }
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let q = match &after {
                Some(a) => format!("/sessions?limit=1&after={a}"),
                None => "/sessions?limit=1".into(),
            };
            let (status, page) = f.get(Some(&f.read), &q).await;
            assert_eq!(status, 200, "{page}");
            for r in page["sessions"].as_array().unwrap() {
                seen.push(r["session_id"].as_str().unwrap().to_owned());
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_owned()),
                None => break,
            }
        }
        for m in &made {
            assert_eq!(
                seen.iter().filter(|s| *s == m).count(),
                1,
                "{m} in {seen:?}"
            );
        }
        let (status, body) = f.get(Some(&f.read), "/sessions?limit=0").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (400, json!("invalid"))
        );
        f.stop().await;
    }

    pub async fn runs_page_newest_first_with_a_cursor_and_an_unknown_cursor_is_not_found(
        ts: &TestStore,
    ) {
        let f = Fixture::start(ts, "h-console-run-pages").await;
        testkit::runs::completed_runs(&ts.store, "acme", "run", 3).await;
        let ids = |page: &Value| -> Vec<String> {
            page["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["run_id"].as_str().unwrap().to_owned())
                .collect()
        };
        let (status, first) = f.get(Some(&f.read), "/runs?limit=2").await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(ids(&first), ["run-0002", "run-0001"], "{first}");
        assert_eq!(first["next"], "run-0001", "{first}");
        let (status, last) = f.get(Some(&f.read), "/runs?limit=2&after=run-0001").await;
        assert_eq!(status, 200, "{last}");
        assert_eq!(ids(&last), ["run-0000"], "{last}");
        assert_eq!(last["next"], Value::Null, "{last}");
        let (status, body) = f.get(Some(&f.read), "/runs?after=run-zzz").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (404, json!("not_found")),
            "{body}"
        );
        let (status, body) = f.get(Some(&f.read), "/runs?limit=0").await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (400, json!("invalid"))
        );
        f.stop().await;
    }

    pub async fn open_gates_page_oldest_first_and_a_cursor_may_name_ids_with_a_slash(
        ts: &TestStore,
    ) {
        let f = Fixture::start(ts, "h-console-gate-pages").await;
        let mut opened = Vec::new();
        for n in 0..3 {
            let s = f.c.session().await;
            let gate = sessionstore::GateId::new(format!("gate/{n}")).unwrap();
            ts.store
                .open_gate(
                    &s.tenant,
                    &s.session,
                    sessionstore::ResidencyEpoch(1),
                    sessionstore::OpenGate {
                        gate: gate.clone(),
                        opened_event: sessionstore::EventId::new(format!("e{n}")).unwrap(),
                        opened_seq: 1,
                        kind: "permission".into(),
                        prompt_summary: format!("allow {n}?"),
                        deadline_ms: i64::MAX / 2,
                    },
                )
                .await
                .unwrap();
            opened.push(gate.to_string());
            // Each a moment after the last, so the order is the order of opening.
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let q = match &after {
                Some(a) => format!("/gates?limit=2&after={}", urlencoding(a)),
                None => "/gates?limit=2".into(),
            };
            let (status, page) = f.get(Some(&f.read), &q).await;
            assert_eq!(status, 200, "{page}");
            for g in page["gates"].as_array().unwrap() {
                seen.push(g["gate_id"].as_str().unwrap().to_owned());
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen, opened, "oldest first, each once");
        // A cursor naming no gate is not found; one that is not a cursor at all is invalid.
        for (bad, status, code) in [
            (r#"["acme","nobody","gate/0"]"#, 404, "not_found"),
            ("acme/s/g", 400, "invalid"),
        ] {
            let (got, body) = f
                .get(Some(&f.read), &format!("/gates?after={}", urlencoding(bad)))
                .await;
            assert_eq!(
                (got, body["error"]["code"].clone()),
                (status, json!(code)),
                "{bad}"
            );
        }
        f.stop().await;
    }

    pub async fn only_the_operate_role_drains_and_the_report_comes_back(ts: &TestStore) {
        let f = Fixture::start(ts, "h-console-drain").await;
        let s = f.c.session().await;
        f.c.attach(&f.svc, &s).await;
        let (status, body) = f.post(Some(&f.read), "/drain", json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (403, json!("forbidden"))
        );
        assert!(!f.svc.draining());
        let (status, report) = f.post(Some(&f.operate), "/drain", json!({})).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["state"], "drained", "{report}");
        assert_eq!(report["requested_by"], "operator:alice", "{report}");
        assert_eq!(
            report["released"],
            json!([format!("acme/{}", s.session)]),
            "{report}"
        );
        assert!(f.svc.draining());
        let (_, hosts) = f.get(Some(&f.read), "/hosts").await;
        let me = hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["this"] == true)
            .cloned()
            .unwrap();
        assert_eq!(me["ready"], false, "{me}");
        assert_eq!(me["drain_requested_by"], "operator:alice", "{me}");
        let recorded = ts
            .store
            .drain_request(&f.svc.config().host_id, f.svc.generation())
            .await
            .unwrap()
            .expect("the drain request is recorded");
        assert_eq!(recorded.requested_by, "operator:alice");
        f.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    only_an_operator_credential_opens_the_console_and_a_tenant_token_gets_nothing,
    a_gate_answered_from_the_console_runs_its_tool_once_and_names_the_operator,
    a_session_view_shows_commands_gates_and_journal_and_no_runtime_private_id,
    sessions_page_with_a_cursor_and_a_bad_limit_is_a_stable_refusal,
    runs_page_newest_first_with_a_cursor_and_an_unknown_cursor_is_not_found,
    open_gates_page_oldest_first_and_a_cursor_may_name_ids_with_a_slash,
    only_the_operate_role_drains_and_the_report_comes_back,
);
