//! The HostLink client gives up on a Host that accepts connections but never answers (a
//! frozen process) within its named connect and request timeouts, and refuses timeouts out of
//! range.

use std::time::{Duration, Instant};

use controller::client::{ClientError, ClientOptions, HostLinkClient, MAX_TIMEOUT};
use futures::{SinkExt as _, StreamExt as _};
use sessionstore::{CommandId, SessionId, TenantId};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

fn options(connect: u64, request: u64) -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_millis(connect),
        request_timeout: Duration::from_millis(request),
    }
}

#[tokio::test]
async fn a_client_dialling_a_host_that_never_answers_gives_up_within_its_connect_timeout() {
    // The kernel accepts the connection; nobody ever reads it (as with a SIGSTOPped Host).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("ws://{}", listener.local_addr().unwrap());
    let _held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            kept.push(s);
        }
    });
    let started = Instant::now();
    let err = HostLinkClient::connect_with(
        &base,
        &TenantId::new("acme").unwrap(),
        "token",
        "test",
        options(300, 30_000),
    )
    .await
    .unwrap_err();
    assert_eq!(err, ClientError::Timeout(Duration::from_millis(300)));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_request_to_a_host_that_stops_answering_gives_up_within_its_request_timeout() {
    // A Host that completes the connect, then answers nothing more.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("ws://{}", listener.local_addr().unwrap());
    let _host = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _connect = ws.next().await;
        let reply = r#"{"id":1,"connect":{"client":"c1","version":"frozen","data":{"hostlink_methods":[]}}}"#;
        ws.send(Message::Text(reply.into())).await.unwrap();
        // Read and never answer.
        while let Some(Ok(_)) = ws.next().await {}
    });
    let client = HostLinkClient::connect_with(
        &base,
        &TenantId::new("acme").unwrap(),
        "token",
        "test",
        options(5_000, 250),
    )
    .await
    .expect("the connect is answered");
    let started = Instant::now();
    let err = client
        .deliver(&SessionId::new("s").unwrap(), &CommandId::new("c").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err, ClientError::Timeout(Duration::from_millis(250)));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_zero_or_oversized_timeout_is_refused_by_name() {
    assert!(ClientOptions::default().validate().is_ok());
    assert_eq!(
        options(0, 1000).validate().unwrap_err().field,
        "connect_timeout"
    );
    let too_long = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: MAX_TIMEOUT + Duration::from_secs(1),
    };
    assert_eq!(too_long.validate().unwrap_err().field, "request_timeout");
}
