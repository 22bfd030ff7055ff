//! `hostd token`: JWT connection tokens for operators and tests. `mint` signs one with a key
//! file (an HS256 secret or an RS256/ES256 private key); `inspect` shows a token's header and
//! claims without verifying anything, and says so. Never writes a token anywhere but stdout.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use hostlink::jwt::{JwtAlgorithm, SigningKey, decode_unverified, unix_now};
use serde_json::{Value, json};

use crate::output::Output;

/// JWT connection tokens: mint one, or inspect one without verifying it.
#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a JWT for a tenant, signed with a key file.
    Mint(MintArgs),
    /// Print a token's header and claims WITHOUT verifying its signature or any claim.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
struct MintArgs {
    /// The tenant the token acts for (its `tenant` claim).
    #[arg(long)]
    tenant: String,
    /// How long the token is valid (`exp` = now + this), e.g. 1h, 90s.
    #[arg(long, value_parser = duration)]
    ttl: Duration,
    /// The signing key: the HS256 secret file the credential line names, or a PEM private key
    /// for RS256/ES256.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// The signing algorithm: hs256, rs256 or es256.
    #[arg(long, default_value = "hs256", value_parser = algorithm)]
    alg: JwtAlgorithm,
    /// The principal (`sub`), recorded as the actor of what the link does.
    #[arg(long, default_value = "operator")]
    sub: String,
    /// The audience (`aud`), when the credential line checks one.
    #[arg(long)]
    aud: Option<String>,
    /// The issuer (`iss`), when the credential line checks one.
    #[arg(long)]
    iss: Option<String>,
    /// The key id (`kid` in the header), to pick a key of a JWKS.
    #[arg(long)]
    kid: Option<String>,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// The token; read from stdin when absent.
    token: Option<String>,
}

fn duration(s: &str) -> Result<Duration, String> {
    timing::duration_text::parse(s)
}

fn algorithm(s: &str) -> Result<JwtAlgorithm, String> {
    JwtAlgorithm::from_kind(&s.to_ascii_lowercase())
        .ok_or_else(|| "one of hs256, rs256, es256".to_owned())
}

pub async fn run(args: TokenArgs, out: Output) -> Result<ExitCode> {
    match args.command {
        TokenCommand::Mint(m) => mint(m, &out),
        TokenCommand::Inspect(i) => inspect(i, &out),
    }
}

fn mint(args: MintArgs, out: &Output) -> Result<ExitCode> {
    if args.ttl.is_zero() {
        bail!("--ttl must be positive");
    }
    let key = SigningKey::from_file(args.alg, &args.key, args.kid)?;
    let token = key.mint(
        &args.tenant,
        &args.sub,
        args.ttl.as_secs().max(1),
        args.aud.as_deref(),
        args.iss.as_deref(),
    )?;
    out.record(&token, || json!({"token": token}))?;
    Ok(ExitCode::SUCCESS)
}

/// `exp` as words relative to now.
fn expiry_words(claims: &Value, now: u64) -> String {
    match claims.get("exp").and_then(Value::as_u64) {
        None => "no exp: it never expires".into(),
        Some(exp) if exp > now => format!("expires in {}s", exp - now),
        Some(exp) => format!("expired {}s ago", now - exp),
    }
}

fn inspect(args: InspectArgs, out: &Output) -> Result<ExitCode> {
    let token = match args.token {
        Some(t) => t,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the token from stdin")?;
            text
        }
    };
    let read = decode_unverified(token.trim())?;
    let header: Value = serde_json::from_str(&read.header_json)?;
    let claims: Value = serde_json::from_str(&read.claims_json)?;
    let words = expiry_words(&claims, unix_now());
    out.note("NOT VERIFIED: the signature and the claims were not checked");
    out.record(
        format!(
            "header: {}\nclaims: {}\n{words}",
            serde_json::to_string_pretty(&header)?,
            serde_json::to_string_pretty(&claims)?
        ),
        || json!({"verified": false, "header": header, "claims": claims}),
    )?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_words_say_how_far_exp_is_either_way() {
        assert_eq!(expiry_words(&json!({"exp": 110}), 100), "expires in 10s");
        assert_eq!(expiry_words(&json!({"exp": 90}), 100), "expired 10s ago");
        assert_eq!(expiry_words(&json!({}), 100), "no exp: it never expires");
    }
}
