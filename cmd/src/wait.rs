//! `hostd wait`: blocks until a Host is ready to take sessions, for scripts that start one
//! (`hostd serve &`) and go on at once. With the embedded default it waits for the data
//! folder's Host to record itself and answer `/readyz`; against a store URL it waits until the
//! registry holds a live Host that accepts sessions; given an `--endpoint`, until that Host
//! answers `/readyz`. It only reads: it never admits, places or writes anything.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use sessionstore::{Store, StoreOptions};

use crate::exit::CliError;
use crate::local::{LocalHost, readyz};
use crate::output::{Output, Progress};
use crate::reach::{HostLocation, wait_bound};

/// How long `hostd wait` waits, unless told otherwise.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// `hostd wait`'s own option.
#[derive(Clone, Debug, Default, Args)]
pub struct WaitFlags {
    /// How long to wait for a Host to be ready before giving up [default: 30s].
    #[arg(long = "timeout", env = "HOST_WAIT_TIMEOUT", value_parser = wait_bound, value_name = "DURATION")]
    pub timeout: Option<Duration>,
}

impl WaitFlags {
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT)
    }
}

/// Wait until a Host is ready to take sessions (exit 0), or give up after --timeout (exit 1,
/// code `host_not_ready`).
#[derive(Debug, Args)]
#[command(
    after_help = "In a script: `hostd serve & hostd wait && S=$(hostd session create)`. (`hostd \
session` commands also wait up to --wait-for-host for a local Host that is starting.)"
)]
pub struct WaitArgs {
    #[command(flatten)]
    location: HostLocation,
    #[command(flatten)]
    wait: WaitFlags,
}

/// A Host found ready.
struct Ready {
    /// Its id, when the data folder or the registry names it.
    host: Option<String>,
    endpoint: String,
}

pub async fn run(args: WaitArgs, out: Output) -> Result<ExitCode> {
    let bound = args.wait.timeout();
    let deadline = tokio::time::Instant::now() + bound;
    let mut progress = Progress::new(&out, "waiting for a Host to be ready", bound);
    let mut store: Option<Store> = None;
    let mut last = String::from("nothing seen yet");
    loop {
        let location = &args.location;
        let seen = match (&location.endpoint, &location.store) {
            (Some(endpoint), _) => one(endpoint, &mut last).await,
            (None, Some(url)) => fleet(url, &mut store, &mut last).await,
            (None, None) => local(location, &mut last).await?,
        };
        if let Some(ready) = seen {
            drop(progress);
            let named = ready
                .host
                .as_deref()
                .map(|h| format!("Host {h}"))
                .unwrap_or_else(|| "the Host".to_owned());
            out.record(
                format_args!("ready: {named} at {}", ready.endpoint),
                || serde_json::json!({"ready": true, "host_id": ready.host, "endpoint": ready.endpoint}),
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CliError::refused(
                "host_not_ready",
                format!(
                    "no Host was ready within {} ({last})",
                    humantime::format_duration(bound)
                ),
            )
            .into());
        }
        progress.tick();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The one Host at `endpoint`, ready when its `/readyz` answers 200.
async fn one(endpoint: &str, last: &mut String) -> Option<Ready> {
    match readyz(endpoint).await {
        Some(200) => Some(Ready {
            host: None,
            endpoint: endpoint.to_owned(),
        }),
        Some(status) => {
            *last = format!("the Host at {endpoint} answers /readyz with {status}");
            None
        }
        None => {
            *last = format!("nothing answers /readyz at {endpoint}");
            None
        }
    }
}

async fn local(location: &HostLocation, last: &mut String) -> Result<Option<Ready>> {
    let data = location.data();
    Ok(match data.probe().await? {
        LocalHost::Ready(r) => Some(Ready {
            host: Some(r.host_id),
            endpoint: r.endpoint,
        }),
        LocalHost::Gone(r) => {
            *last = format!(
                "the Host {} recorded in {} (pid {}) is not running",
                r.host_id,
                data.root.display(),
                r.pid
            );
            None
        }
        LocalHost::NotReady(Some(r)) => {
            *last = format!("the Host {} is starting", r.host_id);
            None
        }
        LocalHost::NotReady(None) => {
            *last = format!(
                "no Host has recorded itself in {} (is `hostd serve` running there?)",
                data.root.display()
            );
            None
        }
    })
}

async fn fleet(url: &str, store: &mut Option<Store>, last: &mut String) -> Option<Ready> {
    if store.is_none() {
        match Store::open(StoreOptions::new(url.to_owned())).await {
            Ok(s) => *store = Some(s),
            Err(e) => {
                *last = format!("the store does not open: {e}");
                return None;
            }
        }
    }
    let s = store.as_ref()?;
    let found = async {
        let now = s.now_ms().await?;
        Ok::<_, sessionstore::StoreError>(
            s.targets(true)
                .await?
                .into_iter()
                .find(|t| t.accepting && t.is_live(now)),
        )
    };
    match found.await {
        Ok(Some(t)) => Some(Ready {
            host: Some(t.host.to_string()),
            endpoint: t.endpoint,
        }),
        Ok(None) => {
            *last = "no live Host accepting sessions in the registry".into();
            None
        }
        Err(e) => {
            *last = format!("reading the registry: {e}");
            None
        }
    }
}
