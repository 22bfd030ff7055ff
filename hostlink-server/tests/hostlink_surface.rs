//! The HostLink surface over real sockets: a real axum server on 127.0.0.1:0, an in-memory
//! backend, and real WebSocket clients.

mod support;

use std::time::Duration;

use hostlink::Disconnect;
use hostlink_server::LinkOptions;
use serde_json::{Value, json};
use support::*;

const RESERVED: [&str; 5] = [
    "hostlink.bind",
    "hostlink.unbind",
    "hostlink.attach",
    "hostlink.drain",
    "hostlink.drain_status",
];

async fn server(tenants: &[&str]) -> TestServer {
    TestServer::start(TestBackend::new(tenants), quiet_options()).await
}

fn reply_data(v: &Value) -> &Value {
    &v["rpc"]["data"]
}

// ---------------------------------------------------------------- route and handshake

#[tokio::test]
async fn a_tenant_with_its_credential_connects_and_learns_the_methods_and_tokens() {
    let s = server(&["acme"]).await;
    let (_c, reply) = s.connect("acme").await;
    assert_eq!(reply["id"], 1);
    let connect = &reply["connect"];
    assert!(uuid::Uuid::parse_str(connect["client"].as_str().unwrap()).is_ok());
    assert_eq!(connect["version"], "host-test-0.1");
    assert_eq!(connect["ping"], 60);
    assert_eq!(connect["pong"], true);
    let mut methods: Vec<&str> = RESERVED.to_vec();
    methods.extend(TOKENS);
    assert_eq!(
        connect["data"],
        json!({"version": 1, "hostlink_methods": methods})
    );
}

#[tokio::test]
async fn json_is_selected_by_no_subprotocol_the_json_subprotocol_or_the_query() {
    let s = server(&["acme"]).await;
    let c = s
        .dial("/hostlink/acme", Some("centrifuge-json"))
        .await
        .unwrap();
    assert_eq!(c.selected_protocol.as_deref(), Some("centrifuge-json"));
    for path in [
        "/hostlink/acme",
        "/hostlink/acme?format=json",
        "/hostlink/acme?cf_protocol=json",
        "/hostlink/acme?cf_protocol_version=v2&format=json",
    ] {
        let mut c = s.dial(path, None).await.unwrap();
        assert_eq!(c.selected_protocol, None);
        assert!(
            c.handshake(&token_of("acme"))
                .await
                .get("connect")
                .is_some()
        );
    }
}

#[tokio::test]
async fn protobuf_and_unknown_formats_are_refused_with_400_before_the_upgrade() {
    let s = server(&["acme"]).await;
    assert_eq!(
        s.dial("/hostlink/acme", Some("centrifuge-protobuf"))
            .await
            .err(),
        Some(400)
    );
    for path in [
        "/hostlink/acme?format=protobuf",
        "/hostlink/acme?cf_protocol=protobuf",
        "/hostlink/acme?format=xml",
        "/hostlink/acme?cf_protocol_version=v1",
    ] {
        assert_eq!(s.dial(path, None).await.err(), Some(400), "{path}");
    }
}

#[tokio::test]
async fn a_tenant_that_fails_the_id_rule_is_refused_with_400() {
    let s = server(&["acme"]).await;
    let long = "a".repeat(257);
    for path in [
        "/hostlink/a%00b".to_owned(),
        "/hostlink/%FF".to_owned(),
        format!("/hostlink/{long}"),
    ] {
        assert_eq!(s.dial(&path, None).await.err(), Some(400), "{path}");
    }
    // A percent-encoded slash is part of the one segment.
    assert!(s.dial("/hostlink/a%2Fb", None).await.is_ok());
}

#[tokio::test]
async fn a_missing_or_extra_path_segment_is_404() {
    let s = server(&["acme"]).await;
    for path in [
        "/hostlink",
        "/hostlink/",
        "/hostlink/acme/extra",
        "/hostlink/acme/",
        "/other/acme",
    ] {
        assert_eq!(s.dial(path, None).await.err(), Some(404), "{path}");
    }
}

#[tokio::test]
async fn a_host_not_accepting_links_answers_503_never_400() {
    let s = server(&["acme"]).await;
    s.backend.set_accepting(false);
    assert_eq!(s.dial("/hostlink/acme", None).await.err(), Some(503));
    assert_eq!(s.dial("/hostlink/a%00b", None).await.err(), Some(503));
    assert_eq!(
        s.dial("/hostlink/acme?format=protobuf", None).await.err(),
        Some(503)
    );
    s.backend.set_accepting(true);
    assert!(s.dial("/hostlink/acme", None).await.is_ok());
}

#[tokio::test]
async fn a_wrong_token_and_an_unknown_tenant_are_both_closed_with_4500() {
    let s = server(&["acme"]).await;
    let mut wrong = s.dial("/hostlink/acme", None).await.unwrap();
    wrong
        .send_text(r#"{"id":1,"connect":{"token":"nope","data":{"supported_versions":[1]}}}"#)
        .await;
    let mut unknown = s.dial("/hostlink/ghost", None).await.unwrap();
    unknown
        .send_text(&format!(
            r#"{{"id":1,"connect":{{"token":"{}","data":{{"supported_versions":[1]}}}}}}"#,
            token_of("ghost")
        ))
        .await;
    let mut missing = s.dial("/hostlink/acme", None).await.unwrap();
    missing
        .send_text(r#"{"id":1,"connect":{"data":{"supported_versions":[1]}}}"#)
        .await;
    let expected = (4500, "service authentication failed".to_owned());
    assert_eq!(wrong.close_code().await, expected);
    assert_eq!(unknown.close_code().await, expected);
    assert_eq!(missing.close_code().await, expected);
}

#[tokio::test]
async fn a_client_without_wire_version_1_is_closed_with_4501() {
    let s = server(&["acme"]).await;
    let mut c = s.dial("/hostlink/acme", None).await.unwrap();
    c.send_text(&format!(
        r#"{{"id":1,"connect":{{"token":"{}","data":{{"supported_versions":[2,3]}}}}}}"#,
        token_of("acme")
    ))
    .await;
    assert_eq!(
        c.close_code().await,
        (4501, "unsupported wire version".to_owned())
    );
}

#[tokio::test]
async fn malformed_connect_data_is_a_bad_request() {
    let s = server(&["acme"]).await;
    for data in [
        r#""data":{"supported_versions":[]}"#,
        r#""data":{"supported_versions":[0,1]}"#,
        r#""data":{"supported_versions":[1,1]}"#,
        r#""data":{"supported_versions":[1],"extra":true}"#,
        r#""data":"v1""#,
        r#""name":"no data""#,
    ] {
        let mut c = s.dial("/hostlink/acme", None).await.unwrap();
        c.send_text(&format!(
            r#"{{"id":1,"connect":{{"token":"{}",{data}}}}}"#,
            token_of("acme")
        ))
        .await;
        assert_eq!(c.close_code().await.0, 3501, "{data}");
    }
}

#[tokio::test]
async fn a_first_frame_that_is_not_connect_is_a_bad_request() {
    let s = server(&["acme"]).await;
    for first in [
        r#"{"id":1,"rpc":{"method":"hostlink.bind","data":{}}}"#,
        "{}",
    ] {
        let mut c = s.dial("/hostlink/acme", None).await.unwrap();
        c.send_text(first).await;
        assert_eq!(
            c.close_code().await,
            (3501, "bad request".to_owned()),
            "{first}"
        );
    }
}

#[tokio::test]
async fn a_link_that_never_connects_is_closed_as_stale() {
    let backend = TestBackend::new(&["acme"]);
    let s = TestServer::start(
        backend,
        LinkOptions {
            handshake_timeout: Duration::from_millis(200),
            ..quiet_options()
        },
    )
    .await;
    let mut c = s.dial("/hostlink/acme", None).await.unwrap();
    assert_eq!(c.close_code().await.0, 3502);
}

#[tokio::test]
async fn a_second_connect_is_a_bad_request() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    c.send_text(&format!(
        r#"{{"id":2,"connect":{{"token":"{}","data":{{"supported_versions":[1]}}}}}}"#,
        token_of("acme")
    ))
    .await;
    assert_eq!(c.close_code().await.0, 3501);
}

// ---------------------------------------------------------------- requests

#[tokio::test]
async fn attach_answers_a_registry_observation_and_is_idempotent() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let first = c.rpc("hostlink.attach", &attach_data("acme", "s1")).await;
    let data = reply_data(&first);
    assert_eq!(data["version"], 1);
    assert_eq!(data["tenant_id"], "acme");
    assert_eq!(data["residency"], "resident");
    assert_eq!(data["observed_at"], "2023-11-14T22:13:20Z");
    let keys: Vec<&String> = data.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "version",
            "tenant_id",
            "session_id",
            "host_id",
            "host_generation",
            "agent_id",
            "runtime_compatibility_id",
            "placement",
            "internal_endpoint",
            "residency",
            "accepting",
            "lease_epoch",
            "observed_at",
            "expires_at"
        ]
    );
    let again = c.rpc("hostlink.attach", &attach_data("acme", "s1")).await;
    assert_eq!(reply_data(&again), data);
}

#[tokio::test]
async fn a_refused_attach_is_a_successful_reply_carrying_the_error_record() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let other_build = attach_data("acme", "s1").replace(BUILD, "build-2");
    let r = c.rpc("hostlink.attach", &other_build).await;
    assert_eq!(
        reply_data(&r),
        &json!({"code":"runtime_mismatch","runtime_compatibility_id":BUILD})
    );
    assert!(r.get("error").is_none());
    let failing = attach_data("acme", "s1").replace("agent-1", "explode");
    let r = c.rpc("hostlink.attach", &failing).await;
    assert_eq!(
        r["error"],
        json!({"code":100,"message":"internal server error","temporary":true})
    );
}

#[tokio::test]
async fn a_foreign_tenant_is_refused_exactly_like_an_unknown_session() {
    let s = server(&["acme", "other"]).await;
    s.backend.make_resident("other", "theirs");
    let epoch = s.backend.epoch("other", "theirs");
    let (mut c, _) = s.connect("acme").await;
    let unknown = c
        .rpc("hostlink.bind", &bind_data("acme", "nobody", 1))
        .await;
    let foreign_bind = c
        .rpc("hostlink.bind", &bind_data("other", "theirs", epoch))
        .await;
    let foreign_attach = c
        .rpc("hostlink.attach", &attach_data("other", "theirs"))
        .await;
    let foreign_unbind = c
        .rpc("hostlink.unbind", &unbind_data("other", "theirs", epoch))
        .await;
    let foreign_drain = c
        .rpc(
            "hostlink.drain",
            &drain_data(Some(("other", FIXED_SESSION))),
        )
        .await;
    let expected = json!({"code":"runtime_unavailable"});
    for r in [
        &unknown,
        &foreign_bind,
        &foreign_attach,
        &foreign_unbind,
        &foreign_drain,
    ] {
        assert_eq!(reply_data(r), &expected, "{r}");
    }
    // Byte for byte the same reply, apart from the id.
    let text = |v: &Value| serde_json::to_string(&v["rpc"]).unwrap();
    assert_eq!(text(&unknown), text(&foreign_bind));
    assert_eq!(s.backend.receivers("other", "theirs"), 0);
}

#[tokio::test]
async fn bind_checks_the_epoch_and_says_the_current_one() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let attach = c.rpc("hostlink.attach", &attach_data("acme", "s1")).await;
    let epoch = reply_data(&attach)["lease_epoch"].as_u64().unwrap();
    let stale = c
        .rpc("hostlink.bind", &bind_data("acme", "s1", epoch + 5))
        .await;
    assert_eq!(
        reply_data(&stale),
        &json!({"code":"epoch_mismatch","current_lease_epoch":epoch})
    );
    let ok = c
        .rpc("hostlink.bind", &bind_data("acme", "s1", epoch))
        .await;
    assert_eq!(reply_data(&ok), &json!({}));
    // Binding again on the same link is answered the same and keeps one binding.
    let again = c
        .rpc("hostlink.bind", &bind_data("acme", "s1", epoch))
        .await;
    assert_eq!(reply_data(&again), &json!({}));
    assert_eq!(s.handle.tenant_bindings(&tenant("acme")), 1);
}

#[tokio::test]
async fn unbind_is_idempotent_and_ends_the_subscription() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let epoch = attach_and_bind(&mut c, "acme", "s1").await;
    assert_eq!(
        subscribe(&mut c, "acme", "s1", None).await["subscribe"],
        json!({})
    );
    let r = c
        .rpc("hostlink.unbind", &unbind_data("acme", "s1", epoch))
        .await;
    assert_eq!(reply_data(&r), &json!({}));
    let push = c.push().await;
    assert_eq!(push["channel"], channel("acme", "s1"));
    assert_eq!(push["unsubscribe"]["code"], 2000);
    let r = c
        .rpc("hostlink.unbind", &unbind_data("acme", "s1", epoch))
        .await;
    assert_eq!(reply_data(&r), &json!({}));
    assert_eq!(s.handle.tenant_bindings(&tenant("acme")), 0);
    let sub = subscribe(&mut c, "acme", "s1", None).await;
    assert_eq!(sub["error"]["code"], 103);
}

#[tokio::test]
async fn drain_is_reachable_only_for_the_fixed_session_of_the_tenant_holding_it() {
    let s = server(&["acme", "other"]).await;
    let (mut c, _) = s.connect("acme").await;
    let unavailable = json!({"code":"runtime_unavailable"});
    // Nothing attached yet, no scope, and status before any drain: all the same refusal.
    for (method, scope) in [
        ("hostlink.drain", Some(("acme", FIXED_SESSION))),
        ("hostlink.drain", None),
        ("hostlink.drain_status", None),
        ("hostlink.drain_status", Some(("acme", FIXED_SESSION))),
    ] {
        let r = c.rpc(method, &drain_data(scope)).await;
        assert_eq!(reply_data(&r), &unavailable, "{method} {scope:?}");
    }
    attach_and_bind(&mut c, "acme", FIXED_SESSION).await;
    let r = c
        .rpc("hostlink.drain", &drain_data(Some(("acme", FIXED_SESSION))))
        .await;
    assert_eq!(
        reply_data(&r),
        &json!({"host_id":HOST,"host_generation":1,"drain_generation":1,"state":"draining","tenant_id":"acme","session_id":FIXED_SESSION})
    );
    let r = c
        .rpc(
            "hostlink.drain_status",
            &drain_data(Some(("acme", FIXED_SESSION))),
        )
        .await;
    assert_eq!(reply_data(&r)["state"], "draining");
    // Still refused without a scope, even now that a drain has begun.
    let r = c.rpc("hostlink.drain", &drain_data(None)).await;
    assert_eq!(reply_data(&r), &unavailable);
    let (mut o, _) = s.connect("other").await;
    let r = o
        .rpc(
            "hostlink.drain_status",
            &drain_data(Some(("other", FIXED_SESSION))),
        )
        .await;
    assert_eq!(reply_data(&r), &unavailable);
}

#[tokio::test]
async fn malformed_data_is_error_107_on_that_command_only() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let good = bind_data("acme", "s1", 1);
    for bad in [
        "null".to_owned(),
        "[]".to_owned(),
        good.replace(r#""version":1"#, r#""version":2"#),
        good.replace(r#""lease_epoch":1"#, r#""lease_epoch":0"#),
        good.replace(r#""version":1,"#, r#""version":1,"surprise":1,"#),
        good.replace(r#""version":1,"#, r#""version":1,"version":1,"#),
        good.replace(r#""tenant_id":"acme""#, r#""tenant_id":null"#),
    ] {
        let r = c.rpc("hostlink.bind", &bad).await;
        assert_eq!(
            r["error"],
            json!({"code":107,"message":"bad request"}),
            "{bad}"
        );
    }
    let id = c.id();
    c.send_text(&format!(
        r#"{{"id":{id},"rpc":{{"method":"hostlink.attach"}}}}"#
    ))
    .await;
    assert_eq!(c.reply(id).await["error"]["code"], 107);
    // The link is still fine.
    let r = c.rpc("hostlink.attach", &attach_data("acme", "s1")).await;
    assert_eq!(reply_data(&r)["residency"], "resident");
}

#[tokio::test]
async fn an_unknown_method_and_a_capability_token_are_both_method_not_found() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    for method in [
        "hostlink.nope",
        "hostlink.run",
        "hostlink.command.gate_response",
        "run.start",
    ] {
        let r = c.rpc(method, "{}").await;
        assert_eq!(
            r["error"],
            json!({"code":104,"message":"method not found"}),
            "{method}"
        );
    }
    let r = c.rpc("run.ps", "{}").await;
    assert_eq!(reply_data(&r), &json!({"tenant":"acme","runs":[]}));
}

#[tokio::test]
async fn centrifuge_features_hostlink_does_not_offer_are_not_available() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let ch = channel("acme", "s1");
    for (method, body) in [
        ("presence", format!(r#"{{"channel":"{ch}"}}"#)),
        ("presence_stats", format!(r#"{{"channel":"{ch}"}}"#)),
        ("history", format!(r#"{{"channel":"{ch}","limit":10}}"#)),
        ("sub_refresh", format!(r#"{{"channel":"{ch}"}}"#)),
    ] {
        let r = c.command(method, &body).await;
        assert_eq!(r["error"]["code"], 108, "{method}");
    }
    // `refresh` is offered: an opaque token never expires, so its reply says no expiry.
    let r = c
        .command("refresh", &format!(r#"{{"token":"{}"}}"#, token_of("acme")))
        .await;
    assert!(r["refresh"]["client"].is_string(), "{r}");
    assert!(r["refresh"].get("expires").is_none(), "{r}");
}

// ---------------------------------------------------------------- push and delivery

#[tokio::test]
async fn subscribe_is_refused_without_the_bind_on_this_link() {
    let s = server(&["acme", "other"]).await;
    let (mut a, _) = s.connect("acme").await;
    let (mut b, _) = s.connect("acme").await;
    attach_and_bind(&mut a, "acme", "s1").await;
    s.backend.make_resident("other", "x");
    assert_eq!(
        subscribe(&mut b, "acme", "s1", None).await["error"]["code"],
        103
    );
    assert_eq!(
        subscribe(&mut a, "acme", "s2", None).await["error"]["code"],
        103
    );
    assert_eq!(
        subscribe(&mut a, "other", "x", None).await["error"]["code"],
        103
    );
    let r = a
        .command("subscribe", r#"{"channel":"not-a-session-channel"}"#)
        .await;
    assert_eq!(r["error"]["code"], 107);
    let r = subscribe(
        &mut a,
        "acme",
        "s1",
        Some(r#"{"version":1,"surprise":true}"#),
    )
    .await;
    assert_eq!(r["error"]["code"], 107);
    assert_eq!(
        subscribe(&mut a, "acme", "s1", None).await["subscribe"],
        json!({})
    );
    assert_eq!(
        subscribe(&mut a, "acme", "s1", None).await["error"]["code"],
        105
    );
}

#[tokio::test]
async fn enduring_publications_are_pushed_with_their_body_byte_for_byte() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    // Committed between bind and subscribe: still delivered.
    s.backend
        .publish("acme", "s1", 1, r#"{"z":1, "a" : [true]}"#)
        .unwrap();
    subscribe(&mut c, "acme", "s1", None).await;
    s.backend.publish("acme", "s1", 2, r#"{"b":"é"}"#).unwrap();
    let id = c.id();
    c.send_text(&format!(
        r#"{{"id":{id},"rpc":{{"method":"nothing","data":{{}}}}}}"#
    ))
    .await;
    let mut raw = Vec::new();
    while raw.len() < 2 {
        let line = c.next_line().await.expect("the link is open");
        if line.starts_with(r#"{"push""#) {
            raw.push(line);
        }
    }
    let ch = channel("acme", "s1");
    assert_eq!(
        raw[0],
        format!(
            r#"{{"push":{{"channel":"{ch}","pub":{{"data":{{"tenant_id":"acme","session_id":"s1","event_id":"event-1","journal_seq":1,"covered_through":1,"body":{{"z":1, "a" : [true]}}}},"offset":1,"tags":{{"record":"enduring_publication"}}}}}}}}"#
        )
    );
    assert!(raw[1].contains(r#""body":{"b":"é"}},"offset":2,"#));
}

#[tokio::test]
async fn unsubscribe_stops_the_pushes_and_a_new_subscription_starts_from_now() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(&mut c, "acme", "s1", None).await;
    s.backend.publish("acme", "s1", 1, r#"{"n":1}"#).unwrap();
    assert_eq!(c.push().await["pub"]["data"]["journal_seq"], 1);
    let r = c
        .command(
            "unsubscribe",
            &format!(r#"{{"channel":"{}"}}"#, channel("acme", "s1")),
        )
        .await;
    assert_eq!(r["unsubscribe"], json!({}));
    s.backend.publish("acme", "s1", 2, r#"{"n":2}"#).unwrap();
    // Still bound: deliveries work while unsubscribed.
    let r = c
        .command(
            "publish",
            &format!(
                r#"{{"channel":"{}","data":{{"command_id":"c1"}}}}"#,
                channel("acme", "s1")
            ),
        )
        .await;
    assert_eq!(r["publish"], json!({}));
    assert_eq!(
        subscribe(&mut c, "acme", "s1", None).await["subscribe"],
        json!({})
    );
    s.backend.publish("acme", "s1", 3, r#"{"n":3}"#).unwrap();
    assert_eq!(c.push().await["pub"]["data"]["journal_seq"], 3);
}

#[tokio::test]
async fn a_pretty_printed_body_is_pushed_on_one_line_with_the_same_value() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(&mut c, "acme", "s1", None).await;
    let pretty = "{\n  \"text\": \"two\\nlines\",\r\n  \"n\": 1\n}";
    s.backend.publish("acme", "s1", 1, pretty).unwrap();
    s.backend
        .publish("acme", "s1", 2, r#"{"after":true}"#)
        .unwrap();
    let first = c.push().await;
    assert_eq!(
        first["pub"]["data"]["body"],
        json!({"text":"two\nlines","n":1})
    );
    let second = c.push().await;
    assert_eq!(second["pub"]["data"]["body"], json!({"after":true}));
}

#[tokio::test]
async fn a_delivery_wakes_a_bound_session_and_is_refused_on_an_unbound_one() {
    let s = server(&["acme", "other"]).await;
    let (mut c, _) = s.connect("acme").await;
    s.backend.make_resident("acme", "unbound");
    s.backend.make_resident("other", "x");
    let unavailable = json!({"code":1006,"message":"runtime_unavailable"});
    for (t, sess) in [("acme", "unbound"), ("other", "x")] {
        let r = c
            .command(
                "publish",
                &format!(
                    r#"{{"channel":"{}","data":{{"command_id":"c1"}}}}"#,
                    channel(t, sess)
                ),
            )
            .await;
        assert_eq!(r["error"], unavailable, "{t}/{sess}");
    }
    attach_and_bind(&mut c, "acme", "s1").await;
    let r = c
        .command(
            "publish",
            &format!(
                r#"{{"channel":"{}","data":{{"command_id":"c1"}}}}"#,
                channel("acme", "s1")
            ),
        )
        .await;
    assert_eq!(r["publish"], json!({}));
    let r = c
        .command(
            "publish",
            &format!(
                r#"{{"channel":"{}","data":{{"command_id":""}}}}"#,
                channel("acme", "s1")
            ),
        )
        .await;
    assert_eq!(r["error"]["code"], 107);
    assert_eq!(
        s.backend.deliveries(),
        vec![(
            tenant("acme"),
            session("s1"),
            sessionstore::CommandId::new("c1").unwrap()
        )]
    );
}

#[tokio::test]
async fn a_session_whose_tail_ended_loses_every_binding_and_refuses_deliveries() {
    let s = server(&["acme"]).await;
    let (mut a, _) = s.connect("acme").await;
    let (mut b, _) = s.connect("acme").await;
    attach_and_bind(&mut a, "acme", "s1").await;
    attach_and_bind(&mut b, "acme", "s1").await;
    subscribe(&mut a, "acme", "s1", None).await;
    s.backend.end_tail("acme", "s1");
    let push = a.push().await;
    assert_eq!(push["unsubscribe"]["code"], 2000);
    for c in [&mut a, &mut b] {
        let r = c
            .command(
                "publish",
                &format!(
                    r#"{{"channel":"{}","data":{{"command_id":"c1"}}}}"#,
                    channel("acme", "s1")
                ),
            )
            .await;
        assert_eq!(r["error"]["message"], "runtime_unavailable");
    }
    assert_eq!(s.handle.tenant_bindings(&tenant("acme")), 0);
}

// ---------------------------------------------------------------- framing

#[tokio::test]
async fn several_commands_in_one_frame_are_all_answered() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let frame = format!(
        "{{\"id\":2,\"rpc\":{{\"method\":\"hostlink.attach\",\"data\":{}}}}}\n{{\"id\":3,\"rpc\":{{\"method\":\"nope\",\"data\":{{}}}}}}\n{{\"id\":4,\"rpc\":{{\"method\":\"hostlink.attach\",\"data\":{}}}}}\n",
        attach_data("acme", "s1"),
        attach_data("acme", "s2")
    );
    c.send_text(&frame).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(c.json().await["id"].as_u64().unwrap());
    }
    assert_eq!(ids, [2, 3, 4]);
}

/// A message over the frame limit closes the link with 1009 (message too big) however large it
/// is: just over the limit (the decoder's refusal), near the transport's ceiling, and far past it
/// (2 MiB, cut off by the transport before it is read whole).
#[tokio::test]
async fn a_message_over_the_frame_limit_closes_with_1009_however_large_it_is() {
    let s = server(&["acme"]).await;
    let limit = hostlink::frame::DEFAULT_MAX_FRAME_BYTES;
    let over = |n: usize| format!("{{\"id\":2,\"rpc\":{{\"method\":\"{}\"}}}}", "m".repeat(n));
    for size in [limit + 10, limit * 2 - 40, limit * 3, 2 * 1024 * 1024] {
        let (mut c, _) = s.connect("acme").await;
        c.send_text(&over(size)).await;
        assert_eq!(c.close_code().await.0, 1009, "a {size}-byte message");
    }
    // The server is none the worse.
    let (_c, reply) = s.connect("acme").await;
    assert_eq!(reply["id"], 1);
}

#[tokio::test]
async fn undecodable_frames_close_the_link_with_bad_request_and_never_take_the_server_down() {
    let s = server(&["acme"]).await;
    let cases: Vec<(String, u16)> = vec![
        ("not json".into(), 3501),
        (
            r#"{"id":2,"rpc":{"method":"hostlink.attach","data":{"#.into(),
            3501,
        ),
        (r#"{"id":2,"bogus":{}}"#.into(), 3501),
        (r#"{"id":2}"#.into(), 3501),
        (r#"{"rpc":{"method":"m"}}"#.into(), 3501),
        ("{}\n\n{}".into(), 3501),
        (
            format!(
                "{{\"id\":2,\"rpc\":{{\"method\":\"{}\"}}}}",
                "m".repeat(70_000)
            ),
            1009,
        ),
        (vec!["{}"; 200].join("\n"), 3501),
    ];
    for (frame, code) in cases {
        let (mut c, _) = s.connect("acme").await;
        c.send_text(&frame).await;
        assert_eq!(
            c.close_code().await.0,
            code,
            "{}",
            &frame[..frame.len().min(60)]
        );
    }
    let (mut c, _) = s.connect("acme").await;
    c.send_binary(b"\x00\x01").await;
    assert_eq!(c.close_code().await.0, 3501);
    // A frame with a good command before the bad line yields no command at all.
    let (mut c, _) = s.connect("acme").await;
    c.send_text(&format!(
        "{{\"id\":2,\"rpc\":{{\"method\":\"hostlink.attach\",\"data\":{}}}}}\nnope",
        attach_data("acme", "s9")
    ))
    .await;
    assert_eq!(c.close_code().await.0, 3501);
    let (mut c, _) = s.connect("acme").await;
    let r = c.rpc("hostlink.bind", &bind_data("acme", "s9", 1)).await;
    assert_eq!(reply_data(&r), &json!({"code":"runtime_unavailable"}));
}

// ---------------------------------------------------------------- heartbeat

#[tokio::test]
async fn a_client_that_answers_pings_stays_and_one_that_misses_a_pong_is_closed_with_3012() {
    let options = LinkOptions {
        ping_interval: Duration::from_millis(300),
        pong_timeout: Duration::from_millis(200),
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["acme"]), options).await;
    let (mut good, reply) = s.connect("acme").await;
    assert_eq!(reply["connect"]["ping"], 1);
    let (mut silent, _) = s.connect("acme").await;
    for _ in 0..4 {
        assert_eq!(good.json().await, json!({}));
        good.send_text("{}").await;
    }
    assert_eq!(silent.close_code().await, (3012, "no pong".to_owned()));
    let r = good
        .rpc("hostlink.attach", &attach_data("acme", "s1"))
        .await;
    assert_eq!(reply_data(&r)["residency"], "resident");
}

#[tokio::test]
async fn a_heartbeat_turned_off_sends_no_ping_and_closes_no_silent_client() {
    let options = LinkOptions {
        ping_interval: Duration::ZERO,
        pong_timeout: Duration::ZERO,
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["acme"]), options).await;
    let (mut silent, reply) = s.connect("acme").await;
    assert_eq!(reply["connect"]["ping"], 0);
    assert_eq!(reply["connect"]["pong"], false);
    // Well past what a 300 ms heartbeat would have taken to close it, the silent client is
    // still served, and nothing but the reply to its own call was sent to it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = silent
        .rpc("hostlink.attach", &attach_data("acme", "s1"))
        .await;
    assert_eq!(reply_data(&r)["residency"], "resident");
}

// ---------------------------------------------------------------- bounds

#[tokio::test]
async fn a_slow_subscriber_is_disconnected_with_3008_and_nothing_grows_without_bound() {
    let mut backend = TestBackend::new(&["acme"]);
    backend.feed_capacity = 64;
    let options = LinkOptions {
        outbound_queue: 16,
        slow_consumer_timeout: Duration::from_millis(300),
        ..quiet_options()
    };
    let s = TestServer::start(backend, options).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(&mut c, "acme", "s1", None).await;
    // The client stops reading; the Host keeps committing 32 KiB events.
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(32 * 1024));
    let mut published = 0u64;
    let cut = loop {
        if s.backend
            .publish("acme", "s1", published + 1, &body)
            .is_err()
        {
            break true;
        }
        published += 1;
        if published >= 4000 {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert!(cut, "the link kept taking records: {published} published");
    assert!(published < 4000);
    assert_eq!(s.backend.receivers("acme", "s1"), 0);
    assert_eq!(c.close_code().await, (3008, "slow".to_owned()));
}

#[tokio::test]
async fn the_least_recently_used_idle_link_is_evicted_at_max_tenant_links() {
    let options = LinkOptions {
        max_tenant_links: 2,
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["t1", "t2", "t3", "t4", "t5"]), options).await;
    let (mut a, _) = s.connect("t1").await;
    let (mut b, _) = s.connect("t2").await;
    attach_and_bind(&mut b, "t2", "s").await;
    let (mut c, _) = s.connect("t3").await;
    assert_eq!(a.close_code().await, (4001, "idle link evicted".to_owned()));
    attach_and_bind(&mut c, "t3", "s").await;
    // Every admitted link holds a binding now: the newcomer is refused.
    let mut d = s.dial("/hostlink/t4", None).await.unwrap();
    d.send_text(&format!(
        r#"{{"id":1,"connect":{{"token":"{}","data":{{"supported_versions":[1]}}}}}}"#,
        token_of("t4")
    ))
    .await;
    assert_eq!(
        d.close_code().await,
        (4002, "link limit reached".to_owned())
    );
    // b and c are untouched.
    assert_eq!(
        reply_data(&b.rpc("hostlink.attach", &attach_data("t2", "s")).await)["residency"],
        "resident"
    );
    assert_eq!(
        reply_data(&c.rpc("hostlink.attach", &attach_data("t3", "s")).await)["residency"],
        "resident"
    );
}

#[tokio::test]
async fn bindings_are_bounded_per_link_and_per_tenant() {
    let options = LinkOptions {
        max_bindings_per_link: 2,
        max_bindings_per_tenant: 3,
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["acme"]), options).await;
    let (mut a, _) = s.connect("acme").await;
    let (mut b, _) = s.connect("acme").await;
    let mut epochs = Vec::new();
    for i in 1..=4 {
        let r = a
            .rpc("hostlink.attach", &attach_data("acme", &format!("s{i}")))
            .await;
        epochs.push(reply_data(&r)["lease_epoch"].as_u64().unwrap());
    }
    let limit = json!({"code":106,"message":"limit exceeded"});
    for (i, epoch) in epochs.iter().take(2).enumerate() {
        let r = a
            .rpc(
                "hostlink.bind",
                &bind_data("acme", &format!("s{}", i + 1), *epoch),
            )
            .await;
        assert_eq!(reply_data(&r), &json!({}));
    }
    let r = a
        .rpc("hostlink.bind", &bind_data("acme", "s3", epochs[2]))
        .await;
    assert_eq!(r["error"], limit, "per link");
    let r = b
        .rpc("hostlink.bind", &bind_data("acme", "s3", epochs[2]))
        .await;
    assert_eq!(reply_data(&r), &json!({}));
    let r = b
        .rpc("hostlink.bind", &bind_data("acme", "s4", epochs[3]))
        .await;
    assert_eq!(r["error"], limit, "per tenant");
    a.rpc("hostlink.unbind", &unbind_data("acme", "s1", epochs[0]))
        .await;
    let r = b
        .rpc("hostlink.bind", &bind_data("acme", "s4", epochs[3]))
        .await;
    assert_eq!(reply_data(&r), &json!({}));
    assert_eq!(s.handle.tenant_bindings(&tenant("acme")), 3);
    drop(b);
    wait_until("a closed link to give its bindings back", || {
        s.handle.tenant_bindings(&tenant("acme")) == 1
    })
    .await;
}

// ---------------------------------------------------------------- previews

#[tokio::test]
async fn previews_are_merged_flushed_before_the_next_enduring_record_and_rate_limited() {
    let options = LinkOptions {
        preview_rate_bytes_per_sec: 1,
        preview_burst_bytes: 200,
        preview_flush_interval: Duration::from_millis(100),
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["acme"]), options).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(
        &mut c,
        "acme",
        "s1",
        Some(r#"{"version":1,"ephemeral":true}"#),
    )
    .await;
    let data = |p: &Value| p["pub"]["data"].clone();
    let tag = |p: &Value| p["pub"]["tags"]["record"].as_str().unwrap().to_owned();

    // Ten deltas then a commit: one merged preview, then the enduring record.
    for _ in 0..10 {
        s.backend.preview("acme", "s1", "0123456789");
    }
    s.backend.publish("acme", "s1", 1, r#"{"n":1}"#).unwrap();
    let p = c.push().await;
    assert_eq!(tag(&p), "ephemeral_publication");
    assert_eq!(
        data(&p),
        json!({"tenant_id":"acme","session_id":"s1","stream":"text","text":"0123456789".repeat(10),"gap":false})
    );
    let p = c.push().await;
    assert_eq!(tag(&p), "enduring_publication");

    // 200 more bytes exceed what is left of the budget: dropped, never retried.
    for _ in 0..20 {
        s.backend.preview("acme", "s1", "abcdefghij");
    }
    s.backend.publish("acme", "s1", 2, r#"{"n":2}"#).unwrap();
    let p = c.push().await;
    assert_eq!(tag(&p), "enduring_publication", "{p}");
    assert_eq!(data(&p)["journal_seq"], 2);

    // A small delta fits again, and says text was dropped before it.
    s.backend.preview("acme", "s1", "xyz");
    let p = c.push().await;
    assert_eq!(data(&p)["text"], "xyz");
    assert_eq!(data(&p)["gap"], true);
    s.backend.preview("acme", "s1", "w");
    let p = c.push().await;
    assert_eq!(data(&p)["gap"], false);
}

#[tokio::test]
async fn reasoning_and_tool_step_previews_reach_only_a_subscriber_that_asked_and_tool_steps_are_never_merged()
 {
    use hostlink::records::{EphemeralPublication, PreviewStream, ToolPhase, ToolStepPreview};
    let options = LinkOptions {
        preview_flush_interval: Duration::from_millis(20),
        ..quiet_options()
    };
    let s = TestServer::start(TestBackend::new(&["acme"]), options).await;
    let (mut all, _) = s.connect("acme").await;
    attach_and_bind(&mut all, "acme", "s1").await;
    subscribe(
        &mut all,
        "acme",
        "s1",
        Some(r#"{"version":1,"ephemeral":true,"reasoning":true,"tool_steps":true}"#),
    )
    .await;
    let (mut text_only, _) = s.connect("acme").await;
    attach_and_bind(&mut text_only, "acme", "s1").await;
    subscribe(
        &mut text_only,
        "acme",
        "s1",
        Some(r#"{"version":1,"ephemeral":true}"#),
    )
    .await;
    let step = |phase, text: &str| {
        EphemeralPublication::tool_step(
            tenant("acme"),
            session("s1"),
            ToolStepPreview {
                call_id: "call-1".into(),
                name: "echo".into(),
                phase,
                is_error: false,
            },
            text,
        )
    };
    s.backend.preview_record(
        "acme",
        "s1",
        EphemeralPublication::delta(
            tenant("acme"),
            session("s1"),
            PreviewStream::Reasoning,
            "hmm ",
        ),
    );
    s.backend
        .preview_record("acme", "s1", step(ToolPhase::Started, "echo 2 characters"));
    s.backend
        .preview_record("acme", "s1", step(ToolPhase::Finished, "hi"));
    s.backend.preview("acme", "s1", "done");
    s.backend.publish("acme", "s1", 1, r#"{"n":1}"#).unwrap();
    let data = |p: &Value| p["pub"]["data"].clone();
    let mut seen = Vec::new();
    loop {
        let p = all.push().await;
        if p["pub"]["tags"]["record"] == "enduring_publication" {
            break;
        }
        seen.push(data(&p));
    }
    assert_eq!(
        seen,
        vec![
            json!({"tenant_id":"acme","session_id":"s1","stream":"reasoning","text":"hmm ","gap":false}),
            json!({"tenant_id":"acme","session_id":"s1","stream":"tool_step","text":"echo 2 characters","gap":false,
                   "tool":{"call_id":"call-1","name":"echo","phase":"started"}}),
            json!({"tenant_id":"acme","session_id":"s1","stream":"tool_step","text":"hi","gap":false,
                   "tool":{"call_id":"call-1","name":"echo","phase":"finished"}}),
            json!({"tenant_id":"acme","session_id":"s1","stream":"text","text":"done","gap":false}),
        ]
    );
    // The subscriber that asked for text only sees text, then the commit.
    let p = text_only.push().await;
    assert_eq!(data(&p)["stream"], "text", "{p}");
    let p = text_only.push().await;
    assert_eq!(p["pub"]["tags"]["record"], "enduring_publication", "{p}");
}

#[tokio::test]
async fn asking_for_reasoning_or_tool_steps_without_previews_is_a_bad_request() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    for data in [
        r#"{"version":1,"tool_steps":true}"#,
        r#"{"version":1,"ephemeral":false,"reasoning":true}"#,
    ] {
        let r = subscribe(&mut c, "acme", "s1", Some(data)).await;
        assert_eq!(r["error"]["code"], 107, "{data}: {r}");
    }
}

#[tokio::test]
async fn previews_are_never_pushed_to_a_subscriber_that_did_not_opt_in() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(&mut c, "acme", "s1", None).await;
    s.backend.preview("acme", "s1", "hidden");
    s.backend.publish("acme", "s1", 1, r#"{"n":1}"#).unwrap();
    let p = c.push().await;
    assert_eq!(p["pub"]["tags"]["record"], "enduring_publication");
}

// ---------------------------------------------------------------- stop

#[tokio::test]
async fn close_all_closes_every_link_last_and_wait_returns() {
    let s = server(&["acme"]).await;
    let (mut a, _) = s.connect("acme").await;
    let (mut b, _) = s.connect("acme").await;
    attach_and_bind(&mut b, "acme", "s1").await;
    subscribe(&mut b, "acme", "s1", None).await;
    // A drain observed over the link before the transports close.
    let r = b
        .rpc("hostlink.drain_status", &drain_data(Some(("acme", "s1"))))
        .await;
    assert_eq!(reply_data(&r), &json!({"code":"runtime_unavailable"}));
    s.handle.close_all(Disconnect::SHUTDOWN);
    assert_eq!(a.close_code().await, (3001, "shutdown".to_owned()));
    assert_eq!(b.close_code().await, (3001, "shutdown".to_owned()));
    tokio::time::timeout(WAIT, s.handle.wait())
        .await
        .expect("every link task finishes");
    assert_eq!(s.handle.live_links(), 0);
    assert_eq!(s.dial("/hostlink/acme", None).await.err(), Some(503));
}

// ---------------------------------------------------------------- an SDK no one here wrote

/// Runs `npm ci` in the top-level `tests/sdk` when its `node_modules` is missing. Node and npm are required:
/// their absence fails the test loudly.
async fn prepare_sdk() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk");
    let node = tokio::process::Command::new("node")
        .arg("--version")
        .output()
        .await;
    assert!(
        matches!(&node, Ok(o) if o.status.success()),
        "node is required for the SDK compatibility test and was not found: {node:?}"
    );
    if !dir.join("node_modules/centrifuge").is_dir() {
        let npm = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .output()
            .await
            .expect("npm is required for the SDK compatibility test and was not found");
        assert!(
            npm.status.success(),
            "npm ci failed: {}",
            String::from_utf8_lossy(&npm.stderr)
        );
    }
    dir
}

#[tokio::test]
async fn the_official_javascript_sdk_connects_attaches_binds_subscribes_delivers_and_receives() {
    let dir = prepare_sdk().await;
    let mut backend = TestBackend::new(&["acme"]);
    backend.echo_deliveries = 2;
    let options = LinkOptions {
        ping_interval: Duration::from_millis(500),
        pong_timeout: Duration::from_millis(400),
        ..quiet_options()
    };
    let s = TestServer::start(backend, options).await;
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("node")
            .arg(dir.join("hostlink_client.mjs"))
            .args([
                &s.tenant_url("acme"),
                &token_of("acme"),
                "acme",
                "sdk-session",
                HOST,
                &GENERATION.to_string(),
                BUILD,
                "agent-1",
                "2",
                "2500",
            ])
            .output(),
    )
    .await
    .expect("the SDK script finished")
    .expect("node ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(
        output.status.success(),
        "the SDK script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let find =
        |name: &str| -> Vec<&Value> { events.iter().filter(|e| e["event"] == name).collect() };
    let connected = find("connected");
    assert_eq!(connected.len(), 1, "{stdout}");
    assert_eq!(connected[0]["transport"], "websocket");
    assert_eq!(connected[0]["data"]["version"], 1);
    assert_eq!(connected[0]["data"]["hostlink_methods"][0], "hostlink.bind");
    assert_eq!(find("attach")[0]["data"]["residency"], "resident");
    assert_eq!(find("bind")[0]["data"], json!({}));
    assert_eq!(
        find("subscribed")[0]["channel"],
        channel("acme", "sdk-session")
    );
    assert_eq!(find("delivered").len(), 1);
    assert_eq!(find("delivery_refused")[0]["code"], 1006);
    assert_eq!(
        find("delivery_refused")[0]["message"],
        "runtime_unavailable"
    );
    let publications = find("publication");
    assert_eq!(publications.len(), 2, "{stdout}");
    for (i, p) in publications.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(p["tags"]["record"], "enduring_publication");
        assert_eq!(p["data"]["journal_seq"], n);
        assert_eq!(
            p["data"]["body"],
            json!({"kind":"applied","command_id":"sdk-command-1","n":n})
        );
    }
    // Lingering for several ping intervals, the SDK answered every ping.
    assert_eq!(find("still_connected")[0]["state"], "connected", "{stdout}");
    assert!(
        find("disconnected").iter().all(|d| d["code"] == 0),
        "{stdout}"
    );
    assert_eq!(
        s.backend.deliveries(),
        vec![(
            tenant("acme"),
            session("sdk-session"),
            sessionstore::CommandId::new("sdk-command-1").unwrap()
        )]
    );
}

#[tokio::test]
async fn close_all_does_not_wait_for_a_backend_call_that_never_returns() {
    let s = server(&["acme"]).await;
    let (mut c, _) = s.connect("acme").await;
    let hanging = attach_data("acme", "s1").replace("agent-1", "hang");
    c.send_text(&format!(
        r#"{{"id":2,"rpc":{{"method":"hostlink.attach","data":{hanging}}}}}"#
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.handle.close_all(Disconnect::SHUTDOWN);
    assert_eq!(c.close_code().await.0, 3001);
    tokio::time::timeout(WAIT, s.handle.wait())
        .await
        .expect("a hung backend call does not hold the stop");
}
