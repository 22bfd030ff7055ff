//! A test OTLP collector: the official `TraceService` (generated from the OpenTelemetry
//! protobuf definitions by the `opentelemetry-proto` crate) served by tonic on a free local
//! port — or the same messages as OTLP/HTTP protobuf bodies on `POST /v1/traces`, served by
//! axum — keeping every span a `hostd serve` exports so a test can look at its traces.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// One received span, with ids as lower-case hex.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    /// The OTLP status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: String,
    /// The resource's attributes (service.name, service.instance.id, ...).
    pub resource: BTreeMap<String, String>,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Default)]
struct Sink {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Sink {
    /// Keeps every span of one export request.
    fn keep(&self, request: ExportTraceServiceRequest) {
        let mut got = Vec::new();
        for rs in request.resource_spans {
            let resource = rs
                .resource
                .as_ref()
                .map(|r| attrs(&r.attributes))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Span {
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        name: s.name.clone(),
                        attributes: attrs(&s.attributes),
                        status_code: s.status.as_ref().map(|st| st.code).unwrap_or(0),
                        status_message: s
                            .status
                            .as_ref()
                            .map(|st| st.message.clone())
                            .unwrap_or_default(),
                        resource: resource.clone(),
                    });
                }
            }
        }
        self.spans.lock().expect("the span list").extend(got);
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.keep(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// OTLP/HTTP: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` body, answered
/// with a protobuf `ExportTraceServiceResponse` (an undecodable body is a 400).
async fn http_export(
    axum::extract::State(sink): axum::extract::State<Sink>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use prost::Message;
    let protobuf = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    if !protobuf {
        return (
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "protobuf only",
        )
            .into_response();
    }
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            sink.keep(request);
            let reply = ExportTraceServiceResponse {
                partial_success: None,
            };
            (
                [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                reply.encode_to_vec(),
            )
                .into_response()
        }
        Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// A running collector; it stops when dropped.
pub struct Collector {
    pub addr: SocketAddr,
    sink: Sink,
    stop: Option<oneshot::Sender<()>>,
}

/// A collector at `addr` whose server `serve` (given the sink it records into and the signal
/// to stop on) runs on the current tokio runtime until the collector stops.
fn serving<F, Fut>(addr: SocketAddr, serve: F) -> Collector
where
    F: FnOnce(Sink, oneshot::Receiver<()>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sink = Sink::default();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve(sink.clone(), stopped));
    Collector {
        addr,
        sink,
        stop: Some(stop),
    }
}

impl Collector {
    /// Serves on a free port of 127.0.0.1 (on the current tokio runtime).
    pub fn start() -> Collector {
        Collector::start_on(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves on `addr` (to bring a collector back on the port a Host was given).
    pub fn start_on(addr: SocketAddr) -> Collector {
        let incoming = TcpIncoming::bind(addr).expect("the collector binds");
        let addr = incoming.local_addr().expect("the collector's address");
        serving(addr, |sink, stopped| async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        })
    }

    /// Serves OTLP/HTTP (protobuf) on a free port of 127.0.0.1 (on the current tokio runtime).
    pub fn start_http() -> Collector {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("the collector binds");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the collector's address");
        let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
        serving(addr, |sink, stopped| async move {
            let app = axum::Router::new()
                .route("/v1/traces", axum::routing::post(http_export))
                .with_state(sink);
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        })
    }

    /// The endpoint to give `--otlp-endpoint` (for OTLP/HTTP, the base `/v1/traces` is added to).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.sink.spans.lock().expect("the span list").clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A fresh, valid W3C traceparent (random ids, sampled) and its trace id.
pub fn traceparent() -> (String, String) {
    let trace: [u8; 16] = rand::random();
    let mut parent: [u8; 8] = rand::random();
    parent[0] |= 1;
    let trace_id = hex(&trace);
    (format!("00-{trace_id}-{}-01", hex(&parent)), trace_id)
}
