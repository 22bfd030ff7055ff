//! The official JavaScript Centrifuge SDK (`tests/sdk/hostlink_resume.mjs`, an application
//! whose subscription carries its bind and does nothing on a reconnect) resumes a session's
//! stream by itself: its TCP connection is cut under a stream of turns, and the session is
//! drained to a second Host under it; each time the SDK reconnects, resubscribes from its last
//! offset and the application sees every committed public record exactly once, in order, with
//! no gap. The connection runs through a TCP proxy the test cuts and retargets. Runs on SQLite
//! and PostgreSQL.

mod cases {
    use std::net::SocketAddr;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use controller::{Controller as Factory, Placed};
    use hostlink::channel::session_channel;
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::AbortHandle;

    /// A TCP proxy whose connections the test can cut (both sockets dropped, no WebSocket
    /// close: what a network failure looks like) and whose target it can move.
    struct Proxy {
        addr: SocketAddr,
        target: Arc<Mutex<SocketAddr>>,
        connections: Arc<Mutex<Vec<AbortHandle>>>,
        accept: AbortHandle,
    }

    impl Proxy {
        async fn start(target: SocketAddr) -> Proxy {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let target = Arc::new(Mutex::new(target));
            let connections = Arc::new(Mutex::new(Vec::<AbortHandle>::new()));
            let (to, conns) = (target.clone(), connections.clone());
            let accept = tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = *to.lock().unwrap();
                    let relay = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(to).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    conns.lock().unwrap().push(relay.abort_handle());
                }
            })
            .abort_handle();
            Proxy {
                addr,
                target,
                connections,
                accept,
            }
        }

        fn cut(&self) {
            for c in self.connections.lock().unwrap().drain(..) {
                c.abort();
            }
        }

        /// How many connections were made since the last cut.
        fn live(&self) -> usize {
            self.connections.lock().unwrap().len()
        }

        fn retarget(&self, to: SocketAddr) {
            *self.target.lock().unwrap() = to;
        }
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.accept.abort();
            self.cut();
        }
    }

    fn sdk_dir() -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
        assert!(
            dir.join("node_modules/centrifuge").is_dir(),
            "the SDK is not installed: run `npm ci` in tests/sdk (.ci/run does)"
        );
        dir
    }

    /// Writes the current bind request where the application's `getData` reads it (whole,
    /// by rename, so a read never sees half a file).
    fn write_bind(path: &Path, placed: &Placed) {
        let o = &placed.observation;
        let bind = json!({
            "version": 1,
            "tenant_id": o.tenant_id.as_str(),
            "session_id": o.session_id.as_str(),
            "host_id": o.host_id.as_str(),
            "host_generation": o.host_generation.get(),
            "lease_epoch": o.lease_epoch.get(),
            "runtime_compatibility_id": o.runtime_compatibility_id.as_str(),
            "idempotency_key": format!("sdk-bind-{}", uuid::Uuid::now_v7()),
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bind.to_string()).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    async fn target_of(ts: &TestStore, host: &Served) -> HostTarget {
        let id = host.service.config().host_id.clone();
        ts.store
            .targets(true)
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.host == id)
            .expect("the Host advertises itself")
    }

    async fn say(f: &Factory, session: &SessionId, text: &str) {
        f.admit(
            session,
            CommandId::new(format!("say-{text}")).unwrap(),
            input(text),
        )
        .await
        .unwrap();
    }

    /// The SDK application running against `url` until it has seen the reply `final_text`.
    fn spawn_app(
        url: String,
        token: String,
        channel: String,
        bind_file: &Path,
        final_text: &str,
    ) -> tokio::task::JoinHandle<std::io::Result<std::process::Output>> {
        let script = sdk_dir().join("hostlink_resume.mjs");
        let args = [
            url,
            token,
            channel,
            bind_file.display().to_string(),
            final_text.to_owned(),
        ];
        tokio::spawn(async move {
            tokio::process::Command::new("node")
                .arg(script)
                .args(args)
                .kill_on_drop(true)
                .output()
                .await
        })
    }

    async fn app_events(
        app: tokio::task::JoinHandle<std::io::Result<std::process::Output>>,
    ) -> Vec<Value> {
        let output = tokio::time::timeout(Duration::from_secs(120), app)
            .await
            .expect("the SDK application finished")
            .unwrap()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "the SDK application failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The application saw every committed public record after its first position exactly
    /// once, in order, up to the last one it saw: the journal's records at those offsets.
    async fn check_exactly_once_in_order(ts: &TestStore, session: &SessionId, events: &[Value]) {
        let first = events
            .iter()
            .find(|e| e["event"] == "subscribed")
            .expect("the application subscribed");
        let start = first["position"]["offset"].as_u64().unwrap();
        let seen: Vec<(u64, String)> = events
            .iter()
            .filter(|e| e["event"] == "publication")
            .map(|e| {
                (
                    e["offset"].as_u64().unwrap(),
                    e["event_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let last = seen.last().expect("publications").0;
        let tenant = TenantId::new("acme").unwrap();
        let rs = ts
            .store
            .session(&tenant, session)
            .await
            .unwrap()
            .binding
            .runtime_session_id;
        let journal = ts
            .store
            .journal_by_offset(&tenant, rs, start, (last - start) as usize)
            .await
            .unwrap();
        let expected: Vec<(u64, String)> = journal
            .events
            .iter()
            .map(|e| (e.offset, e.event.as_str().to_owned()))
            .collect();
        assert_eq!(expected.len() as u64, last - start);
        assert_eq!(seen, expected, "every committed record once, in order");
    }

    /// How many resubscribes recovered; every resubscribe that tried did.
    fn recovered_resubscribes(events: &[Value]) -> usize {
        let recovering: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "subscribed" && e["was_recovering"] == true)
            .collect();
        assert!(
            recovering.iter().all(|e| e["recovered"] == true),
            "a resubscribe within the window always recovers: {events:?}"
        );
        recovering.len()
    }

    pub async fn the_sdk_resumes_by_itself_after_its_connection_is_cut_under_a_stream_of_turns(
        ts: &TestStore,
    ) {
        let s = serve(ts, "sdk-cut", |_| {}).await;
        let f = factory(ts, &s, "acme");
        let session = sid("sdk-cut");
        create(&f, &session, None, "create").await;
        let placed = f.place(&session).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bind_file = dir.path().join("bind.json");
        write_bind(&bind_file, &placed);
        let proxy = Proxy::start(s.server.local_addr()).await;
        let channel = session_channel(&TenantId::new("acme").unwrap(), &session);
        let app = spawn_app(
            format!("ws://{}/hostlink/acme", proxy.addr),
            s.token("acme"),
            channel,
            &bind_file,
            "You said: turn 6",
        );
        // The application's subscribe made the bind (its own code never calls hostlink.bind).
        let acme = TenantId::new("acme").unwrap();
        wait_until("the SDK to bind", || {
            s.server.links().tenant_bindings(&acme) > 0
        })
        .await;
        // The SDK's link and the controller's placement link.
        let links = s.server.links().live_links();
        for i in 1..=6 {
            say(&f, &session, &format!("turn {i}")).await;
            if i % 2 == 1 {
                // Cut while this turn's records are being committed and pushed; the next turn
                // is admitted while the SDK is away.
                tokio::time::sleep(Duration::from_millis(10)).await;
                proxy.cut();
            } else {
                // A new connection, the old link gone, and the new one bound.
                wait_until("the SDK to reconnect", || {
                    proxy.live() > 0
                        && s.server.links().live_links() == links
                        && s.server.links().tenant_bindings(&acme) == 1
                })
                .await;
            }
        }
        let events = app_events(app).await;
        let reconnects = events.iter().filter(|e| e["event"] == "connected").count();
        assert!(
            reconnects >= 4,
            "the SDK reconnected after every cut: {events:?}"
        );
        // A cut may land between a link's bind and its subscribe reply: the resubscribe after
        // it has no newer position to recover from. Most cuts land on a subscribed link.
        assert!(
            recovered_resubscribes(&events) >= 1,
            "the SDK resubscribed from its last offset: {events:?}"
        );
        check_exactly_once_in_order(ts, &session, &events).await;
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn the_sdk_resumes_by_itself_across_a_drain_to_a_second_host(ts: &TestStore) {
        let a = serve(ts, "sdk-drain-a", |_| {}).await;
        let b = serve_with_tokens(
            ts,
            "sdk-drain-b",
            |_| {},
            hostlink_server::LinkOptions::default(),
            a.tokens.clone(),
        )
        .await;
        let f = factory(ts, &a, "acme");
        let session = sid("sdk-drain");
        create(&f, &session, None, "create").await;
        let record = ts
            .store
            .session(&TenantId::new("acme").unwrap(), &session)
            .await
            .unwrap();
        let on_a = f
            .attach_on(&record, &target_of(ts, &a).await)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bind_file = dir.path().join("bind.json");
        write_bind(&bind_file, &on_a);
        drop(on_a);
        let proxy = Proxy::start(a.server.local_addr()).await;
        let channel = session_channel(&TenantId::new("acme").unwrap(), &session);
        let app = spawn_app(
            format!("ws://{}/hostlink/acme", proxy.addr),
            a.token("acme"),
            channel,
            &bind_file,
            "You said: after 2",
        );
        let acme = TenantId::new("acme").unwrap();
        wait_until("the SDK to bind on the first Host", || {
            a.server.links().tenant_bindings(&acme) > 0
        })
        .await;
        say(&f, &session, "before 1").await;
        say(&f, &session, "before 2").await;
        // SIGTERM's drain of the first Host, under the stream: the session is released, the
        // SDK's subscription is asked to resubscribe, then the link closes with 3001.
        let Served {
            server: a_server, ..
        } = a;
        a_server.shutdown();
        let report = a_server.wait().await;
        assert!(report.is_clean(), "{report:?}");
        // The session is placed on the second Host; the application's registry (the bind
        // file) and the endpoint (the proxy) now name it.
        let on_b = f
            .attach_on(&record, &target_of(ts, &b).await)
            .await
            .unwrap();
        write_bind(&bind_file, &on_b);
        proxy.retarget(b.server.local_addr());
        wait_until("the SDK to bind on the second Host", || {
            b.server.links().tenant_bindings(&acme) > 0
        })
        .await;
        say(&f, &session, "after 1").await;
        say(&f, &session, "after 2").await;
        let events = app_events(app).await;
        assert!(
            events
                .iter()
                .any(|e| e["event"] == "disconnected" || e["event"] == "connecting"),
            "the SDK lost its first link: {events:?}"
        );
        assert!(
            recovered_resubscribes(&events) >= 1,
            "the resubscribe on the second Host recovered: {events:?}"
        );
        check_exactly_once_in_order(ts, &session, &events).await;
        b.server.shutdown();
        b.server.wait().await;
    }
}

sessionstore::both_backends!(cases =>
    the_sdk_resumes_by_itself_after_its_connection_is_cut_under_a_stream_of_turns,
    the_sdk_resumes_by_itself_across_a_drain_to_a_second_host,
);
