//! The gRPC service of the `examples/flow` workspace. It serves the standard
//! `grpc.health.v1.Health` service (via tonic-health, no protoc needed), reports NOT_SERVING
//! while it "warms up" and SERVING afterwards, and on SIGTERM turns NOT_SERVING and drains.
//!
//! It owns nothing but its own listener; it must never read anything but its environment:
//! `PORT` (set by the flow for a single-endpoint service) and `WARMUP` (e.g. `1500ms`).

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tonic_health::ServingStatus;

fn warmup() -> Duration {
    let Ok(text) = std::env::var("WARMUP") else {
        return Duration::from_millis(1500);
    };
    let text = text.trim();
    let (number, scale) = match text.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1000),
    };
    number
        .parse::<u64>()
        .map(|n| Duration::from_millis(n * scale))
        .unwrap_or(Duration::from_millis(1500))
}

#[tokio::main]
async fn main() -> ExitCode {
    let port: u16 = match std::env::var("PORT").ok().and_then(|p| p.parse().ok()) {
        Some(p) => p,
        None => {
            eprintln!("greeter: PORT is not set (run me through `hostd flow up`)");
            return ExitCode::from(2);
        }
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;

    let warm = warmup();
    let warming = reporter.clone();
    tokio::spawn(async move {
        tokio::time::sleep(warm).await;
        warming.set_service_status("", ServingStatus::Serving).await;
        println!("health: SERVING");
    });

    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("greeter: cannot listen for SIGTERM: {e}");
            return ExitCode::from(1);
        }
    };
    let draining = reporter.clone();
    let shutdown = async move {
        term.recv().await;
        draining
            .set_service_status("", ServingStatus::NotServing)
            .await;
        println!("SIGTERM: NOT_SERVING, draining");
    };
    println!("greeter: gRPC on {addr}, warming up for {warm:?}");
    match tonic::transport::Server::builder()
        .add_service(health)
        .serve_with_shutdown(addr, shutdown)
        .await
    {
        Ok(()) => {
            println!("greeter: stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("greeter: {e}");
            ExitCode::from(1)
        }
    }
}
