//! Readiness: the named predicates a started service must pass before it counts as running
//! (lifecycle, runner, tcp-connect, http-status, grpc-health, listener), and the wait that
//! retries them under a deadline, each pause paced by the time already waited.
//!
//! This module owns probing and the verdict. It must never signal or restart a process, and
//! it must never invent a health contract: an http endpoint without a declared health path is
//! probed for TCP reachability only, never by fetching `/`.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::manifest::{Api, ServiceManifest};
use crate::ports::PortMap;
use crate::predicate::{Predicate, ReadinessFailure};
use crate::process::ExitInfo;
use crate::sockets;

/// How one endpoint is probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Tcp(SocketAddr),
    /// `tls`: the endpoint is declared `tls: true`, so the request goes inside TLS.
    Http {
        addr: SocketAddr,
        path: String,
        tls: bool,
    },
    /// `service`: the declared gRPC service whose status is asked; `None` asks the server as
    /// a whole (`""`).
    Grpc {
        addr: SocketAddr,
        tls: bool,
        service: Option<String>,
    },
}

impl Probe {
    pub fn predicate(&self) -> Predicate {
        match self {
            Probe::Tcp(_) => Predicate::TcpConnect,
            Probe::Http { .. } => Predicate::HttpStatus,
            Probe::Grpc { .. } => Predicate::GrpcHealth,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Probe::Tcp(addr) | Probe::Http { addr, .. } | Probe::Grpc { addr, .. } => *addr,
        }
    }

    /// Runs the probe once, bounded by `timeout`.
    pub async fn run(&self, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, self.run_unbounded(timeout)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            )),
        }
    }

    async fn run_unbounded(&self, timeout: Duration) -> Result<(), String> {
        match self {
            Probe::Tcp(addr) => TcpStream::connect(addr)
                .await
                .map(drop)
                .map_err(|e| format!("connect {addr}: {e}")),
            Probe::Http { addr, path, tls } => probe_http(*addr, path, *tls).await,
            Probe::Grpc { addr, tls, service } => {
                probe_grpc(*addr, *tls, service.as_deref(), timeout).await
            }
        }
    }
}

async fn http_request(
    addr: SocketAddr,
    path: &str,
    method: Method,
    tls: bool,
) -> Result<StatusCode, String> {
    if tls {
        let stream = crate::tls::connect(addr, crate::tls::Alpn::Http1).await?;
        send_http(TokioIo::new(stream), addr, path, method).await
    } else {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        send_http(TokioIo::new(stream), addr, path, method).await
    }
}

async fn send_http<T>(
    io: T,
    addr: SocketAddr,
    path: &str,
    method: Method,
) -> Result<StatusCode, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::USER_AGENT, "hostd-flow-readiness")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("cannot build the request for {path}: {e}"))?;
    let result = sender
        .send_request(request)
        .await
        .map(|response| response.status())
        .map_err(|e| format!("{method} {path} on {addr}: {e}"));
    driver.abort();
    result
}

/// HEAD the health path (GET when HEAD is not supported); redirects are not followed and
/// count as an answer; a 5xx is a failure.
async fn probe_http(addr: SocketAddr, path: &str, tls: bool) -> Result<(), String> {
    let mut method = Method::HEAD;
    let mut status = http_request(addr, path, Method::HEAD, tls).await?;
    if status == StatusCode::METHOD_NOT_ALLOWED || status == StatusCode::NOT_IMPLEMENTED {
        method = Method::GET;
        status = http_request(addr, path, Method::GET, tls).await?;
    }
    if status.is_server_error() {
        return Err(format!("{method} {path} answered {status}"));
    }
    Ok(())
}

/// Asks the standard `grpc.health.v1.Health/Check` for the declared `service`, or for the
/// server as a whole (`""`) when none is declared. A declared service the server does not know
/// (`NotFound`) is not ready. A server without the health service (`Unimplemented`) is ready
/// once its transport answers: there is nothing else to ask. With `tls`, the connection is
/// TLS (HTTP/2 by ALPN) and the URI's scheme is left alone.
async fn probe_grpc(
    addr: SocketAddr,
    tls: bool,
    service: Option<&str>,
    timeout: Duration,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad address {addr}: {e}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let connected = if tls {
        endpoint
            .connect_with_connector(crate::tls::GrpcTlsConnector { addr })
            .await
    } else {
        endpoint.connect().await
    };
    let channel = connected.map_err(|e| format!("connect {addr}: {}", error_chain(&e)))?;
    let mut client = HealthClient::new(channel);
    match client
        .check(HealthCheckRequest {
            service: service.unwrap_or_default().to_owned(),
        })
        .await
    {
        Ok(response) => {
            let status = response.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                Ok(())
            } else {
                let name = ServingStatus::try_from(status)
                    .map(|s| s.as_str_name().to_owned())
                    .unwrap_or_else(|_| format!("status {status}"));
                Err(format!(
                    "grpc.health.v1 on {addr} reports {name}{}",
                    asked(service)
                ))
            }
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(()),
        Err(status) => Err(format!(
            "grpc.health.v1 on {addr}{}: {:?}: {}",
            asked(service),
            status.code(),
            status.message()
        )),
    }
}

/// Which service a gRPC health answer is about, for the failure text.
fn asked(service: Option<&str>) -> String {
    service
        .map(|s| format!(" for service `{s}`"))
        .unwrap_or_default()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        // Layered errors often repeat their source's text; say each part once.
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// A requirement of one service, in the order they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub endpoint: Option<String>,
    pub probe: Probe,
}

/// The readiness gate of one start of one service.
#[derive(Debug, Clone)]
pub struct ReadinessGate {
    pub service: String,
    /// Endpoint probes, in declaration order.
    pub endpoints: Vec<Requirement>,
    /// The started process's exit, if it has exited.
    pub exit: watch::Receiver<Option<ExitInfo>>,
    /// The service's process group: once a probe passes, the socket that answered must be
    /// held by a member of it (`listener`). `None` skips that check.
    pub owner_group: Option<i32>,
}

/// The pauses between readiness rounds (see [`ReadinessGate::wait`]): a quarter of the time
/// waited so far, within `initial..=max`. Not a doubling backoff between retries (that is
/// `timing::Backoff`): the pause grows with the wait, not with the number of rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePacing {
    pub initial: Duration,
    pub max: Duration,
}

impl ReadinessGate {
    /// The gate for `service` as allocated in `ports`.
    pub fn for_service(
        service: &ServiceManifest,
        ports: &PortMap,
        exit: watch::Receiver<Option<ExitInfo>>,
        owner_group: Option<i32>,
    ) -> ReadinessGate {
        let endpoints = service
            .endpoints
            .iter()
            .filter_map(|e| {
                let addr = ports.addr(&service.name, &e.name)?;
                let probe = match (e.api, &e.health) {
                    (Api::Grpc, service) => Probe::Grpc {
                        addr,
                        tls: e.tls,
                        service: service.clone(),
                    },
                    (Api::Http, Some(path)) => Probe::Http {
                        addr,
                        path: path.clone(),
                        tls: e.tls,
                    },
                    (Api::Http, None) | (Api::Tcp, _) => Probe::Tcp(addr),
                };
                Some(Requirement {
                    endpoint: Some(e.name.clone()),
                    probe,
                })
            })
            .collect();
        ReadinessGate {
            service: service.name.clone(),
            endpoints,
            exit,
            owner_group,
        }
    }

    fn failure(
        &self,
        endpoint: Option<String>,
        predicate: Predicate,
        last_error: String,
    ) -> ReadinessFailure {
        ReadinessFailure {
            service: self.service.clone(),
            endpoint,
            predicate,
            last_error,
        }
    }

    /// One round: every requirement in order; the first that fails is the answer. The
    /// lifecycle requirement holds by construction (a gate exists only for a started service).
    pub async fn check_once(&self, probe_timeout: Duration) -> Result<(), ReadinessFailure> {
        let exited = *self.exit.borrow();
        if let Some(exit) = exited {
            let clean_job_like = self.endpoints.is_empty() && exit.success();
            if !clean_job_like {
                return Err(self.failure(
                    None,
                    Predicate::Runner,
                    format!("the process exited with {exit} before it was ready"),
                ));
            }
        }
        for requirement in &self.endpoints {
            if let Err(e) = requirement.probe.run(probe_timeout).await {
                return Err(self.failure(
                    requirement.endpoint.clone(),
                    requirement.probe.predicate(),
                    e,
                ));
            }
            if let Some(pgid) = self.owner_group {
                let port = requirement.probe.addr().port();
                if let Err(e) = sockets::loopback_listener_owned_by_group(port, pgid) {
                    return Err(self.failure(requirement.endpoint.clone(), Predicate::Listener, e));
                }
            }
        }
        // A process that died during the probes is not ready, whatever the probes saw.
        if let Some(exit) = *self.exit.borrow()
            && !(self.endpoints.is_empty() && exit.success())
        {
            return Err(self.failure(
                None,
                Predicate::Runner,
                format!("the process exited with {exit} before it was ready"),
            ));
        }
        Ok(())
    }

    /// Retries rounds until all hold or `deadline` passes; at the deadline the first
    /// requirement that still fails is reported. The first round runs at once; each pause
    /// is a quarter of the time waited so far, at least `pacing.initial` and at most
    /// `pacing.max` (so a service ready after t is noticed by about 1.25 t, and a slow one
    /// is not polled more than a few dozen times). A dead process ends the wait at once with
    /// the `runner` predicate. `on_wait` sees every failed round.
    pub async fn wait(
        &self,
        deadline: Instant,
        pacing: ProbePacing,
        probe_timeout: Duration,
        mut on_wait: impl FnMut(&ReadinessFailure),
    ) -> Result<(), ReadinessFailure> {
        let began = Instant::now();
        let mut exit = self.exit.clone();
        loop {
            let failure = match self.check_once(probe_timeout).await {
                Ok(()) => return Ok(()),
                Err(f) => f,
            };
            if failure.predicate == Predicate::Runner {
                return Err(failure);
            }
            on_wait(&failure);
            let now = Instant::now();
            if now >= deadline {
                return Err(failure);
            }
            let pause = pacing.pause_after(now - began).min(deadline - now);
            // Wake early if the process exits: there is no point probing a dead service.
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = exit.changed() => {}
            }
        }
    }
}

impl ProbePacing {
    /// The pause after having waited `waited`: a quarter of it, within `initial..=max`.
    pub fn pause_after(&self, waited: Duration) -> Duration {
        (waited / 4).clamp(self.initial, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate_with(endpoints: Vec<Requirement>) -> (watch::Sender<Option<ExitInfo>>, ReadinessGate) {
        let (tx, rx) = watch::channel(None);
        (
            tx,
            ReadinessGate {
                service: "svc".into(),
                endpoints,
                exit: rx,
                owner_group: None,
            },
        )
    }

    #[tokio::test]
    async fn a_service_without_endpoints_is_ready_while_alive_and_after_a_clean_exit() {
        let (tx, gate) = gate_with(vec![]);
        gate.check_once(Duration::from_secs(1)).await.unwrap();
        tx.send(Some(ExitInfo {
            code: Some(0),
            signal: None,
        }))
        .unwrap();
        gate.check_once(Duration::from_secs(1)).await.unwrap();
        tx.send(Some(ExitInfo {
            code: Some(2),
            signal: None,
        }))
        .unwrap();
        let f = gate.check_once(Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(f.predicate, Predicate::Runner);
        assert!(f.last_error.contains("status 2"), "{f}");
    }

    #[test]
    fn each_pause_is_a_quarter_of_the_wait_so_far_within_its_bounds() {
        let b = ProbePacing {
            initial: Duration::from_millis(1),
            max: Duration::from_secs(5),
        };
        assert_eq!(b.pause_after(Duration::ZERO), Duration::from_millis(1));
        assert_eq!(
            b.pause_after(Duration::from_millis(40)),
            Duration::from_millis(10)
        );
        assert_eq!(
            b.pause_after(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_the_first_failing_requirement_is_reported_after_backing_off() {
        // A port nothing listens on: bind, take the number, close.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (_tx, gate) = gate_with(vec![Requirement {
            endpoint: Some("api".into()),
            probe: Probe::Tcp(addr),
        }]);
        let start = Instant::now();
        let mut rounds = 0;
        let failure = gate
            .wait(
                start + Duration::from_secs(6),
                ProbePacing {
                    initial: Duration::from_millis(150),
                    max: Duration::from_secs(1),
                },
                Duration::from_secs(1),
                |_| rounds += 1,
            )
            .await
            .unwrap_err();
        assert_eq!(failure.predicate, Predicate::TcpConnect);
        assert_eq!(failure.endpoint.as_deref(), Some("api"));
        assert!(
            failure
                .to_string()
                .starts_with("svc/api: tcp-connect failed: connect"),
            "{failure}"
        );
        // Rounds at 0, .15, .30, .45, .60, .75, .9375, 1.17, 1.46, 1.83, 2.29, 2.86, 3.58,
        // 4.47, 5.47, then clamped to the deadline at 6: sixteen rounds.
        assert_eq!(rounds, 16);
        assert!(Instant::now() >= start + Duration::from_secs(6));
    }
}
