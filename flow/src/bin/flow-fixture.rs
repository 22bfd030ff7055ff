//! A service program for the flow tests and benchmark, run as a real process by a real flow.
//!
//! It owns nothing of the library: it only behaves as told by its flags, so a test can
//! declare "an HTTP service whose health path answers 503", "a gRPC server that turns
//! SERVING when a file appears", "a job that exits 3" or "a service that ignores SIGTERM".
//!
//! ```text
//! flow-fixture <mode> [flags]
//!   modes: tcp | http | grpc | grpc-bare | job | sleep | respawn-into
//!   --port-env VAR         the variable holding the port to listen on (default PORT)
//!   --health-status N      http: the status of the health path (default 200)
//!   --health-status-file F http: read the health status from F on every request
//!   --serve-when-file F    grpc: NOT_SERVING until F exists, then SERVING
//!   --service NAME         grpc: the server as a whole SERVING at once; NAME follows
//!                          --serve-when-file (NAME unknown to the server if never set)
//!   --exit N               job / after --exit-after: the exit status
//!   --exit-after DUR       exit with --exit after this long (e.g. 50ms)
//!   --ignore-sigterm       install a SIGTERM handler that ignores it
//!   --env-dump F           write every FLOW_* / APP_* variable to F at start
//!   --require-env VAR      connect to the address in VAR at start; exit 1 if it fails
//!   --count-starts F       append one line to F per start
//!   --say TEXT             print TEXT on stdout at start
//!   --child                spawn a `sleep` child in the same process group
//!   --bind HOST            the address to listen on (default 127.0.0.1)
//!   --bind-delay DUR       wait this long before binding
//!   --survive-bind-failure when the port is taken, say so and keep running
//!   --tls-cert F --tls-key F  http / grpc: serve TLS with this PEM certificate and key
//!   --group G              respawn-into: keep a `sleep` running in process group G
//!   --fail-once F          if F does not exist: create it and exit 1 at once
//! ```

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

struct Args {
    mode: String,
    flags: HashMap<String, String>,
    switches: Vec<String>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut it = std::env::args().skip(1);
        let mode = it.next().ok_or("missing mode")?;
        let mut flags = HashMap::new();
        let mut switches = Vec::new();
        while let Some(arg) = it.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument {arg}"));
            };
            if matches!(name, "ignore-sigterm" | "child" | "survive-bind-failure") {
                switches.push(name.to_owned());
            } else {
                let value = it.next().ok_or(format!("--{name} needs a value"))?;
                flags.insert(name.to_owned(), value);
            }
        }
        Ok(Args {
            mode,
            flags,
            switches,
        })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.flags.get(name).map(String::as_str)
    }

    fn has(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }

    fn port(&self) -> Result<u16, String> {
        let var = self.get("port-env").unwrap_or("PORT");
        std::env::var(var)
            .map_err(|_| format!("{var} is not set"))?
            .parse()
            .map_err(|e| format!("{var}: {e}"))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flow-fixture: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run() -> Result<ExitCode, String> {
    let args = Args::parse()?;
    if let Some(marker) = args.get("fail-once")
        && !std::path::Path::new(marker).exists()
    {
        std::fs::write(marker, b"failed once\n").map_err(|e| format!("{marker}: {e}"))?;
        eprintln!("failing on purpose, once");
        return Ok(ExitCode::from(1));
    }
    if let Some(text) = args.get("say") {
        println!("{text}");
    }
    if let Some(file) = args.get("count-starts") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .map_err(|e| format!("{file}: {e}"))?;
        writeln!(f, "start {}", std::process::id()).map_err(|e| e.to_string())?;
    }
    if let Some(file) = args.get("env-dump") {
        let mut lines: Vec<String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("FLOW_") || k.starts_with("APP_") || k == "PORT")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        lines.sort();
        std::fs::write(file, lines.join("\n") + "\n").map_err(|e| format!("{file}: {e}"))?;
    }
    if let Some(var) = args.get("require-env") {
        let addr = std::env::var(var).map_err(|_| format!("{var} is not set"))?;
        TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("producer at {var}={addr} is not reachable: {e}"))?;
        println!("reached {var}={addr}");
    }
    if args.has("child") {
        std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .map_err(|e| format!("cannot spawn the child: {e}"))?;
    }
    let mut sigterm = if args.has("ignore-sigterm") {
        Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let exit_code: u8 = args
        .get("exit")
        .map(|s| s.parse().unwrap_or(1))
        .unwrap_or(0);
    let exit_after = match args.get("exit-after") {
        Some(d) => Some(humantime::parse_duration(d).map_err(|e| e.to_string())?),
        None => None,
    };

    let server = async {
        match args.mode.as_str() {
            "tcp" => serve_tcp(&args).await,
            "http" => serve_http(&args).await,
            "grpc" => serve_grpc(&args, true).await,
            "grpc-bare" => serve_grpc(&args, false).await,
            "job" => {
                tokio::time::sleep(exit_after.unwrap_or(Duration::ZERO)).await;
                Ok(())
            }
            "sleep" => {
                futures::future::pending::<()>().await;
                Ok(())
            }
            "respawn-into" => respawn_into(&args).await,
            other => Err(format!("unknown mode {other}")),
        }
    };
    let ignore = async {
        if let Some(s) = sigterm.as_mut() {
            while s.recv().await.is_some() {
                println!("ignoring SIGTERM");
            }
        }
        futures::future::pending::<()>().await;
    };
    let timer = async {
        match exit_after {
            Some(d) => tokio::time::sleep(d).await,
            None => futures::future::pending().await,
        }
    };
    tokio::select! {
        r = server => r?,
        _ = ignore => {}
        _ = timer => {}
    }
    if exit_code != 0 {
        eprintln!("exiting with status {exit_code}");
    }
    Ok(ExitCode::from(exit_code))
}

/// Binds the port the flow handed over, on `--bind` (127.0.0.1 by default), after
/// `--bind-delay`. With `--survive-bind-failure` a taken port is reported and the process
/// keeps running without a listener: a service that does not notice it failed to bind.
async fn bind(args: &Args) -> Result<Option<TcpListener>, String> {
    let port = args.port()?;
    if let Some(delay) = args.get("bind-delay") {
        tokio::time::sleep(humantime::parse_duration(delay).map_err(|e| e.to_string())?).await;
    }
    let host = args.get("bind").unwrap_or("127.0.0.1");
    match TcpListener::bind((host, port)).await {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if args.has("survive-bind-failure") => {
            eprintln!("bind {host}:{port}: {e}; carrying on without a listener");
            Ok(None)
        }
        Err(e) => Err(format!("bind {host}:{port}: {e}")),
    }
}

async fn serve_tcp(args: &Args) -> Result<(), String> {
    let Some(listener) = bind(args).await? else {
        return futures::future::pending().await;
    };
    println!("listening on tcp {:?}", listener.local_addr());
    loop {
        let (mut stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = stream.write_all(b"hello\n").await;
        });
    }
}

/// The TLS server configuration from `--tls-cert` and `--tls-key`, offering `alpn`.
fn tls_acceptor(args: &Args, alpn: &[u8]) -> Result<Option<TlsAcceptor>, String> {
    let (Some(cert), Some(key)) = (args.get("tls-cert"), args.get("tls-key")) else {
        return Ok(None);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{cert}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{cert}: {e}"))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{key}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}

async fn serve_http(args: &Args) -> Result<(), String> {
    let Some(listener) = bind(args).await? else {
        return futures::future::pending().await;
    };
    let tls = tls_acceptor(args, b"http/1.1")?;
    println!(
        "listening on http{} {:?}",
        if tls.is_some() { "s" } else { "" },
        listener.local_addr()
    );
    let fixed: u16 = args
        .get("health-status")
        .map(|s| s.parse().unwrap_or(200))
        .unwrap_or(200);
    let status_file = args.get("health-status-file").map(PathBuf::from);
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let status_file = status_file.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let status = status_file
                .and_then(|f| std::fs::read_to_string(f).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(fixed);
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = answer_http(stream, status).await;
                    }
                }
                None => {
                    let _ = answer_http(stream, status).await;
                }
            }
        });
    }
}

async fn answer_http<S>(mut stream: S, health_status: u16) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("");
    let path = first.next().unwrap_or("/");
    let (status, body) = if path == "/healthz" {
        (health_status, "health\n".to_owned())
    } else {
        (
            200,
            format!(
                "hello from {}\n",
                std::env::var("FLOW_SERVICE").unwrap_or_default()
            ),
        )
    };
    let reason = match status {
        200 => "OK",
        302 => "Found",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if status == 302 {
        response.push_str("location: /elsewhere\r\n");
    }
    response.push_str("\r\n");
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

async fn serve_grpc(args: &Args, with_health: bool) -> Result<(), String> {
    let mut routes = tonic::service::Routes::default();
    if with_health {
        let (reporter, health) = tonic_health::server::health_reporter();
        // `--service NAME`: the server as a whole serves at once; only NAME waits for the file.
        let service = args.get("service").unwrap_or_default().to_owned();
        if !service.is_empty() {
            reporter
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
        }
        if let Some(file) = args.get("serve-when-file").map(PathBuf::from) {
            reporter
                .set_service_status(&service, tonic_health::ServingStatus::NotServing)
                .await;
            tokio::spawn(async move {
                while !file.exists() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                reporter
                    .set_service_status(&service, tonic_health::ServingStatus::Serving)
                    .await;
                println!("health: SERVING");
            });
        }
        routes = routes.add_service(health);
    }
    let Some(listener) = bind(args).await? else {
        return futures::future::pending().await;
    };
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tonic::transport::Server::builder().add_routes(routes);
    match tls_acceptor(args, b"h2")? {
        None => {
            println!("listening on grpc {addr}");
            server
                .serve_with_incoming(tokio_stream_of(listener))
                .await
                .map_err(|e| format!("grpc server: {e}"))
        }
        Some(acceptor) => {
            println!("listening on grpc+tls {addr}");
            let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<TlsConn>>(16);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let acceptor = acceptor.clone();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            let _ = tx.send(Ok(TlsConn(tls))).await;
                        }
                    });
                }
            });
            let incoming = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            server
                .serve_with_incoming(incoming)
                .await
                .map_err(|e| format!("grpc server: {e}"))
        }
    }
}

/// Accepted plain connections as the stream tonic serves.
fn tokio_stream_of(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let item = listener.accept().await.map(|(s, _)| s);
        Some((item, listener))
    })
}

/// A TLS connection tonic can serve.
struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for TlsConn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsConn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Keeps a `sleep` running in process group `--group`: whenever none of its children is
/// alive, it starts another one there. Something outside a group that keeps repopulating
/// it, which no signal to the group alone can empty.
async fn respawn_into(args: &Args) -> Result<(), String> {
    let group: i32 = args
        .get("group")
        .ok_or("--group is required")?
        .parse()
        .map_err(|e| format!("--group: {e}"))?;
    let mut children: Vec<std::process::Child> = Vec::new();
    loop {
        children.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        if children.is_empty() {
            let child = std::process::Command::new("sleep")
                .arg("300")
                .process_group(group)
                .spawn()
                .map_err(|e| format!("cannot start a sleep in group {group}: {e}"))?;
            children.push(child);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
