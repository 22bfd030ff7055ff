//! `hostd serve` as a real child process with JWT tenant credentials: `hostd token mint` makes
//! a token the official JavaScript SDK connects with, `hostd token inspect` reads it back and
//! says it verified nothing, a broken credentials file is refused with its line number while
//! the old one stays in force, and SIGHUP (or an edit) puts a new key in force: the old token
//! is refused from then on and counted in /metrics.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::process::{Serve, hostd_run, http_get, ok};
use tokio::io::{AsyncBufReadExt, BufReader};

/// What the SDK's link reported first: `connected`, or the code it was ended with.
async fn sdk_link(port: u16, tenant: &str, token: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/jwt_hold.mjs");
    assert!(
        script
            .with_file_name("node_modules")
            .join("centrifuge")
            .is_dir(),
        "the SDK is not installed: run `npm ci` in tests/sdk (.ci/run does)"
    );
    let mut child = tokio::process::Command::new("node")
        .arg(script)
        .args([&format!("ws://127.0.0.1:{port}/hostlink/{tenant}"), token])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("the SDK said something in time")
            .unwrap()
            .expect("the SDK script printed an event");
        let event: Value = serde_json::from_str(&line).unwrap();
        if event["event"] != "client_error" {
            return event;
        }
    }
}

fn mint(dir: &Path, key: &str) -> String {
    ok(hostd_run(
        dir,
        &[
            "token", "mint", "--tenant", "acme", "--ttl", "1h", "--key", key, "--aud", "hostlink",
            "--sub", "alice",
        ],
        &[],
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostd_serve_takes_minted_jwts_keeps_its_credentials_through_a_broken_edit_and_rotates_on_sighup()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::write(
        dir.join("one.secret"),
        "the first secret of this Host's tenant\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("two.secret"),
        "the second secret of this Host's tenant\n",
    )
    .unwrap();
    let creds = dir.join("credentials");
    std::fs::write(&creds, "acme jwt hs256 one.secret aud=hostlink\n").unwrap();
    let serve = Serve::start(
        dir,
        "jwt-host",
        &[
            "--data-dir",
            ".hostd",
            "--host-id",
            "jwt-host",
            "--credentials-file",
            creds.to_str().unwrap(),
        ],
    );

    let first = mint(dir, "one.secret");
    let inspected = hostd_run(dir, &["token", "inspect", &first], &[]);
    let stdout = ok(inspected.clone());
    assert!(stdout.contains(r#""tenant": "acme""#), "{stdout}");
    assert!(stdout.contains(r#""sub": "alice""#), "{stdout}");
    assert!(stdout.contains("expires in"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&inspected.stderr).contains("NOT VERIFIED"),
        "inspect says it verified nothing"
    );
    assert_eq!(
        sdk_link(serve.port, "acme", &first).await["event"],
        "connected"
    );

    // A broken edit is refused with its line number; the credentials in force stay.
    std::fs::write(
        &creds,
        "acme jwt hs256 one.secret aud=hostlink\nbeta nonsense\n",
    )
    .unwrap();
    serve.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    eventually_blocking("the broken file to be refused", || {
        let log = serve.log_text();
        if log.contains("were refused") && log.contains("entry 2") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert_eq!(http_get(serve.port, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(
        sdk_link(serve.port, "acme", &first).await["event"],
        "connected"
    );

    // SIGHUP after the rotation to the second secret: the first token is refused from then on.
    std::fs::write(&creds, "acme jwt hs256 two.secret aud=hostlink\n").unwrap();
    serve.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    eventually_blocking("the new credentials to be in force", || {
        let log = serve.log_text();
        if log.contains("SIGHUP") && log.contains("tenant credentials reloaded") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let refused = sdk_link(serve.port, "acme", &first).await;
    assert_eq!(
        (&refused["event"], &refused["code"]),
        (&"disconnected".into(), &4500.into())
    );
    let second = mint(dir, "two.secret");
    assert_eq!(
        sdk_link(serve.port, "acme", &second).await["event"],
        "connected"
    );
    let (_, metrics) = http_get(serve.port, "/metrics").expect("/metrics answers");
    // At least the refused connect (a link still open at the rotation is checked again and
    // counted too).
    let bad_signatures: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"host_link_credential_refusals_total{reason="bad_signature"} "#)
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(bad_signatures >= 1, "{metrics}");
    let (status, log) = serve.terminate();
    assert!(status.success(), "{log}");
    assert!(
        !log.contains(&first) && !log.contains(&second),
        "no token is logged"
    );
}
