//! A session channel as a Centrifuge stream, over real sockets against the composed Host:
//! contiguous public offsets on every enduring push, the stream position in the subscribe
//! reply, recovery from the durable journal after a reconnect (no gap, no duplicate at the
//! seam; `recovered: false` past the window or in another epoch), `history` with limit, since
//! and reverse, and subscriptions that carry their bind. Every case runs on SQLite and
//! PostgreSQL. (The official JavaScript SDK's own reconnects are in `tests/tests/sdk_recovery.rs`.)

mod cases {
    use std::collections::VecDeque;

    use controller::{Controller as Factory, Placed};
    use futures::{SinkExt, StreamExt};
    use hostlink::channel::session_channel;
    use hostlink_server::LinkOptions;
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use testkit::*;
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

    /// A bare HostLink client: commands in, replies and pushes out, pings answered.
    struct Raw {
        ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
        lines: VecDeque<Value>,
        pushes: VecDeque<Value>,
        next_id: u64,
    }

    impl Raw {
        async fn connect(s: &Served, tenant: &str) -> Raw {
            let url = format!("{}/hostlink/{tenant}", s.base);
            let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            let mut c = Raw {
                ws,
                lines: VecDeque::new(),
                pushes: VecDeque::new(),
                next_id: 0,
            };
            let reply = c
                .call(
                    "connect",
                    json!({"token": s.token(tenant), "data": {"supported_versions": [1]}}),
                )
                .await;
            assert!(reply.get("connect").is_some(), "{reply}");
            c
        }

        async fn line(&mut self) -> Value {
            loop {
                if let Some(v) = self.lines.pop_front() {
                    return v;
                }
                let m = tokio::time::timeout(WAIT, self.ws.next())
                    .await
                    .expect("the Host said something in time");
                match m {
                    Some(Ok(Message::Text(t))) => {
                        for l in t.as_str().split('\n') {
                            if l == "{}" {
                                let _ = self.ws.send(Message::text("{}")).await;
                                continue;
                            }
                            self.lines.push_back(serde_json::from_str(l).unwrap());
                        }
                    }
                    Some(Ok(Message::Close(f))) => panic!("the link closed: {f:?}"),
                    Some(Ok(_)) => {}
                    other => panic!("the link ended: {other:?}"),
                }
            }
        }

        /// Sends `{"id":N,"<method>":body}` and returns its reply; pushes meanwhile are kept.
        async fn call(&mut self, method: &str, body: Value) -> Value {
            self.next_id += 1;
            let id = self.next_id;
            let mut command = serde_json::Map::new();
            command.insert("id".into(), json!(id));
            command.insert(method.into(), body);
            self.ws
                .send(Message::text(Value::Object(command).to_string()))
                .await
                .unwrap();
            loop {
                let v = self.line().await;
                if v["id"] == id {
                    return v;
                }
                assert!(v.get("push").is_some(), "{v}");
                self.pushes.push_back(v);
            }
        }

        /// The next enduring push (previews and other pushes skipped).
        async fn enduring(&mut self) -> Value {
            loop {
                let v = match self.pushes.pop_front() {
                    Some(v) => v,
                    None => self.line().await,
                };
                if v["push"]["pub"]["tags"]["record"] == "enduring_publication" {
                    return v["push"]["pub"].clone();
                }
            }
        }

        /// Enduring pushes up to and including the one whose body satisfies `until`.
        async fn enduring_until(&mut self, until: impl Fn(&Value) -> bool) -> Vec<Value> {
            let mut seen = Vec::new();
            loop {
                let p = self.enduring().await;
                let done = until(&p["data"]["body"]);
                seen.push(p);
                if done {
                    return seen;
                }
            }
        }
    }

    fn bind_data(placed: &Placed, lease_epoch: u64) -> Value {
        let o = &placed.observation;
        json!({
            "version": 1,
            "tenant_id": o.tenant_id.as_str(),
            "session_id": o.session_id.as_str(),
            "host_id": o.host_id.as_str(),
            "host_generation": o.host_generation.get(),
            "lease_epoch": lease_epoch,
            "runtime_compatibility_id": o.runtime_compatibility_id.as_str(),
            "idempotency_key": format!("bind-{}", uuid::Uuid::now_v7()),
        })
    }

    fn channel_of(placed: &Placed) -> String {
        session_channel(
            &placed.observation.tenant_id,
            &placed.observation.session_id,
        )
    }

    fn said(text: &str) -> impl Fn(&Value) -> bool {
        let want = format!("You said: {text}");
        move |b: &Value| b["type"] == "assistant_message" && b["text"] == want.as_str()
    }

    fn offsets(pubs: &[Value]) -> Vec<u64> {
        pubs.iter().map(|p| p["offset"].as_u64().unwrap()).collect()
    }

    fn contiguous(from: u64, n: usize) -> Vec<u64> {
        (from..from + n as u64).collect()
    }

    async fn placed_session(ts: &TestStore, s: &Served, name: &str) -> (Factory, Placed) {
        let f = factory(ts, s, "acme");
        let session = sid(name);
        create(&f, &session, None, "create").await;
        let placed = f.place(&session).await.unwrap();
        (f, placed)
    }

    async fn say(f: &Factory, placed: &Placed, text: &str) {
        f.admit(
            &placed.observation.session_id,
            CommandId::new(format!("say-{text}")).unwrap(),
            input(text),
        )
        .await
        .unwrap();
    }

    /// A bound and subscribed link; returns it with the subscribe reply.
    async fn subscribed(s: &Served, placed: &Placed, recover: Option<(u64, &str)>) -> (Raw, Value) {
        let mut c = Raw::connect(s, "acme").await;
        let bind = c
            .call(
                "rpc",
                json!({"method": "hostlink.bind", "data": bind_data(placed, placed.observation.lease_epoch.get())}),
            )
            .await;
        assert_eq!(bind["rpc"]["data"], json!({}), "{bind}");
        let mut sub = json!({"channel": channel_of(placed)});
        if let Some((offset, epoch)) = recover {
            sub["recover"] = json!(true);
            sub["offset"] = json!(offset);
            sub["epoch"] = json!(epoch);
        }
        let reply = c.call("subscribe", sub).await;
        assert!(reply.get("subscribe").is_some(), "{reply}");
        (c, reply["subscribe"].clone())
    }

    /// Waits until the durable journal holds the reply to `text`; returns its public top.
    async fn committed(ts: &TestStore, placed: &Placed, text: &str) -> u64 {
        let o = &placed.observation;
        let record = ts.store.session(&o.tenant_id, &o.session_id).await.unwrap();
        let rs = record.binding.runtime_session_id;
        let want = format!("You said: {text}");
        eventually("the reply to be journaled", async || {
            let page = ts
                .store
                .journal_by_offset(&o.tenant_id, rs, 0, 1000)
                .await
                .map_err(|e| e.to_string())?;
            let found = page
                .events
                .iter()
                .any(|e| String::from_utf8_lossy(&e.body).contains(&want));
            check(found, || format!("top {}", page.top))?;
            Ok(page.top)
        })
        .await
    }

    pub async fn every_enduring_push_carries_the_next_public_offset_counted_in_the_journal(
        ts: &TestStore,
    ) {
        let s = serve(ts, "stream-offsets", |_| {}).await;
        let (f, placed) = placed_session(ts, &s, "offsets").await;
        let (mut c, reply) = subscribed(&s, &placed, None).await;
        assert_eq!(reply["recoverable"], true);
        let epoch = reply["epoch"].as_str().unwrap().to_owned();
        assert_eq!(epoch.len(), 16);
        let start = reply["offset"].as_u64().unwrap();
        say(&f, &placed, "one").await;
        let mut pubs = c.enduring_until(said("one")).await;
        say(&f, &placed, "two").await;
        pubs.extend(c.enduring_until(said("two")).await);
        // Private records (applications, controls) sit between these: the offsets have no gap.
        assert_eq!(offsets(&pubs), contiguous(start + 1, pubs.len()));
        let seqs: Vec<u64> = pubs
            .iter()
            .map(|p| p["data"]["journal_seq"].as_u64().unwrap())
            .collect();
        assert!(
            seqs.windows(2).any(|w| w[1] > w[0] + 1),
            "the journal holds private records between public ones: {seqs:?}"
        );
        // The offsets are the journal's: the record at each offset is the one pushed with it.
        let o = &placed.observation;
        let rs = ts
            .store
            .session(&o.tenant_id, &o.session_id)
            .await
            .unwrap()
            .binding
            .runtime_session_id;
        let journal = ts
            .store
            .journal_by_offset(&o.tenant_id, rs, 0, 1000)
            .await
            .unwrap();
        for p in &pubs {
            let offset = p["offset"].as_u64().unwrap();
            let e = &journal.events[offset as usize - 1];
            assert_eq!(e.offset, offset);
            assert_eq!(p["data"]["event_id"], e.event.as_str());
        }
        // A second link's subscribe reply names the same epoch and the current top.
        let (_c2, reply2) = subscribed(&s, &placed, None).await;
        assert_eq!(reply2["epoch"], epoch.as_str());
        assert_eq!(reply2["offset"], journal.top);
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_resubscribe_from_its_last_offset_recovers_every_committed_record_once_then_streams(
        ts: &TestStore,
    ) {
        let s = serve(ts, "stream-recover", |_| {}).await;
        let (f, placed) = placed_session(ts, &s, "recover").await;
        let (mut c, reply) = subscribed(&s, &placed, None).await;
        let epoch = reply["epoch"].as_str().unwrap().to_owned();
        say(&f, &placed, "one").await;
        let before = c.enduring_until(said("one")).await;
        let last = *offsets(&before).last().unwrap();
        drop(c);
        // Committed while the client was away.
        say(&f, &placed, "two").await;
        let top = committed(ts, &placed, "two").await;
        assert!(top > last);
        let (mut c, reply) = subscribed(&s, &placed, Some((last, &epoch))).await;
        assert_eq!(reply["recovered"], true, "{reply}");
        assert_eq!(reply["was_recovering"], true);
        assert_eq!(reply["epoch"], epoch.as_str());
        assert_eq!(reply["offset"], top);
        let recovered = reply["publications"].as_array().unwrap().clone();
        assert_eq!(
            offsets(&recovered),
            contiguous(last + 1, (top - last) as usize)
        );
        assert!(recovered.iter().any(|p| said("two")(&p["data"]["body"])));
        assert!(
            recovered
                .iter()
                .all(|p| p["tags"]["record"] == "enduring_publication")
        );
        // Then the live stream, from the very next offset: no gap, no duplicate at the seam.
        say(&f, &placed, "three").await;
        let live = c.enduring_until(said("three")).await;
        assert_eq!(offsets(&live), contiguous(top + 1, live.len()));
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_client_past_the_recovery_window_or_in_another_epoch_is_told_to_reload(
        ts: &TestStore,
    ) {
        let link = LinkOptions {
            recovery_window: 2,
            ..LinkOptions::default()
        };
        let s = serve_with_link(ts, "stream-window", |_| {}, link).await;
        let (f, placed) = placed_session(ts, &s, "window").await;
        let (mut c, reply) = subscribed(&s, &placed, None).await;
        let epoch = reply["epoch"].as_str().unwrap().to_owned();
        say(&f, &placed, "one").await;
        let last = *offsets(&c.enduring_until(said("one")).await)
            .last()
            .unwrap();
        drop(c);
        say(&f, &placed, "two").await;
        let top = committed(ts, &placed, "two").await;
        assert!(top - last > 2, "more than the window behind");
        let (mut c, reply) = subscribed(&s, &placed, Some((last, &epoch))).await;
        assert_eq!(reply["recovered"], false, "{reply}");
        assert_eq!(reply["was_recovering"], true);
        assert_eq!(reply["offset"], top);
        assert!(reply.get("publications").is_none());
        // The live stream starts after the position the client reloads from.
        say(&f, &placed, "three").await;
        let live = c.enduring_until(said("three")).await;
        assert_eq!(offsets(&live), contiguous(top + 1, live.len()));
        drop(c);
        // Within the window but in another epoch: not recovered either.
        let top = committed(ts, &placed, "three").await;
        let (_c, reply) = subscribed(&s, &placed, Some((top - 1, "0000000000000000"))).await;
        assert_eq!(reply["recovered"], false, "{reply}");
        assert_eq!(reply["offset"], top);
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn history_serves_limit_since_and_reverse_from_the_journal_for_its_tenant_only(
        ts: &TestStore,
    ) {
        let link = LinkOptions {
            history_limit: 5,
            ..LinkOptions::default()
        };
        let s = serve_with_link(ts, "stream-history", |_| {}, link).await;
        let (f, placed) = placed_session(ts, &s, "history").await;
        say(&f, &placed, "one").await;
        say(&f, &placed, "two").await;
        let top = committed(ts, &placed, "two").await;
        assert!(top >= 6, "enough records to page: {top}");
        let ch = channel_of(&placed);
        // History needs no bind: the tenant reads its own session's journal.
        let mut c = Raw::connect(&s, "acme").await;
        let history = async |c: &mut Raw, body: Value| -> Value {
            let mut body = body;
            body["channel"] = json!(ch);
            c.call("history", body).await
        };
        let h = history(&mut c, json!({"limit": 3})).await["history"].clone();
        let epoch = h["epoch"].as_str().unwrap().to_owned();
        assert_eq!(h["offset"], top);
        let pubs = h["publications"].as_array().unwrap();
        assert_eq!(offsets(pubs), [1, 2, 3]);
        assert!(
            pubs.iter()
                .all(|p| p["data"]["session_id"] == placed.observation.session_id.as_str())
        );
        let h = history(
            &mut c,
            json!({"limit": 2, "since": {"offset": 2, "epoch": epoch}}),
        )
        .await;
        assert_eq!(
            offsets(h["history"]["publications"].as_array().unwrap()),
            [3, 4]
        );
        let h = history(&mut c, json!({"limit": 2, "reverse": true})).await;
        assert_eq!(
            offsets(h["history"]["publications"].as_array().unwrap()),
            [top, top - 1]
        );
        let h = history(
            &mut c,
            json!({"limit": 10, "reverse": true, "since": {"offset": 3, "epoch": epoch}}),
        )
        .await;
        assert_eq!(
            offsets(h["history"]["publications"].as_array().unwrap()),
            [2, 1]
        );
        // Unbounded asks are cut to the option; 0 asks for the position only.
        let h = history(&mut c, json!({"limit": -1})).await;
        assert_eq!(
            offsets(h["history"]["publications"].as_array().unwrap()),
            [1, 2, 3, 4, 5]
        );
        let h = history(&mut c, json!({})).await;
        assert_eq!(h["history"]["publications"], json!([]));
        assert_eq!(h["history"]["offset"], top);
        // A position in another epoch, or beyond the stream: 112.
        let h = history(
            &mut c,
            json!({"limit": 1, "since": {"offset": 1, "epoch": "x"}}),
        )
        .await;
        assert_eq!(h["error"]["code"], 112, "{h}");
        let h = history(
            &mut c,
            json!({"limit": 1, "since": {"offset": top + 1, "epoch": epoch}}),
        )
        .await;
        assert_eq!(h["error"]["code"], 112, "{h}");
        // An unknown session and another tenant's are refused alike.
        let unknown = session_channel(&TenantId::new("acme").unwrap(), &sid("nobody"));
        let h = c
            .call("history", json!({"channel": unknown, "limit": 1}))
            .await;
        assert_eq!(
            h["error"],
            json!({"code": 1006, "message": "runtime_unavailable"})
        );
        let mut g = Raw::connect(&s, "globex").await;
        let h = g.call("history", json!({"channel": ch, "limit": 1})).await;
        assert_eq!(
            h["error"],
            json!({"code": 1006, "message": "runtime_unavailable"})
        );
        let h = c.call("history", json!({"channel": "not-a-channel"})).await;
        assert_eq!(h["error"]["code"], 107);
        s.server.shutdown();
        s.server.wait().await;
    }

    pub async fn a_subscribe_carrying_its_bind_binds_and_subscribes_in_one_step_with_binds_refusals(
        ts: &TestStore,
    ) {
        let s = serve(ts, "stream-bind", |_| {}).await;
        let (f, placed) = placed_session(ts, &s, "bind").await;
        let ch = channel_of(&placed);
        let epoch = placed.observation.lease_epoch.get();
        // On a link that holds no bind: one subscribe binds and subscribes.
        let mut c = Raw::connect(&s, "acme").await;
        let reply = c
            .call(
                "subscribe",
                json!({"channel": ch, "data": {"version": 1, "bind": bind_data(&placed, epoch)}}),
            )
            .await;
        assert_eq!(reply["subscribe"]["recoverable"], true, "{reply}");
        say(&f, &placed, "one").await;
        let pubs = c.enduring_until(said("one")).await;
        assert!(!pubs.is_empty());
        let again = c
            .call(
                "subscribe",
                json!({"channel": ch, "data": {"version": 1, "bind": bind_data(&placed, epoch)}}),
            )
            .await;
        assert_eq!(again["error"]["code"], 105, "{again}");
        // The same refusals as hostlink.bind, as Centrifuge errors carrying the same codes; one a
        // fresh bind may overcome on this link is temporary, so an SDK retries by itself.
        let mut d = Raw::connect(&s, "acme").await;
        let stale = d
            .call(
                "subscribe",
                json!({"channel": ch, "data": {"version": 1, "bind": bind_data(&placed, epoch + 1)}}),
            )
            .await;
        assert_eq!(
            stale["error"],
            json!({"code": 1004, "message": "epoch_mismatch", "temporary": true}),
            "{stale}"
        );
        let rpc = d
            .call(
                "rpc",
                json!({"method": "hostlink.bind", "data": bind_data(&placed, epoch + 1)}),
            )
            .await;
        assert_eq!(rpc["rpc"]["data"]["code"], "epoch_mismatch");
        // Nothing was bound by the refused subscribe.
        let plain = d.call("subscribe", json!({"channel": ch})).await;
        assert_eq!(plain["error"]["code"], 103, "{plain}");
        // A bind that names another session than the channel is malformed.
        let mut other = bind_data(&placed, epoch);
        other["session_id"] = json!("another");
        let bad = d
            .call(
                "subscribe",
                json!({"channel": ch, "data": {"version": 1, "bind": other}}),
            )
            .await;
        assert_eq!(bad["error"]["code"], 107, "{bad}");
        // Another tenant is refused exactly like an unknown session.
        let mut g = Raw::connect(&s, "globex").await;
        let foreign = g
            .call(
                "subscribe",
                json!({"channel": ch, "data": {"version": 1, "bind": bind_data(&placed, epoch)}}),
            )
            .await;
        assert_eq!(
            foreign["error"],
            json!({"code": 1006, "message": "runtime_unavailable", "temporary": true}),
            "{foreign}"
        );
        // When the session leaves this Host, the subscription that carried its bind is asked to
        // resubscribe (the SDK does, with fresh bind parameters, from its last offset); one made
        // after a separate bind is ended as before.
        let (mut plain, _) = subscribed(&s, &placed, None).await;
        let _ = s.service.drain().await;
        let unsubscribe = |v: Value| v["push"]["unsubscribe"].clone();
        let mut seen = Vec::new();
        while seen.is_empty() {
            let v = c.line().await;
            if v["push"].get("unsubscribe").is_some() {
                seen.push(unsubscribe(v));
            }
        }
        assert_eq!(seen[0]["code"], 2500, "{seen:?}");
        let mut seen = Vec::new();
        while seen.is_empty() {
            let v = match plain.pushes.pop_front() {
                Some(v) => v,
                None => plain.line().await,
            };
            if v["push"].get("unsubscribe").is_some() {
                seen.push(unsubscribe(v));
            }
        }
        assert_eq!(seen[0]["code"], 2000, "{seen:?}");
        s.server.shutdown();
        s.server.wait().await;
    }
}

sessionstore::both_backends!(cases =>
    every_enduring_push_carries_the_next_public_offset_counted_in_the_journal,
    a_resubscribe_from_its_last_offset_recovers_every_committed_record_once_then_streams,
    a_client_past_the_recovery_window_or_in_another_epoch_is_told_to_reload,
    history_serves_limit_since_and_reverse_from_the_journal_for_its_tenant_only,
    a_subscribe_carrying_its_bind_binds_and_subscribes_in_one_step_with_binds_refusals,
);
