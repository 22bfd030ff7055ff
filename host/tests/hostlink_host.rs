//! The composed Host behind its one listener, over real sockets: the controller library end to
//! end, refusals that must not disclose another tenant's sessions, the probes around a drain,
//! `/metrics` checked by Prometheus's own `promtool` and the drain scope rules. (The official
//! JavaScript SDK's run against the real Host is a whole-system test: `tests/tests/sdk.rs`.)
//! Every case runs on SQLite and PostgreSQL.

mod cases {
    use std::time::Duration;

    use controller::client::{HostLinkClient, Publication};
    use controller::{Controller as Factory, ControllerError};
    use hostlink::records::{
        ActorId, AttachMode, AttachRequest, BindRequest, DrainRequest, DrainState, HostLinkError,
        IdempotencyKey, SessionScope, V1,
    };
    use serde_json::Value;
    use sessionstore::testing::TestStore;
    use sessionstore::wire::CommandBodyV1;
    use sessionstore::*;

    use testkit::*;

    async fn enduring_until(
        rx: &mut tokio::sync::mpsc::Receiver<Publication>,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let mut seen = Vec::new();
        tokio::time::timeout(WAIT, async {
            while let Some(p) = rx.recv().await {
                if let Publication::Enduring(e) = p {
                    let body: Value = serde_json::from_str(e.body().get()).unwrap();
                    let done = pred(&body);
                    seen.push(body);
                    if done {
                        return;
                    }
                }
            }
            panic!("the subscription ended");
        })
        .await
        .expect("the publications arrive");
        seen
    }

    pub async fn a_controller_creates_places_binds_delivers_and_streams_the_reply(ts: &TestStore) {
        let s = serve(ts, "link-e2e", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("s");
        create(&f, &session, None, "create-1").await;
        // Idempotent: the same create again returns what exists.
        create(&f, &session, None, "create-1").await;
        let placed = f.place(&session).await.unwrap();
        assert_eq!(placed.observation.residency, ResidencyState::Resident);
        assert!(placed.client.methods.starts_with(&[
            "hostlink.bind".to_owned(),
            "hostlink.unbind".into(),
            "hostlink.attach".into(),
            "hostlink.drain".into(),
            "hostlink.drain_status".into()
        ]));
        assert!(
            placed
                .client
                .methods
                .contains(&"hostlink.command.gate_response".to_owned())
        );
        let mut rx = f.bind_and_stream(&placed, true).await.unwrap();
        let cmd = f
            .admit(
                &session,
                CommandId::new("say-1").unwrap(),
                input("hello over the link"),
            )
            .await
            .unwrap();
        f.deliver(&placed, &cmd.command).await.unwrap();
        let seen = enduring_until(&mut rx, |b| b["type"] == "turn_done").await;
        let reply = seen
            .iter()
            .find(|b| b["type"] == "assistant_message")
            .unwrap();
        assert_eq!(reply["text"], "You said: hello over the link");
        let user = seen.iter().find(|b| b["type"] == "user_message").unwrap();
        assert_eq!(
            user["cause"]["command_id"], "say-1",
            "the public command id"
        );
        // The durable journal page holds the same bodies, byte for byte.
        let page = f.journal(&session, 0, None, 100).await.unwrap();
        let durable: Vec<Value> = page
            .events
            .iter()
            .map(|e| serde_json::from_slice(&e.body).unwrap())
            .collect();
        for body in &seen {
            assert!(
                durable.contains(body),
                "{body} missing from the durable page"
            );
        }
        // A permission gate, listed and answered through the controller.
        let ask = f
            .admit(
                &session,
                CommandId::new("tool-1").unwrap(),
                input("/tool launch_rocket {}"),
            )
            .await
            .unwrap();
        f.deliver(&placed, &ask.command).await.unwrap();
        let gate = eventually("a gate to be projected", async || {
            let gates = f.gates(&session).await.unwrap();
            gates.first().cloned().ok_or_else(|| "none".to_owned())
        })
        .await;
        let gate_id = uuid::Uuid::parse_str(gate.gate.as_str()).unwrap();
        let ans = f
            .answer(
                &session,
                CommandId::new("answer-1").unwrap(),
                gate_id,
                "approve",
                None,
            )
            .await
            .unwrap();
        f.deliver(&placed, &ans.command).await.unwrap();
        let done = f
            .wait_terminal(&session, &ans.command, WAIT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.outcome, Some(Outcome::Applied));
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_private_id_in_a_body_reaches_live_and_durable_readers_as_the_same_public_body(
        ts: &TestStore,
    ) {
        let s = serve(ts, "link-projection", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("projected");
        create(&f, &session, None, "create-projected").await;
        let placed = f.place(&session).await.unwrap();
        let mut rx = f.bind_and_stream(&placed, true).await.unwrap();
        let private = ts
            .store
            .session(&TenantId::new("acme").unwrap(), &session)
            .await
            .unwrap()
            .binding
            .runtime_session_id
            .to_string();
        // A body that mentions the binding's runtime session id.
        let cmd = f
            .admit(
                &session,
                CommandId::new("say-private").unwrap(),
                input(&format!("mine is {private}")),
            )
            .await
            .unwrap();
        f.deliver(&placed, &cmd.command).await.unwrap();
        let live = enduring_until(&mut rx, |b| b["type"] == "turn_done").await;
        let user = live.iter().find(|b| b["type"] == "user_message").unwrap();
        assert_eq!(user["text"], format!("mine is {session}"), "the public id");
        let page = f.journal(&session, 0, None, 100).await.unwrap();
        let durable: Vec<Value> = page
            .events
            .iter()
            .map(|e| serde_json::from_slice(&e.body).unwrap())
            .collect();
        for body in &live {
            assert!(!body.to_string().contains(&private), "{body}");
            assert!(
                durable.contains(body),
                "{body} differs from the durable page"
            );
        }
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn attach_without_a_runtime_build_is_accepted_and_a_wrong_one_is_refused(
        ts: &TestStore,
    ) {
        let s = serve(ts, "link-compat", |_| {}).await;
        let acme = factory(ts, &s, "acme");
        let session = sid("compat");
        create(&acme, &session, None, "c").await;
        let client = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "probe",
        )
        .await
        .unwrap();
        let attach = |build: Option<&str>| AttachRequest {
            version: V1,
            tenant_id: TenantId::new("acme").unwrap(),
            session_id: session.clone(),
            host_id: s.service.config().host_id.clone(),
            host_generation: std::num::NonZeroU64::new(s.service.generation()).unwrap(),
            agent_id: AgentId::new(AGENT).unwrap(),
            runtime_compatibility_id: build.map(|b| CompatibilityId::new(b).unwrap()),
            mode: AttachMode::Create,
            actor_id: ActorId::new("probe").unwrap(),
            trace_id: None,
            traceparent: None,
            tracestate: None,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        // Omitted: the Host's own build is used and reported.
        let placed = client.attach(&attach(None)).await.unwrap().unwrap();
        assert_eq!(placed.runtime_compatibility_id.as_str(), BUILD);
        assert_eq!(placed.residency, ResidencyState::Resident);
        // Present, it must match the resident session's.
        assert_eq!(
            client.attach(&attach(Some("another-build"))).await.unwrap(),
            Err(HostLinkError::RuntimeMismatch {
                runtime_compatibility_id: CompatibilityId::new(BUILD).unwrap()
            })
        );
        let again = client.attach(&attach(Some(BUILD))).await.unwrap().unwrap();
        assert_eq!(again.lease_epoch, placed.lease_epoch);
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_foreign_tenant_cannot_tell_whether_a_session_exists(ts: &TestStore) {
        let s = serve(ts, "link-foreign", |_| {}).await;
        let acme = factory(ts, &s, "acme");
        let session = sid("secret");
        create(&acme, &session, None, "c").await;
        let placed = acme.place(&session).await.unwrap();
        let globex = HostLinkClient::connect(
            &s.base,
            &TenantId::new("globex").unwrap(),
            &s.token("globex"),
            "probe",
        )
        .await
        .unwrap();
        let attach = |session: &SessionId| AttachRequest {
            version: V1,
            tenant_id: TenantId::new("globex").unwrap(),
            session_id: session.clone(),
            host_id: placed.observation.host_id.clone(),
            host_generation: placed.observation.host_generation,
            agent_id: AgentId::new(AGENT).unwrap(),
            runtime_compatibility_id: Some(CompatibilityId::new(BUILD).unwrap()),
            mode: AttachMode::Create,
            actor_id: ActorId::new("probe").unwrap(),
            trace_id: None,
            traceparent: None,
            tracestate: None,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        let existing = globex.attach(&attach(&session)).await.unwrap();
        let missing = globex.attach(&attach(&sid("nothing"))).await.unwrap();
        assert_eq!(
            existing.clone().unwrap_err(),
            HostLinkError::RuntimeUnavailable
        );
        assert_eq!(existing, missing, "identical refusals");
        let bind = |session: &SessionId| BindRequest {
            version: V1,
            tenant_id: TenantId::new("globex").unwrap(),
            session_id: session.clone(),
            host_id: placed.observation.host_id.clone(),
            host_generation: placed.observation.host_generation,
            lease_epoch: placed.observation.lease_epoch,
            runtime_compatibility_id: CompatibilityId::new(BUILD).unwrap(),
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        let b1 = globex.bind(&bind(&session)).await.unwrap();
        let b2 = globex.bind(&bind(&sid("nothing"))).await.unwrap();
        assert_eq!(b1, Err(HostLinkError::RuntimeUnavailable));
        assert_eq!(b1, b2);
        // A subscribe without a bind is refused with 103.
        let err = globex.subscribe(&session, false).await.unwrap_err();
        assert!(
            matches!(
                err,
                controller::client::ClientError::Reply { code: 103, .. }
            ),
            "{err}"
        );
        // A bad token is refused with 4500.
        let bad =
            HostLinkClient::connect(&s.base, &TenantId::new("acme").unwrap(), "wrong", "probe")
                .await
                .unwrap_err();
        assert!(
            matches!(
                bad,
                controller::client::ClientError::Disconnected { code: 4500, .. }
            ),
            "{bad}"
        );
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn readyz_turns_503_when_a_drain_starts_and_healthz_stays_200_until_stop(
        ts: &TestStore,
    ) {
        let s = serve(ts, "link-probes", |o| {
            o.idle_boundary = Duration::from_secs(3)
        })
        .await;
        assert_eq!(get(&s.http("/readyz")).await.0, 200);
        assert_eq!(get(&s.http("/healthz")).await.0, 200);
        // A session parked at a gate keeps the drain busy for the idle boundary.
        let f = factory(ts, &s, "acme");
        let session = sid("gated");
        create(&f, &session, Some("/tool launch_rocket {}".into()), "c").await;
        f.place(&session).await.unwrap();
        eventually("a gate to open", async || {
            let gates = f.gates(&session).await.unwrap();
            check(!gates.is_empty(), || "none".into())
        })
        .await;
        s.server.shutdown();
        eventually("readyz to turn 503", async || {
            let (code, _) = get(&s.http("/readyz")).await;
            check(code == 503, || code.to_string())
        })
        .await;
        assert_eq!(
            get(&s.http("/healthz")).await.0,
            200,
            "healthz stays true while draining"
        );
        assert!(s.service.draining());
        let report = s.server.wait().await;
        assert_eq!(report.abandoned.len(), 1, "{report:?}");
        assert!(!s.service.live(), "healthz is false once stop completed");
    }

    /// A first message whose reply streams for minutes (the scripted model's `/slow`).
    fn slow_turn() -> String {
        format!("/slow 50 {}", vec!["w"; 4000].join(" "))
    }

    /// Waits until the session's turn has begun (its public journal holds the user message
    /// the turn answers).
    async fn turn_running(f: &Factory, session: &SessionId) {
        eventually("the turn to begin", async || {
            let page = f.journal(session, 0, None, 100).await.unwrap();
            let started = page
                .events
                .iter()
                .any(|e| String::from_utf8_lossy(&e.body).contains("\"user_message\""));
            check(started, || {
                format!(
                    "{:?}",
                    page.events
                        .iter()
                        .map(|e| String::from_utf8_lossy(&e.body)
                            .chars()
                            .take(120)
                            .collect::<String>())
                        .collect::<Vec<_>>()
                )
            })
        })
        .await;
    }

    /// From the instant a drain begins the Host admits nothing: a new link is refused 503
    /// before its upgrade, an attach on an open link answers `not_admitting` (never
    /// `accepting: true`, not even for a session still resident), and a bind is refused.
    pub async fn a_draining_host_refuses_new_links_attaches_and_binds(ts: &TestStore) {
        let s = serve(ts, "link-drain-admits", |o| {
            o.idle_boundary = Duration::from_secs(3)
        })
        .await;
        let f = factory(ts, &s, "acme");
        // A turn still running keeps the drain busy for the idle boundary (a session parked
        // at a gate would be given up at once).
        let session = sid("busy");
        create(&f, &session, Some(slow_turn()), "c").await;
        let placed = f.place(&session).await.unwrap();
        turn_running(&f, &session).await;
        let o = &placed.observation;
        let attach = AttachRequest {
            version: V1,
            tenant_id: TenantId::new("acme").unwrap(),
            session_id: session.clone(),
            host_id: o.host_id.clone(),
            host_generation: o.host_generation,
            agent_id: o.agent_id.clone(),
            runtime_compatibility_id: Some(o.runtime_compatibility_id.clone()),
            mode: AttachMode::Restore,
            actor_id: ActorId::new("probe").unwrap(),
            trace_id: None,
            traceparent: None,
            tracestate: None,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        let bind = BindRequest {
            version: V1,
            tenant_id: TenantId::new("acme").unwrap(),
            session_id: session.clone(),
            host_id: o.host_id.clone(),
            host_generation: o.host_generation,
            lease_epoch: o.lease_epoch,
            runtime_compatibility_id: o.runtime_compatibility_id.clone(),
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        // Before the drain: a re-attach of the resident session reports it accepting.
        let before = placed.client.attach(&attach).await.unwrap().unwrap();
        assert!(before.accepting);

        s.server.shutdown();
        eventually("the drain to begin", async || {
            check(s.service.draining(), || "not yet".into())
        })
        .await;
        assert_eq!(get(&s.http("/readyz")).await.0, 503);
        let refused = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "late",
        )
        .await;
        match refused {
            Err(controller::client::ClientError::Connect(why)) => {
                assert!(why.contains("503"), "{why}")
            }
            Err(other) => panic!("refused otherwise: {other}"),
            Ok(_) => panic!("a new link was accepted during the drain"),
        }
        assert_eq!(
            placed.client.attach(&attach).await.unwrap(),
            Err(HostLinkError::NotAdmitting)
        );
        assert_eq!(
            placed.client.bind(&bind).await.unwrap(),
            Err(HostLinkError::NotAdmitting)
        );
        let report = s.server.wait().await;
        assert_eq!(report.abandoned.len(), 1, "{report:?}");
    }

    /// `/readyz` says why it is not ready: a line of text, or JSON on `Accept:
    /// application/json`; `/healthz` stays 200 through the drain.
    pub async fn readyz_gives_its_reasons_as_text_and_as_json(ts: &TestStore) {
        let s = serve(ts, "link-readyz-reasons", |o| {
            o.idle_boundary = Duration::from_secs(3)
        })
        .await;
        let json = [("Accept", "application/json")];
        assert_eq!(get(&s.http("/readyz")).await, (200, "ready\n".to_owned()));
        let (code, body) = get_with(&s.http("/readyz"), &json).await;
        assert_eq!(code, 200);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v, serde_json::json!({"ready": true, "reasons": []}));
        // A turn still running keeps the drain busy.
        let f = factory(ts, &s, "acme");
        let session = sid("busy");
        create(&f, &session, Some(slow_turn()), "c").await;
        f.place(&session).await.unwrap();
        turn_running(&f, &session).await;
        s.server.shutdown();
        let body = eventually("readyz to give the drain as its reason", async || {
            let (code, body) = get_with(&s.http("/readyz"), &json).await;
            check(code == 503, || format!("{code} {body}")).map(|_| body)
        })
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["ready"], false);
        assert_eq!(v["reasons"][0]["code"], "draining", "{v}");
        let (code, text) = get(&s.http("/readyz")).await;
        assert_eq!(code, 503);
        assert!(text.starts_with("not ready: draining ("), "{text}");
        assert_eq!(get(&s.http("/healthz")).await.0, 200);
        s.server.wait().await;
    }

    /// A second Host that takes this Host's id (a newer generation) fences it: `/readyz`
    /// answers 503 `fenced`, and the fence is announced for the process to exit on.
    pub async fn a_host_whose_id_a_newer_generation_took_is_fenced_and_not_ready(ts: &TestStore) {
        let s = serve(ts, "link-fenced", |o| {
            o.store_unreachable_bound = Duration::from_millis(400)
        })
        .await;
        let mut fences = s.service.fences();
        assert!(fences.borrow().is_none());
        assert_eq!(get(&s.http("/readyz")).await.0, 200);
        let mut second = options("link-fenced");
        second.store_unreachable_bound = Duration::from_millis(400);
        let (newer, _) = started(ts, second).await;
        assert_eq!(newer.generation(), s.service.generation() + 1);
        let fence = tokio::time::timeout(WAIT, fences.wait_for(|f| f.is_some()))
            .await
            .expect("the fence is announced")
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!(fence.newer_generation, newer.generation());
        let (code, body) = get_with(&s.http("/readyz"), &[("Accept", "application/json")]).await;
        assert_eq!(code, 503);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["reasons"][0]["code"], "fenced", "{v}");
        assert!(newer.ready(), "the newer generation is the one serving");
        s.server.shutdown();
        s.server.wait().await;
        newer.stop().await;
    }

    pub async fn stop_ends_within_the_grace_plus_two_idle_boundaries_when_a_link_never_closes(
        ts: &TestStore,
    ) {
        use futures::SinkExt;
        let grace = Duration::from_secs(1);
        let idle = Duration::from_secs(1);
        let s = serve(ts, "link-stop-bound", |o| {
            o.drain_grace = grace;
            o.idle_boundary = idle;
        })
        .await;
        // A link that connects and then never reads again: it never answers the close frame.
        let url = controller::client::hostlink_url(&s.base, &TenantId::new("acme").unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        let connect = serde_json::json!({
            "id": 1,
            "connect": {"token": s.token("acme"), "data": {"supported_versions": [1]}, "name": "mute"}
        });
        ws.send(tokio_tungstenite::tungstenite::Message::Text(
            connect.to_string().into(),
        ))
        .await
        .unwrap();
        eventually("the link to be counted", async || {
            let n = s.server.links().live_links();
            check(n == 1, || n.to_string())
        })
        .await;
        let began = tokio::time::Instant::now();
        s.server.shutdown();
        let report = s.server.wait().await;
        let took = began.elapsed();
        assert!(
            took < grace + idle * 2,
            "the stop took {took:?}, beyond grace + 2 x idle boundary"
        );
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.step == host::drain_steps::CLOSE_LINK),
            "{report:?}"
        );
        assert!(!s.service.live());
        drop(ws);
    }

    /// The stop's tail after the drain is bounded: a store whose close overruns it (held by
    /// the `close_store` failpoint) and a link that never answers the close frame do not hold
    /// the stop up; each is a failed step on the report the stop returns, `close_store` and
    /// `close_link`, with no session named.
    pub async fn a_store_close_and_a_link_that_overrun_the_stop_are_failures_on_its_report(
        ts: &TestStore,
    ) {
        use futures::SinkExt;
        use host::failpoints::{self, Action};
        let host_id = "link-slow-close";
        let grace = Duration::from_secs(1);
        let idle = Duration::from_secs(1);
        let s = serve(ts, host_id, |o| {
            o.drain_grace = grace;
            o.idle_boundary = idle;
        })
        .await;
        let url = controller::client::hostlink_url(&s.base, &TenantId::new("acme").unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        let connect = serde_json::json!({
            "id": 1,
            "connect": {"token": s.token("acme"), "data": {"supported_versions": [1]}, "name": "mute"}
        });
        ws.send(tokio_tungstenite::tungstenite::Message::Text(
            connect.to_string().into(),
        ))
        .await
        .unwrap();
        eventually("the link to be counted", async || {
            let n = s.server.links().live_links();
            check(n == 1, || n.to_string())
        })
        .await;
        let close = format!("{host_id}:{}", failpoints::steps::CLOSE_STORE);
        // Far beyond the whole stop tail (half an idle boundary).
        failpoints::arm(&close, Action::Delay(Duration::from_secs(30)));
        let began = tokio::time::Instant::now();
        s.server.shutdown();
        let report = s.server.wait().await;
        let took = began.elapsed();
        assert_eq!(
            failpoints::hits(&close),
            1,
            "the stop reached the store's close"
        );
        assert!(
            took < grace + idle * 2,
            "the stop took {took:?}, beyond grace + 2 x idle boundary"
        );
        let whole_host: Vec<_> = report
            .failures
            .iter()
            .filter(|f| f.session.is_none())
            .map(|f| f.step)
            .collect();
        assert!(
            whole_host.contains(&host::drain_steps::CLOSE_STORE),
            "{report:?}"
        );
        assert!(
            whole_host.contains(&host::drain_steps::CLOSE_LINK),
            "{report:?}"
        );
        assert!(!report.is_clean(), "{report:?}");
        assert!(!s.service.live(), "/healthz turns false when the stop ends");
        drop(ws);
    }

    pub async fn metrics_pass_promtools_own_check(ts: &TestStore) {
        let s = serve(ts, "link-metrics", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("m");
        create(&f, &session, Some("hi".into()), "c").await;
        f.place(&session).await.unwrap();
        f.wait_terminal(&session, &CommandId::new("c").unwrap(), WAIT)
            .await
            .unwrap()
            .unwrap();
        let (status, body) = get(&s.http("/metrics")).await;
        assert_eq!(status, 200);
        assert!(
            body.contains("host_sessions{state=\"resident\"} 1"),
            "{body}"
        );
        let mut child = tokio::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect(
                "promtool is required (.ci/run installs it; on Debian: apt-get install prometheus)",
            );
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(body.as_bytes()).await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_pooled_host_answers_no_hostlink_drain(ts: &TestStore) {
        let s = serve(ts, "link-pooled-drain", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("p");
        create(&f, &session, None, "c").await;
        let placed = f.place(&session).await.unwrap();
        let req = DrainRequest {
            host_id: placed.observation.host_id.clone(),
            host_generation: placed.observation.host_generation,
            idempotency_key: IdempotencyKey::new("d1").unwrap(),
            scope: Some(SessionScope {
                tenant_id: TenantId::new("acme").unwrap(),
                session_id: session.clone(),
            }),
        };
        assert_eq!(
            placed.client.drain(&req).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        let unscoped = DrainRequest { scope: None, ..req };
        assert_eq!(
            placed.client.drain(&unscoped).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        assert!(s.service.ready(), "no drain began");
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_fixed_session_drains_for_its_holder_who_is_recorded_and_a_reconnected_beginner_reads_drained(
        ts: &TestStore,
    ) {
        let session = sid("fixed");
        let fixed = session.clone();
        let s = serve(ts, "link-dedicated", move |o| {
            o.placement = Placement::Dedicated;
            o.capacity = 1;
            o.fixed_session = Some(fixed);
        })
        .await;
        let acme = factory(ts, &s, "acme");
        create(&acme, &session, None, "c").await;
        let placed = acme.place(&session).await.unwrap();
        let req = |tenant: &str| DrainRequest {
            host_id: placed.observation.host_id.clone(),
            host_generation: placed.observation.host_generation,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
            scope: Some(SessionScope {
                tenant_id: TenantId::new(tenant).unwrap(),
                session_id: session.clone(),
            }),
        };
        // Another tenant: refused exactly like "nothing attached yet".
        let globex = HostLinkClient::connect(
            &s.base,
            &TenantId::new("globex").unwrap(),
            &s.token("globex"),
            "probe",
        )
        .await
        .unwrap();
        assert_eq!(
            globex.drain(&req("globex")).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        assert_eq!(
            globex.drain_status(&req("globex")).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        // Nothing begun yet: drain_status is runtime_unavailable for the holder too.
        assert_eq!(
            placed.client.drain_status(&req("acme")).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        // The holder drains.
        let began = placed.client.drain(&req("acme")).await.unwrap().unwrap();
        assert_eq!(began.state, DrainState::Draining);
        // The caller that began it may observe it even after the session was released.
        eventually("the drain to finish", async || {
            let o = placed
                .client
                .drain_status(&req("acme"))
                .await
                .unwrap()
                .unwrap();
            check(o.state == DrainState::Drained, || format!("{o:?}"))
        })
        .await;
        assert!(s.service.residents().is_empty());
        // Who asked is recorded: the link's actor (an opaque token acts as its tenant).
        let asked = ts
            .store
            .drain_request(&s.service.config().host_id, s.service.generation())
            .await
            .unwrap()
            .expect("the drain request is recorded");
        assert_eq!(asked.requested_by, "tenant:acme");
        // The mutator stays attributed to a holder: after the release, even the link that
        // began the drain is refused.
        assert_eq!(
            placed.client.drain(&req("acme")).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        // A controller that reconnects (another link of the tenant the drain was begun with)
        // reads the terminal answer it needs before deleting the workload.
        let reconnected = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "reconnected",
        )
        .await
        .unwrap();
        let o = reconnected
            .drain_status(&req("acme"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(o.state, DrainState::Drained);
        assert_eq!(o.drain_generation, began.drain_generation);
        // A tenant that never held the fixed session began nothing and learns nothing.
        assert_eq!(
            globex.drain_status(&req("globex")).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        s.server.shutdown();
        s.server.wait().await;
    }

    /// A HostLink drain of a dedicated Host's fixed session takes the one drain path, abandon
    /// included: a session parked at a gate is abandoned at once (well inside an idle boundary
    /// of 20 s), which is no failure and does not withhold `drained`; the gate stays open and
    /// the next Host restores the session and applies its answer.
    pub async fn a_hostlink_drain_abandons_a_fixed_session_parked_at_a_gate_for_the_next_host(
        ts: &TestStore,
    ) {
        let session = sid("fixed-gated");
        let dedicated = |session: SessionId| {
            move |o: &mut host::Options| {
                o.placement = Placement::Dedicated;
                o.capacity = 1;
                o.fixed_session = Some(session);
                o.idle_boundary = Duration::from_secs(20);
                o.drain_grace = Duration::from_secs(30);
            }
        };
        let s = serve(ts, "link-dedicated-gated", dedicated(session.clone())).await;
        let acme = factory(ts, &s, "acme");
        create(&acme, &session, None, "c").await;
        let placed = acme.place(&session).await.unwrap();
        let _stream = acme.bind_and_stream(&placed, false).await.unwrap();
        let ask = acme
            .admit(
                &session,
                CommandId::new("tool-1").unwrap(),
                input("/tool launch_rocket {}"),
            )
            .await
            .unwrap();
        acme.deliver(&placed, &ask.command).await.unwrap();
        let gate = eventually("a gate to be projected", async || {
            let gates = acme.gates(&session).await.unwrap();
            gates.first().cloned().ok_or_else(|| "none".to_owned())
        })
        .await;
        let req = DrainRequest {
            host_id: placed.observation.host_id.clone(),
            host_generation: placed.observation.host_generation,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
            scope: Some(SessionScope {
                tenant_id: TenantId::new("acme").unwrap(),
                session_id: session.clone(),
            }),
        };
        let began = tokio::time::Instant::now();
        placed.client.drain(&req).await.unwrap().unwrap();
        eventually("the drain to finish", async || {
            let o = placed.client.drain_status(&req).await.unwrap().unwrap();
            check(o.state == DrainState::Drained, || format!("{o:?}"))
        })
        .await;
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the drain waited {:?} on a gated session",
            began.elapsed()
        );
        assert!(s.service.residents().is_empty());
        s.server.shutdown();
        let report = s.server.wait().await;
        let key = host::SessionKey {
            tenant: TenantId::new("acme").unwrap(),
            session: session.clone(),
        };
        assert_eq!(report.abandoned, [key], "{report:?}");
        assert!(report.is_clean(), "{report:?}");
        let open = acme.gates(&session).await.unwrap();
        assert_eq!(open.len(), 1, "the gate stays open: {open:?}");
        let next = serve(ts, "link-dedicated-gated-next", dedicated(session.clone())).await;
        let acme = factory(ts, &next, "acme");
        let placed = acme.place(&session).await.unwrap();
        let _stream = acme.bind_and_stream(&placed, false).await.unwrap();
        let gate_id = uuid::Uuid::parse_str(gate.gate.as_str()).unwrap();
        let ans = acme
            .answer(
                &session,
                CommandId::new("answer-1").unwrap(),
                gate_id,
                "approve",
                None,
            )
            .await
            .unwrap();
        acme.deliver(&placed, &ans.command).await.unwrap();
        let done = acme
            .wait_terminal(&session, &ans.command, WAIT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.outcome, Some(Outcome::Applied));
        next.server.shutdown();
        next.server.wait().await;
    }

    /// The Host's connect reply lists the five reserved methods first, then every capability
    /// token it serves: gate responses, the principal crossing with each command, and bodies
    /// stored by reference.
    pub async fn the_host_advertises_its_capability_tokens_after_the_reserved_methods(
        ts: &TestStore,
    ) {
        let s = serve(ts, "link-tokens", |_| {}).await;
        let client = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "probe",
        )
        .await
        .unwrap();
        let methods = &client.methods;
        assert_eq!(
            methods.get(..5),
            Some(
                &[
                    "hostlink.bind".to_owned(),
                    "hostlink.unbind".into(),
                    "hostlink.attach".into(),
                    "hostlink.drain".into(),
                    "hostlink.drain_status".into(),
                ][..]
            ),
            "{methods:?}"
        );
        for token in [
            "hostlink.command.gate_response",
            "hostlink.attribution.principal",
            "hostlink.payload.reference",
        ] {
            assert!(
                methods[5..].iter().any(|m| m == token),
                "{token} is not advertised after the reserved methods: {methods:?}"
            );
        }
        s.server.shutdown();
        s.server.wait().await;
    }

    /// The registry observation an attach answers names the Host by the bare base endpoint it
    /// was configured with: no tenant path, nothing added.
    pub async fn the_attach_reply_advertises_the_bare_base_endpoint_unchanged(ts: &TestStore) {
        let s = serve(ts, "link-endpoint", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("where");
        create(&f, &session, None, "c").await;
        let placed = f.place(&session).await.unwrap();
        assert_eq!(placed.observation.internal_endpoint, s.base);
        s.server.shutdown();
        s.server.wait().await;
    }

    /// An attach naming another incarnation of this Host (an older or newer generation, or
    /// another host id) is refused `not_admitting` before any lease is taken.
    pub async fn an_attach_naming_another_host_or_generation_is_refused_before_any_lease(
        ts: &TestStore,
    ) {
        let s = serve(ts, "link-generation", |_| {}).await;
        let acme = factory(ts, &s, "acme");
        let session = sid("elsewhere");
        create(&acme, &session, None, "c").await;
        let client = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "probe",
        )
        .await
        .unwrap();
        let attach = |host: HostId, generation: u64| AttachRequest {
            version: V1,
            tenant_id: TenantId::new("acme").unwrap(),
            session_id: session.clone(),
            host_id: host,
            host_generation: std::num::NonZeroU64::new(generation).unwrap(),
            agent_id: AgentId::new(AGENT).unwrap(),
            runtime_compatibility_id: None,
            mode: AttachMode::Create,
            actor_id: ActorId::new("probe").unwrap(),
            trace_id: None,
            traceparent: None,
            tracestate: None,
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
        };
        let this = s.service.config().host_id.clone();
        let generation = s.service.generation();
        for (host, generation) in [
            (this.clone(), generation + 1),
            (HostId::new("another-host").unwrap(), generation),
        ] {
            assert_eq!(
                client.attach(&attach(host, generation)).await.unwrap(),
                Err(HostLinkError::NotAdmitting)
            );
        }
        assert!(s.service.residents().is_empty());
        assert!(
            ts.store
                .residency(&TenantId::new("acme").unwrap(), &session)
                .await
                .unwrap()
                .is_none(),
            "a refused attach took a lease"
        );
        // The same request naming this incarnation is served.
        assert!(
            client
                .attach(&attach(this, generation))
                .await
                .unwrap()
                .is_ok()
        );
        s.server.shutdown();
        s.server.wait().await;
    }

    /// A dedicated Host answers no drain before its first attach (`runtime_unavailable`, and
    /// nothing begins); once its holder has drained it over HostLink it stays up: not ready,
    /// still live.
    pub async fn a_dedicated_host_refuses_a_drain_before_its_first_attach_and_stays_live_once_link_drained(
        ts: &TestStore,
    ) {
        let session = sid("fixed-early");
        let fixed = session.clone();
        let s = serve(ts, "link-dedicated-early", move |o| {
            o.placement = Placement::Dedicated;
            o.capacity = 1;
            o.fixed_session = Some(fixed);
        })
        .await;
        let acme = factory(ts, &s, "acme");
        create(&acme, &session, None, "c").await;
        let req = || DrainRequest {
            host_id: s.service.config().host_id.clone(),
            host_generation: std::num::NonZeroU64::new(s.service.generation()).unwrap(),
            idempotency_key: IdempotencyKey::new(uuid::Uuid::now_v7().to_string()).unwrap(),
            scope: Some(SessionScope {
                tenant_id: TenantId::new("acme").unwrap(),
                session_id: session.clone(),
            }),
        };
        let early = HostLinkClient::connect(
            &s.base,
            &TenantId::new("acme").unwrap(),
            &s.token("acme"),
            "early",
        )
        .await
        .unwrap();
        assert_eq!(
            early.drain(&req()).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        assert_eq!(
            early.drain_status(&req()).await.unwrap(),
            Err(HostLinkError::RuntimeUnavailable)
        );
        assert!(s.service.ready(), "a refused drain began nothing");
        let placed = acme.place(&session).await.unwrap();
        placed.client.drain(&req()).await.unwrap().unwrap();
        eventually("the link drain to finish", async || {
            let o = placed.client.drain_status(&req()).await.unwrap().unwrap();
            check(o.state == DrainState::Drained, || format!("{o:?}"))
        })
        .await;
        assert_eq!(get(&s.http("/readyz")).await.0, 503);
        assert_eq!(get(&s.http("/healthz")).await.0, 200);
        assert!(!s.service.ready());
        assert!(s.service.live());
        s.server.shutdown();
        s.server.wait().await;
    }

    /// `/metrics` carries the Host's own families and nothing else: no process or runtime
    /// collector, no controller backlog or drain series.
    pub async fn metrics_carry_only_the_hosts_own_families(ts: &TestStore) {
        let s = serve(ts, "link-families", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("families");
        create(&f, &session, Some("hi".into()), "c").await;
        f.place(&session).await.unwrap();
        f.wait_terminal(&session, &CommandId::new("c").unwrap(), WAIT)
            .await
            .unwrap()
            .unwrap();
        let (status, body) = get(&s.http("/metrics")).await;
        assert_eq!(status, 200);
        let own = [
            "host_sessions",
            "host_sessions_gate_waiting",
            "host_sessions_command_blocked",
            "host_admission_weight_consumed",
            "host_admission_weight_capacity",
            "host_command_lag",
            "host_command_queue_depth",
            "host_release_failures_total",
            "host_attach_seconds",
            "host_command_apply_seconds",
            "host_connections_cut_total",
            "host_memory_budget_bytes",
            "host_store_statements_total",
            "host_store_transactions_total",
            "host_store_writes_total",
            "host_link_credential_refusals_total",
            "host_ready",
            "host_not_ready",
        ];
        let families: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(families.contains(&"host_sessions"), "{body}");
        // What the Host costs its database is exported, and a Host that has started has
        // already sent its store statements.
        let statements: u64 = body
            .lines()
            .find_map(|l| l.strip_prefix("host_store_statements_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(statements > 0, "{body}");
        let foreign: Vec<&&str> = families.iter().filter(|f| !own.contains(f)).collect();
        assert!(
            foreign.is_empty(),
            "families that are not the Host's own: {foreign:?}"
        );
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn placement_with_no_live_host_is_a_clear_refusal(ts: &TestStore) {
        let f = Factory::new(ts.store.clone(), TenantId::new("acme").unwrap(), "t");
        let session = sid("nowhere");
        create(&f, &session, None, "c").await;
        assert!(matches!(
            f.place(&session).await,
            Err(ControllerError::NoHost(_))
        ));
        let _ = CommandBodyV1::Interrupt;
    }
}

sessionstore::both_backends!(cases =>
    a_controller_creates_places_binds_delivers_and_streams_the_reply,
    a_private_id_in_a_body_reaches_live_and_durable_readers_as_the_same_public_body,
    a_foreign_tenant_cannot_tell_whether_a_session_exists,
    attach_without_a_runtime_build_is_accepted_and_a_wrong_one_is_refused,
    readyz_turns_503_when_a_drain_starts_and_healthz_stays_200_until_stop,
    a_draining_host_refuses_new_links_attaches_and_binds,
    readyz_gives_its_reasons_as_text_and_as_json,
    a_host_whose_id_a_newer_generation_took_is_fenced_and_not_ready,
    metrics_pass_promtools_own_check,
    stop_ends_within_the_grace_plus_two_idle_boundaries_when_a_link_never_closes,
    a_store_close_and_a_link_that_overrun_the_stop_are_failures_on_its_report,
    a_pooled_host_answers_no_hostlink_drain,
    a_fixed_session_drains_for_its_holder_who_is_recorded_and_a_reconnected_beginner_reads_drained,
    a_hostlink_drain_abandons_a_fixed_session_parked_at_a_gate_for_the_next_host,
    placement_with_no_live_host_is_a_clear_refusal,
    the_host_advertises_its_capability_tokens_after_the_reserved_methods,
    the_attach_reply_advertises_the_bare_base_endpoint_unchanged,
    an_attach_naming_another_host_or_generation_is_refused_before_any_lease,
    a_dedicated_host_refuses_a_drain_before_its_first_attach_and_stays_live_once_link_drained,
    metrics_carry_only_the_hosts_own_families,
);
