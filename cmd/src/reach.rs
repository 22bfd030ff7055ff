//! How every client command reaches its Host or its store. Owns the one declaration of the
//! location flags — [`HostLocation`] (`--data-dir`, `--store`, `--endpoint`), [`TenantFlags`]
//! (`--tenant`, `--token`) and [`LinkFlags`] (the HostLink client's timeouts) — that `session`,
//! `run`, `runnable publish`, `hosts`, `controller` and `wait` flatten, and the one reading of
//! them: the store a command opens ([`HostLocation::store_url`]), the tenant and token it acts
//! as ([`TenantFlags`]), and, for a command that dials a Host ([`Dialer`]), which Host: the
//! explicit endpoint, else a live Host of the store's registry that serves the capability (a
//! preferred one first), else the Host the data folder records.
//!
//! The data folder is the default everywhere; `--store` reaches a fleet through its registry;
//! `--endpoint` names one Host. A command that reads the store itself refuses an `--endpoint`
//! given without `--store` (a Host is not a store), rather than quietly using the data
//! folder's. This module reads the registry and the data folder only: it never admits, places
//! or writes anything, and never prints.

use std::cmp::Reverse;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use controller::client::{ClientError, ClientOptions, HostLinkClient};
use sessionstore::{HostTarget, Store, StoreOptions, TenantId};

use crate::exit::CliError;
use crate::local::{DEFAULT_DATA_DIR, DataDir, LOCAL_TENANT, Runtime};

/// Where a client command finds its Host and store. Every family that reaches a Host or a
/// store flattens this one declaration.
#[derive(Clone, Debug, Args)]
pub struct HostLocation {
    /// The data folder of the local `hostd serve`: its store, its endpoint and the local
    /// tenant's token.
    #[arg(
        long = "data-dir",
        global = true,
        env = "HOST_DATA_DIR",
        value_name = "DIR",
        default_value = DEFAULT_DATA_DIR
    )]
    pub data_dir: PathBuf,
    /// Store URL: reach a fleet through its Host registry (postgres://...) [default: the local
    /// `hostd serve`'s].
    #[arg(
        long = "store",
        global = true,
        env = "HOST_STORE_URL",
        value_name = "URL"
    )]
    pub store: Option<String>,
    /// One Host's HostLink base, ws://host:port, dialled directly (commands that dial a Host:
    /// `run`, `wait`) [default: a Host of --store's registry, else the local `hostd serve`].
    #[arg(
        long = "endpoint",
        global = true,
        env = "HOST_ENDPOINT",
        value_name = "URL"
    )]
    pub endpoint: Option<String>,
}

impl HostLocation {
    /// The data folder.
    pub fn data(&self) -> DataDir {
        DataDir::new(&self.data_dir)
    }

    /// Refuses an `--endpoint` that would stand in for the store of `command`, which reads
    /// the store itself: without `--store` the data folder's would be used, not that Host's.
    pub fn refuse_endpoint_alone(&self, command: &str) -> Result<()> {
        match (&self.endpoint, &self.store) {
            (Some(endpoint), None) => Err(CliError::usage(format!(
                "`{command}` reads a store, and --endpoint (HOST_ENDPOINT) {endpoint} names a \
                 Host: give --store (HOST_STORE_URL), or --data-dir for the local Host's"
            ))
            .into()),
            _ => Ok(()),
        }
    }

    /// The store `command` opens: `--store`, else the store the data folder's Host records,
    /// else the data folder's own SQLite file.
    pub fn store_url(&self, command: &str) -> Result<String> {
        self.refuse_endpoint_alone(command)?;
        if let Some(url) = &self.store {
            return Ok(url.clone());
        }
        let data = self.data();
        match data.read_runtime()? {
            Some(r) if !r.store.is_empty() => Ok(r.store),
            _ => data.store_url(),
        }
    }

    /// The store `command` would read, only when there is one: `--store`, else the store the
    /// data folder's Host records, else the data folder's SQLite file if it exists. `None`
    /// when the data folder has no store yet (opening one would create it).
    pub fn existing_store_url(&self, command: &str) -> Result<Option<String>> {
        self.refuse_endpoint_alone(command)?;
        if let Some(url) = &self.store {
            return Ok(Some(url.clone()));
        }
        let data = self.data();
        if let Some(r) = data.read_runtime()?
            && !r.store.is_empty()
        {
            return Ok(Some(r.store));
        }
        if data.store_path().exists() {
            return data.store_url().map(Some);
        }
        Ok(None)
    }

    /// Opens the store `command` reads (see [`HostLocation::store_url`]).
    pub async fn open_store(&self, command: &str) -> Result<Store> {
        let url = self.store_url(command)?;
        Store::open(StoreOptions::new(url))
            .await
            .context("opening the store")
    }
}

/// Whom a client command acts for.
#[derive(Clone, Debug, Default, Args)]
pub struct TenantFlags {
    /// Tenant [default: the local tenant].
    #[arg(long = "tenant", global = true, env = "HOST_TENANT")]
    pub tenant: Option<String>,
    /// The tenant's HostLink token [default: read from the data folder]. Checked before
    /// anything is read or admitted.
    #[arg(
        long = "token",
        global = true,
        env = "HOST_TENANT_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl TenantFlags {
    /// The tenant's name: `--tenant`, else the one the data folder's Host records, else the
    /// local tenant.
    pub fn tenant_name(&self, runtime: Option<&Runtime>) -> String {
        match &self.tenant {
            Some(t) => t.clone(),
            None => runtime
                .map(|r| r.tenant.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| LOCAL_TENANT.to_owned()),
        }
    }

    /// The tenant (see [`TenantFlags::tenant_name`]), checked.
    pub fn tenant(&self, runtime: Option<&Runtime>) -> Result<TenantId> {
        TenantId::new(self.tenant_name(runtime)).context("--tenant")
    }

    /// The token: `--token`, else the tenant's token file in the data folder.
    pub fn token(&self, data: &DataDir, tenant: &TenantId) -> Result<String> {
        match &self.token {
            Some(t) => Ok(t.clone()),
            None => data.token(tenant.as_str()),
        }
    }
}

/// The most a command may be told to wait on a Host.
fn client_timeout(s: &str) -> Result<Duration, String> {
    let d = timing::duration_text::parse(s)?;
    let probe = ClientOptions {
        connect_timeout: d,
        request_timeout: d,
    };
    probe.validate().map_err(|e| e.reason)?;
    Ok(d)
}

/// How long a HostLink client waits on a Host. Each is `None` unless given; the defaults are
/// the client's own.
#[derive(Clone, Debug, Default, Args)]
pub struct LinkFlags {
    /// How long a dial of a Host may take (TCP, upgrade and connect reply); a frozen Host is
    /// given up on after it [default: 5s].
    #[arg(long = "connect-timeout", global = true, env = "HOST_CONNECT_TIMEOUT", value_parser = client_timeout, value_name = "DURATION")]
    pub connect_timeout: Option<Duration>,
    /// How long a request to a Host waits for its answer [default: 30s].
    #[arg(long = "request-timeout", global = true, env = "HOST_REQUEST_TIMEOUT", value_parser = client_timeout, value_name = "DURATION")]
    pub request_timeout: Option<Duration>,
}

impl LinkFlags {
    /// The HostLink client's timeouts (each validated when parsed).
    pub fn client_options(&self) -> ClientOptions {
        let d = ClientOptions::default();
        ClientOptions {
            connect_timeout: self.connect_timeout.unwrap_or(d.connect_timeout),
            request_timeout: self.request_timeout.unwrap_or(d.request_timeout),
        }
    }
}

/// The options of a command that acts for a tenant on a Host (`hostd session`, `hostd run`).
#[derive(Clone, Debug, Args)]
pub struct ClientFlags {
    #[command(flatten)]
    pub location: HostLocation,
    #[command(flatten)]
    pub tenant: TenantFlags,
    #[command(flatten)]
    pub link: LinkFlags,
}

/// How long a client command waits for a local Host that is starting, unless told otherwise.
pub const DEFAULT_WAIT_FOR_HOST: Duration = Duration::from_secs(10);
/// The longest a client command may be told to wait for a Host.
const MAX_WAIT_FOR_HOST: Duration = Duration::from_secs(3600);

/// A wait for a Host: at most [`MAX_WAIT_FOR_HOST`].
pub fn wait_bound(s: &str) -> Result<Duration, String> {
    let d = timing::duration_text::parse(s)?;
    if d > MAX_WAIT_FOR_HOST {
        return Err(format!(
            "above_bound: at most {}",
            humantime::format_duration(MAX_WAIT_FOR_HOST)
        ));
    }
    Ok(d)
}

/// How long `hostd session` waits for a local Host that is starting.
#[derive(Clone, Debug, Default, Args)]
pub struct WaitForHost {
    /// How long to wait for a local Host that is starting (`hostd serve &` just run) before
    /// giving up; 0s does not wait [default: 10s].
    #[arg(long = "wait-for-host", global = true, env = "HOST_WAIT_FOR_HOST", value_parser = wait_bound, value_name = "DURATION")]
    pub wait_for_host: Option<Duration>,
}

impl WaitForHost {
    pub fn bound(&self) -> Duration {
        self.wait_for_host.unwrap_or(DEFAULT_WAIT_FOR_HOST)
    }
}

/// A HostLink capability a command needs of the Host it dials, with the words its errors use.
#[derive(Clone, Copy, Debug)]
pub struct Capability {
    /// The method the Host advertises in its connect reply (`hostlink.run`).
    pub method: &'static str,
    /// What a Host with it does, after "does not" (`host workflow runs`).
    pub does: &'static str,
    /// A Host with it, after "no Host" (`serving runs`).
    pub serving: &'static str,
}

/// Where a [`Dialer`] finds Hosts.
enum Hosts {
    /// `--endpoint`: this one Host.
    Endpoint(String),
    /// `--store`: the live Hosts of the store's registry.
    Registry(Store),
    /// The Host that recorded itself in the data folder.
    Local(String),
}

/// A link to a Host that serves the capability.
pub struct Link {
    pub client: HostLinkClient,
    /// The Host's id in the registry (dialled through `--store`).
    pub host: Option<String>,
    pub endpoint: String,
}

impl Link {
    /// How the Host is named to the user.
    pub fn name(&self) -> String {
        match &self.host {
            Some(h) => format!("Host {h} at {}", self.endpoint),
            None => format!("the Host at {}", self.endpoint),
        }
    }
}

/// Which Hosts a dial may pick among.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pick<'a> {
    /// This Host first (by registry id), when it is live.
    pub prefer: Option<&'a str>,
    /// Only this Host.
    pub only: Option<&'a str>,
    /// Only Hosts that accept new work (not draining).
    pub accepting: bool,
}

/// Dials the Host a command's location flags name, as its tenant, for one capability.
pub struct Dialer {
    hosts: Hosts,
    tenant: TenantId,
    token: String,
    name: &'static str,
    capability: Capability,
    options: ClientOptions,
}

impl Dialer {
    /// Reads the location flags (opening the store for `--store`), the tenant and its token.
    /// `name` is the client name the Host sees.
    pub async fn new(
        flags: &ClientFlags,
        name: &'static str,
        capability: Capability,
    ) -> Result<Dialer> {
        let location = &flags.location;
        let data = location.data();
        let runtime = data.read_runtime()?;
        let hosts = match (&location.endpoint, &location.store) {
            (Some(e), _) => Hosts::Endpoint(e.clone()),
            (None, Some(url)) => Hosts::Registry(
                Store::open(StoreOptions::new(url.clone()))
                    .await
                    .context("opening the store (--store) to read its Host registry")?,
            ),
            (None, None) => match &runtime {
                Some(r) => Hosts::Local(r.endpoint.clone()),
                // Said before the token is looked for: no Host is the first thing to fix.
                None => {
                    return Err(CliError::refused(
                        "no_host",
                        format!(
                            "no Host {} could be reached: start `hostd serve` (it writes its \
                             endpoint to {}), or pass --store or --endpoint",
                            capability.serving,
                            location.data_dir.display()
                        ),
                    )
                    .into());
                }
            },
        };
        let tenant = flags.tenant.tenant(runtime.as_ref())?;
        let token = flags.tenant.token(&data, &tenant)?;
        Ok(Dialer {
            hosts,
            tenant,
            token,
            name,
            capability,
            options: flags.link.client_options(),
        })
    }

    /// True when another Host can be dialled if one goes away (`--store`: any live Host of the
    /// registry), so a command may follow its work from Host to Host.
    pub fn fails_over(&self) -> bool {
        matches!(self.hosts, Hosts::Registry(_))
    }

    /// Dials a Host serving the capability: the endpoint, the data folder's Host, or the first
    /// Host of the registry `pick` allows that answers (the preferred one, then accepting
    /// before draining, then the most free weight).
    pub async fn dial(&self, pick: Pick<'_>) -> Result<Link> {
        match &self.hosts {
            Hosts::Endpoint(e) | Hosts::Local(e) => self.dial_one(e).await,
            Hosts::Registry(store) => self.dial_registry(store, pick).await,
        }
    }

    /// Closes the store, if one was opened.
    pub async fn close(self) {
        if let Hosts::Registry(store) = self.hosts {
            store.close().await;
        }
    }

    async fn dial_one(&self, endpoint: &str) -> Result<Link> {
        let client = HostLinkClient::connect_with(
            endpoint,
            &self.tenant,
            &self.token,
            self.name,
            self.options,
        )
        .await
        .map_err(|e| {
            let hint = matches!(e, ClientError::Connect(_))
                .then_some(" (start `hostd serve`, or pass --store or --endpoint)");
            anyhow::Error::new(e).context(format!(
                "no Host {} could be reached at {endpoint}{}",
                self.capability.serving,
                hint.unwrap_or_default()
            ))
        })?;
        if !client.methods.iter().any(|m| m == self.capability.method) {
            client.close();
            anyhow::bail!(
                "the Host at {endpoint} does not {} (it does not advertise {})",
                self.capability.does,
                self.capability.method
            );
        }
        Ok(Link {
            client,
            host: None,
            endpoint: endpoint.to_owned(),
        })
    }

    async fn dial_registry(&self, store: &Store, pick: Pick<'_>) -> Result<Link> {
        let now = store.now_ms().await?;
        let mut targets: Vec<HostTarget> = store
            .targets(true)
            .await?
            .into_iter()
            .filter(|t| t.is_live(now))
            .filter(|t| !pick.accepting || t.accepting)
            .filter(|t| pick.only.is_none_or(|h| t.host.as_str() == h))
            .collect();
        targets.sort_by_key(|t| {
            (
                pick.prefer != Some(t.host.as_str()),
                !t.accepting,
                Reverse(t.capacity.saturating_sub(t.weight_used)),
            )
        });
        let mut last = None;
        for t in targets {
            match HostLinkClient::connect_with(
                &t.endpoint,
                &self.tenant,
                &self.token,
                self.name,
                self.options,
            )
            .await
            {
                Ok(client) if client.methods.iter().any(|m| m == self.capability.method) => {
                    return Ok(Link {
                        client,
                        host: Some(t.host.to_string()),
                        endpoint: t.endpoint,
                    });
                }
                Ok(client) => {
                    client.close();
                    last = Some(format!(
                        "{}: does not advertise {}",
                        t.host, self.capability.method
                    ));
                }
                Err(ClientError::Disconnected { code, .. })
                    if code == hostlink::Disconnect::AUTHENTICATION_FAILED.code =>
                {
                    return Err(CliError::refused(
                        "unauthenticated",
                        format!(
                            "the token was refused for tenant {}: nothing was read or admitted",
                            self.tenant
                        ),
                    )
                    .into());
                }
                Err(e) => last = Some(format!("{}: {e}", t.host)),
            }
        }
        let which = match (pick.only, pick.accepting) {
            (Some(h), _) => format!("Host {h}"),
            (None, true) => format!("live, accepting Host {}", self.capability.serving),
            (None, false) => format!("live Host {}", self.capability.serving),
        };
        Err(CliError::refused(
            "no_host",
            format!(
                "no {which} in the store's registry could be reached{}",
                last.map(|l| format!(" (last: {l})")).unwrap_or_default()
            ),
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        location: HostLocation,
    }

    #[test]
    fn the_data_folder_is_the_default_location() {
        let p = Probe::parse_from(["probe"]);
        assert_eq!(p.location.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(p.location.store.is_none() && p.location.endpoint.is_none());
        let help = Probe::command().render_help().to_string();
        assert!(help.contains(DEFAULT_DATA_DIR), "{help}");
    }

    #[test]
    fn a_store_reader_refuses_an_endpoint_without_a_store_as_usage() {
        let p = Probe::parse_from(["probe", "--endpoint", "ws://127.0.0.1:1"]);
        let e = p.location.store_url("hostd hosts ls").unwrap_err();
        let c = crate::exit::classify(&e);
        assert_eq!((c.code, c.status), ("usage", crate::exit::USAGE));
        let p = Probe::parse_from([
            "probe",
            "--endpoint",
            "ws://127.0.0.1:1",
            "--store",
            "sqlite:///x.db",
        ]);
        assert_eq!(
            p.location.store_url("hostd hosts ls").unwrap(),
            "sqlite:///x.db"
        );
    }

    #[test]
    fn a_wait_for_a_host_is_bounded() {
        assert!(wait_bound("2h").is_err());
        assert_eq!(wait_bound("3s").unwrap(), Duration::from_secs(3));
    }
}
