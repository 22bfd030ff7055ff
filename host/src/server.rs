//! The Host's one listener: HostLink (`/hostlink/{tenant}`), `/readyz`, `/healthz` and
//! `/metrics` on a single axum server with `TCP_NODELAY`. Owns the stop order: the drain runs
//! while the listener still serves (so `drain_status` stays readable and `/readyz` answers
//! 503 from its first instant), then the listener stops accepting, then every WebSocket task
//! is closed and waited for (transports close last), then the Service stops and closes the
//! store. `/healthz` stays 200 until that stop completes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::link::options::LinkConfig;
use crate::link::{HostLinkHandle, hostlink_router};
use crate::link_backend::HostBackend;
use crate::listener::ListenerOptions;
use crate::release::DrainReport;
use crate::service::Service;
use hostlink::auth::AuthVerifier;
use hostlink::codes::Disconnect;

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("listener options: {0}")]
    Options(crate::options::OptionsError),
}

/// A running listener.
pub struct Server {
    local_addr: SocketAddr,
    trigger: watch::Sender<bool>,
    task: JoinHandle<DrainReport>,
    links: HostLinkHandle,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

/// True when the request asks for JSON (`Accept: application/json`).
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            let m = m.split(';').next().unwrap_or_default().trim();
            m.eq_ignore_ascii_case("application/json")
        })
}

/// 200 when the Host can do its work, 503 otherwise, with every reason: a line of text, or
/// `{"ready":…,"reasons":[{"code":…,"detail":…}]}` on `Accept: application/json`.
async fn readyz(State(s): State<Service>, headers: HeaderMap) -> Response {
    let report = s.readiness();
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if wants_json(&headers) {
        match serde_json::to_string(&report) {
            Ok(body) => {
                (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Err(_) => (status, report.text()).into_response(),
        }
    } else {
        (status, report.text()).into_response()
    }
}

async fn healthz(State(s): State<Service>) -> Response {
    if s.live() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "stopped\n").into_response()
    }
}

async fn metrics(State(s): State<Service>) -> Response {
    let m = s.metrics();
    ([(header::CONTENT_TYPE, m.content_type())], m.render()).into_response()
}

impl Server {
    /// Starts serving `service` (already started) on `listen`, every HostLink link under
    /// `link` (validated by the caller, so a bad bound is refused before the Host starts).
    pub async fn bind(
        service: Service,
        auth: Box<dyn AuthVerifier>,
        link: LinkConfig,
        listen: SocketAddr,
    ) -> Result<Server, ServerError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: listen,
                source,
            })?;
        Server::from_listener(service, auth, link, listener).await
    }

    /// As [`Server::bind`], on a listener the caller already bound (so it can learn the port
    /// before composing the Host's advertised endpoint), with the listener's default bounds.
    pub async fn from_listener(
        service: Service,
        auth: Box<dyn AuthVerifier>,
        link: LinkConfig,
        listener: TcpListener,
    ) -> Result<Server, ServerError> {
        Server::with_runs(service, auth, link, listener, None).await
    }

    /// As [`Server::from_listener`], also hosting workflow runs with `runs` (booted here; its
    /// drivers stop first when the Host stops), with the listener's default bounds.
    pub async fn with_runs(
        service: Service,
        auth: Box<dyn AuthVerifier>,
        link: LinkConfig,
        listener: TcpListener,
        runs: Option<crate::runs::RunHost>,
    ) -> Result<Server, ServerError> {
        let bounds = ListenerOptions::default()
            .validate(link.options().ping_interval)
            .map_err(ServerError::Options)?;
        Server::from_listener_with(service, auth, link, bounds, listener, runs).await
    }

    /// As [`Server::with_runs`], under the connection bounds `bounds` (validated by the caller
    /// against the link's ping interval).
    pub async fn from_listener_with(
        service: Service,
        auth: Box<dyn AuthVerifier>,
        link: LinkConfig,
        bounds: ListenerOptions,
        listener: TcpListener,
        runs: Option<crate::runs::RunHost>,
    ) -> Result<Server, ServerError> {
        Server::from_listener_with_routes(
            service,
            auth,
            link,
            bounds,
            listener,
            runs,
            Router::new(),
        )
        .await
    }

    /// As [`Server::from_listener_with`], also serving `extra` on the same listener (the
    /// operator console): its routes answer beside HostLink and the probes, under the same
    /// connection bounds, and stop with them.
    pub async fn from_listener_with_routes(
        service: Service,
        auth: Box<dyn AuthVerifier>,
        link: LinkConfig,
        bounds: ListenerOptions,
        listener: TcpListener,
        runs: Option<crate::runs::RunHost>,
        extra: Router,
    ) -> Result<Server, ServerError> {
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        if let Some(r) = &runs {
            r.boot();
        }
        let backend = Arc::new(HostBackend::new(service.clone(), auth).with_runs(runs.clone()));
        let (hostlink, links) = hostlink_router(backend, link);
        let app = Router::new()
            .route("/readyz", get(readyz))
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .with_state(service.clone())
            .merge(hostlink)
            .merge(extra);
        let (trigger, mut triggered) = watch::channel(false);
        let (listener_stop, listener_stopped) = watch::channel(false);
        let server = tokio::spawn(crate::listener::serve(
            listener,
            app,
            bounds,
            service.metrics().clone(),
            listener_stopped,
            // Open HTTP requests get a quarter of the stop's tail to finish.
            crate::release::stop_tail(service.config().idle_boundary) / 4,
        ));
        let links_for_stop = links.clone();
        let task = tokio::spawn(async move {
            let _ = triggered.wait_for(|t| *t).await;
            tracing::info!("stopping: draining while the listener still serves");
            if let Some(r) = &runs {
                // Run drivers stop crash-equivalently (nothing written) before the store closes.
                r.shutdown(service.config().idle_boundary).await;
            }
            let drained = service.drain().await;
            // The tail after the drain is bounded as a whole: links and listener get half of
            // it, the Service's stop (tasks, then the store) the rest.
            let tail = crate::release::stop_tail(service.config().idle_boundary);
            let tail_end = tokio::time::Instant::now() + tail;
            let _ = listener_stop.send(true);
            links_for_stop.close_all(Disconnect::SHUTDOWN);
            let links_closed = tokio::time::timeout(tail / 2, links_for_stop.wait())
                .await
                .is_ok();
            let _ = tokio::time::timeout_at(tokio::time::Instant::now() + tail / 4, server).await;
            let mut report = service
                .stop_within(tail_end.saturating_duration_since(tokio::time::Instant::now()))
                .await;
            if !links_closed {
                tracing::warn!(
                    host_generation = drained.generation,
                    step = crate::release::steps::CLOSE_LINK,
                    "some HostLink tasks did not finish within the stop bound"
                );
                report.failures.push(crate::release::DrainFailure {
                    session: None,
                    step: crate::release::steps::CLOSE_LINK,
                    reason: format!("HostLink tasks still open after {:?}", tail / 2),
                });
            }
            report
        });
        Ok(Server {
            local_addr,
            trigger,
            task,
            links,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The HostLink handle (link counts, for observability and tests).
    pub fn links(&self) -> &HostLinkHandle {
        &self.links
    }

    /// Begins the stop (what SIGTERM does): new links are refused from this instant, then
    /// the drain runs. Idempotent.
    pub fn shutdown(&self) {
        self.links.refuse_new_links();
        let _ = self.trigger.send(true);
    }

    /// Waits for the stop to complete and returns the drain's report.
    pub async fn wait(self) -> DrainReport {
        match self.task.await {
            Ok(r) => r,
            Err(e) => {
                let mut report = DrainReport::new(0);
                report.failures.push(crate::release::DrainFailure {
                    session: None,
                    step: crate::release::steps::STOP,
                    reason: e.to_string(),
                });
                report
            }
        }
    }
}
