//! The one way to run a Host behind its listener: [`Host::builder`] takes a started
//! [`Service`] and everything served beside it (tenant credentials, HostLink bounds, listener
//! bounds, [`Extension`]s such as run hosting, extra routes such as the operator console, the
//! fleet reconciler), and [`HostBuilder::serve`] puts HostLink (`/hostlink/{tenant}`),
//! `/readyz`, `/healthz` and `/metrics` on a single axum server with `TCP_NODELAY`.
//!
//! This module owns the stop order, all of it. At the stop's first instant (SIGTERM) nothing
//! new is taken: new links get 503, `/readyz` answers 503 `draining`, attaches and binds are
//! refused `not_admitting`, and every extension refuses new work (`run.start`/`run.resume`
//! answer `not_admitting`). Then the session drain, the extensions' stops (run drivers: a
//! step in flight may finish within the grace, is stopped crash-equivalently then, nothing
//! written) and the reconciler's (it stops placing and gives its leadership back) run together
//! under the same deadlines while the listener still serves (so `drain_status` stays readable);
//! then the listener stops accepting, every WebSocket task is closed and waited for
//! (transports close last), and the Service stops and closes the store. The whole stop ends
//! within `drain_grace + 2 × idle_boundary`. `/healthz` stays 200 until that stop completes.
//! Nobody else stops any of these parts.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hostlink::auth::AuthVerifier;
use hostlink::codes::Disconnect;
use hostlink_server::{HostLinkHandle, LinkConfig, LinkOptions, hostlink_router};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::extension::{Extension, StopBounds};
use crate::link_backend::HostBackend;
use crate::listener::ListenerOptions;
use crate::release::{DrainFailure, DrainReport, steps};
use crate::service::Service;

/// Why a Host could not begin serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("listener options: {0}")]
    Options(crate::options::OptionsError),
    #[error("HostLink options: {0}")]
    Link(#[from] hostlink_server::LinkOptionsError),
    #[error("no tenant credentials: give the builder an AuthVerifier")]
    NoCredentials,
    #[error("fleet reconciler: {0}")]
    Reconciler(#[from] fleet::ReconcilerError),
}

impl ServerError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::Bind { .. } => "cannot_listen",
            ServerError::Options(e) => e.code.as_str(),
            ServerError::Link(_) => "invalid",
            ServerError::NoCredentials => "no_credentials",
            ServerError::Reconciler(e) => e.code(),
        }
    }
}

/// Where a Host listens: an address to bind, or a listener the caller bound already (to learn
/// the port before composing the Host's advertised endpoint).
pub enum Listen {
    Address(SocketAddr),
    Listener(TcpListener),
}

impl From<SocketAddr> for Listen {
    fn from(a: SocketAddr) -> Listen {
        Listen::Address(a)
    }
}

impl From<TcpListener> for Listen {
    fn from(l: TcpListener) -> Listen {
        Listen::Listener(l)
    }
}

/// Everything a Host serves, gathered before it serves. Made by [`Host::builder`].
pub struct HostBuilder {
    service: Service,
    auth: Option<Box<dyn AuthVerifier>>,
    link: Option<LinkConfig>,
    bounds: Option<ListenerOptions>,
    extensions: Vec<Arc<dyn Extension>>,
    routes: Router,
    reconciler: Option<fleet::ReconcilerOptions>,
}

/// A Host serving on its listener. [`Host::shutdown`] begins the stop; [`Host::wait`] waits
/// for it and returns the drain's report.
pub struct Host {
    local_addr: SocketAddr,
    service: Service,
    trigger: watch::Sender<Option<StopRequest>>,
    task: JoinHandle<DrainReport>,
    links: HostLinkHandle,
    extensions: Vec<Arc<dyn Extension>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Host {
    /// Starts describing a Host around `service` (built by [`crate::Composition::build`] and
    /// started). Tenant credentials are required ([`HostBuilder::auth`]); every other part
    /// has a default: HostLink and listener bounds at their defaults, no extension, no extra
    /// route, no reconciler.
    pub fn builder(service: Service) -> HostBuilder {
        HostBuilder {
            service,
            auth: None,
            link: None,
            bounds: None,
            extensions: Vec::new(),
            routes: Router::new(),
            reconciler: None,
        }
    }
}

impl HostBuilder {
    /// The tenant credentials every HostLink link is checked against.
    pub fn auth(mut self, auth: Box<dyn AuthVerifier>) -> HostBuilder {
        self.auth = Some(auth);
        self
    }

    /// HostLink's bounds, validated by the caller (so a bad bound is refused before the Host
    /// starts).
    pub fn link(mut self, link: LinkConfig) -> HostBuilder {
        self.link = Some(link);
        self
    }

    /// The listener's connection bounds; checked against the link's ping interval when the
    /// Host begins serving.
    pub fn listener_bounds(mut self, bounds: ListenerOptions) -> HostBuilder {
        self.bounds = Some(bounds);
        self
    }

    /// Hosts `extension`: its methods are served over HostLink, its capability advertised, it
    /// is booted when the Host serves, refuses new work from the stop's first instant and is
    /// stopped beside the session drain.
    pub fn extension(mut self, extension: Arc<dyn Extension>) -> HostBuilder {
        self.extensions.push(extension);
        self
    }

    /// Also serves `routes` on the same listener (the operator console): they answer beside
    /// HostLink and the probes, under the same connection bounds, and stop with them.
    pub fn routes(mut self, routes: Router) -> HostBuilder {
        self.routes = self.routes.merge(routes);
        self
    }

    /// Runs the fleet reconciler with `options` beside this Host, holding its leadership
    /// as this Host; it stops placing when the Host stops, beside the drain.
    pub fn reconciler(mut self, options: fleet::ReconcilerOptions) -> HostBuilder {
        self.reconciler = Some(options);
        self
    }

    /// The Service this Host serves.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// Begins serving on `listen`.
    pub async fn serve(self, listen: impl Into<Listen>) -> Result<Host, ServerError> {
        let HostBuilder {
            service,
            auth,
            link,
            bounds,
            extensions,
            routes,
            reconciler,
        } = self;
        let auth = auth.ok_or(ServerError::NoCredentials)?;
        let link = match link {
            Some(l) => l,
            None => LinkOptions::default().validate()?,
        };
        let bounds = bounds
            .unwrap_or_default()
            .validate(link.options().ping_interval)
            .map_err(ServerError::Options)?;
        let reconciler = match reconciler {
            Some(options) => {
                let holder = service.config().host_id.clone();
                Some(fleet::Reconciler::new(
                    service.store().clone(),
                    options,
                    holder.as_str(),
                )?)
            }
            None => None,
        };
        let listener = match listen.into() {
            Listen::Listener(l) => l,
            Listen::Address(addr) => TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })?,
        };
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        for e in &extensions {
            e.boot();
        }
        let auth: Arc<dyn AuthVerifier> = Arc::from(auth);
        // A service served a second time keeps the series of its first server.
        if let Err(e) = crate::metrics::CredentialRefusals::new(auth.clone())
            .and_then(|series| service.metrics().register(series))
        {
            tracing::debug!(error = %e, "credential refusals are not exported by this server");
        }
        let backend = Arc::new(
            HostBackend::new(service.clone(), Box::new(auth)).with_extensions(extensions.clone()),
        );
        let (hostlink, links) = hostlink_router(backend, link);
        let app = Router::new()
            .route("/readyz", get(readyz))
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .with_state(service.clone())
            .merge(hostlink)
            .merge(routes);
        let (trigger, triggered) = watch::channel(None);
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
        let placing = reconciler.map(|r| {
            let stop = CancellationToken::new();
            (stop.clone(), tokio::spawn(r.run(stop)))
        });
        let task = tokio::spawn(stop_in_order(StopParts {
            triggered,
            service: service.clone(),
            placing,
            extensions: extensions.clone(),
            listener_stop,
            server,
            links: links.clone(),
        }));
        Ok(Host {
            local_addr,
            service,
            trigger,
            task,
            links,
            extensions,
        })
    }
}

/// What the stop stops, in its order.
struct StopParts {
    triggered: watch::Receiver<Option<StopRequest>>,
    service: Service,
    placing: Option<(CancellationToken, JoinHandle<()>)>,
    extensions: Vec<Arc<dyn Extension>>,
    listener_stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    links: HostLinkHandle,
}

/// What began a stop: who asked for it, when the caller knows (recorded in the store as the
/// drain's requester).
#[derive(Clone, Debug)]
struct StopRequest {
    requested_by: Option<String>,
}

/// The Host's whole stop, once triggered. The one place that orders it.
async fn stop_in_order(mut p: StopParts) -> DrainReport {
    let requested_by = match p.triggered.wait_for(Option::is_some).await {
        Ok(r) => r.as_ref().and_then(|r| r.requested_by.clone()),
        Err(_) => None,
    };
    // `Host::shutdown` already did this at the trigger; repeated (idempotent) so the order
    // holds whoever triggered.
    stop_taking_new_work(&p.service, &p.extensions);
    let idle_boundary = p.service.config().idle_boundary;
    let drain_grace = p.service.config().drain_grace;
    tracing::info!(
        "stopping: draining sessions, stopping extensions and placement while the listener still serves"
    );
    // Everything below starts now and shares the drain's deadlines (see `release::drain`):
    // graceful until the grace, ended by grace + 1.5 idle boundaries. Nothing waits for
    // another part to stop first, so no part's slowness moves the others' deadlines.
    let begun = tokio::time::Instant::now();
    let bounds = StopBounds {
        graceful: begun + drain_grace,
        cut: begun + drain_grace + idle_boundary + idle_boundary / 2,
    };
    // Placement stops (and gives the leadership back, so another Host's reconciler places
    // the sessions given back here); a pass in flight finishes, within the cut.
    let placing = async {
        if let Some((stop, mut task)) = p.placing.take() {
            stop.cancel();
            if tokio::time::timeout_at(bounds.cut, &mut task)
                .await
                .is_err()
            {
                task.abort();
                tracing::warn!("the fleet reconciler did not stop within the stop bound; aborted");
            }
        }
    };
    let extensions = futures::future::join_all(p.extensions.iter().map(|e| e.shutdown(bounds)));
    // Who asked is recorded beside the drain, never before it, and within the drain's cut: a
    // slow store delays neither the drain nor the stop's tail.
    let recorded = async {
        if let Some(by) = &requested_by
            && tokio::time::timeout_at(bounds.cut, p.service.record_drain_request(by))
                .await
                .is_err()
        {
            tracing::warn!("who asked for the drain was not recorded within the stop bound");
        }
    };
    let (drained, _, _, _) = tokio::join!(p.service.drain(), extensions, placing, recorded);
    // The tail after the drain is bounded as a whole: links and listener get half of it, the
    // Service's stop (tasks, then the store) the rest.
    let tail = crate::release::stop_tail(idle_boundary);
    let tail_end = tokio::time::Instant::now() + tail;
    let _ = p.listener_stop.send(true);
    p.links.close_all(Disconnect::SHUTDOWN);
    let links_closed = tokio::time::timeout(tail / 2, p.links.wait()).await.is_ok();
    let _ = tokio::time::timeout_at(tokio::time::Instant::now() + tail / 4, p.server).await;
    let mut report = p
        .service
        .stop_within(tail_end.saturating_duration_since(tokio::time::Instant::now()))
        .await;
    if !links_closed {
        tracing::warn!(
            host_generation = drained.generation,
            step = steps::CLOSE_LINK,
            "some HostLink tasks did not finish within the stop bound"
        );
        report.failures.push(DrainFailure {
            session: None,
            step: steps::CLOSE_LINK,
            reason: format!("HostLink tasks still open after {:?}", tail / 2),
        });
    }
    report
}

/// The stop's first instant: the Service admits nothing and every extension refuses new
/// work. Neither waits.
fn stop_taking_new_work(service: &Service, extensions: &[Arc<dyn Extension>]) {
    service.stop_admitting();
    for e in extensions {
        e.begin_stop();
    }
}

impl Host {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The Service this Host serves.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// The HostLink handle (link counts, for observability and tests).
    pub fn links(&self) -> &HostLinkHandle {
        &self.links
    }

    /// Begins the stop (what SIGTERM does): from this instant new links are refused, `/readyz`
    /// answers 503 `draining`, and nothing new is admitted (sessions nor extension work);
    /// then the stop runs in its order. Idempotent. Records no requester: see
    /// [`Host::shutdown_by`].
    pub fn shutdown(&self) {
        self.begin_stop(None);
    }

    /// [`Host::shutdown`], asked by `requested_by` (an operator, or the signal that asked),
    /// who is recorded in the store as the drain's requester. The first request of a stop
    /// stands.
    pub fn shutdown_by(&self, requested_by: impl Into<String>) {
        self.begin_stop(Some(requested_by.into()));
    }

    fn begin_stop(&self, requested_by: Option<String>) {
        self.links.refuse_new_links();
        stop_taking_new_work(&self.service, &self.extensions);
        self.trigger.send_if_modified(|t| {
            if t.is_some() {
                return false;
            }
            *t = Some(StopRequest { requested_by });
            true
        });
    }

    /// Waits for the stop to complete and returns the drain's report.
    pub async fn wait(self) -> DrainReport {
        match self.task.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(step = steps::STOP, error = %e, "the stop task failed");
                let mut report = DrainReport::new(0);
                report.failures.push(DrainFailure {
                    session: None,
                    step: steps::STOP,
                    reason: e.to_string(),
                });
                report
            }
        }
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
