//! TLS for readiness probes of endpoints declared `tls: true`: a client handshake over a
//! loopback TCP connection, offering HTTP/2 (gRPC) or HTTP/1.1 by ALPN.
//!
//! This module owns the client configuration only. It must never be used to carry anything
//! but a readiness probe: it accepts whatever certificate the endpoint presents (signatures in
//! the handshake are still checked). The peer's identity is proven another way — the
//! `listener` predicate checks that the socket answering on the port is held by the
//! service's own process group — so a certificate chain would prove nothing more for a
//! process this flow started on loopback, and a development certificate is rarely anchored
//! in any store the flow could read.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{self, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, ClientConfig, DigitallySignedStruct, SignatureScheme};

/// Which application protocol the probe speaks inside TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    Http2,
    Http1,
}

#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn connector(alpn: Alpn) -> Result<TlsConnector, String> {
    let provider = Arc::new(crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![match alpn {
        Alpn::Http2 => b"h2".to_vec(),
        Alpn::Http1 => b"http/1.1".to_vec(),
    }];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Connects to `addr` and completes a TLS handshake.
pub async fn connect(addr: SocketAddr, alpn: Alpn) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let name = ServerName::IpAddress(addr.ip().into());
    connector(alpn)?
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))
}

/// A connector for tonic's channel: every connection is a TLS connection to one address,
/// whatever the request URI says.
#[derive(Debug, Clone, Copy)]
pub struct GrpcTlsConnector {
    pub addr: SocketAddr,
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<TlsStream<TcpStream>>, String>> + Send>>;

impl tonic::codegen::Service<hyper::Uri> for GrpcTlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Self::Future {
        let addr = self.addr;
        let connecting: Connecting =
            Box::pin(async move { connect(addr, Alpn::Http2).await.map(TokioIo::new) });
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}
