//! The variables a service is started with: the flow's own (`FLOW_NAME`, `FLOW_SERVICE`,
//! `FLOW_ENDPOINT_*`, `PORT`), its producers' addresses for every edge that reaches them
//! (`FLOW_DEP_*`), its declared `env` with `${endpoint:...}` references resolved, and last the
//! command line's `--set` overrides.
//!
//! This module owns that computation as a pure function, so `up`, `up --dry-run` and the
//! exported environment of `hostd flow env` can never disagree. It must never read the
//! process environment, spawn anything or allocate a port.

use crate::error::FlowError;
use crate::graph::DependencyGraph;
use crate::manifest::{EnvSegment, ServiceManifest, Workspace};
use crate::ports::PortMap;

/// One `--set <service>:KEY=VALUE`: replaces (or adds) a variable of one service, after
/// everything else. Its value is taken literally: an `${endpoint:...}` in it is neither
/// checked nor resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOverride {
    pub service: String,
    pub key: String,
    pub value: String,
}

impl EnvOverride {
    /// Parses `service:KEY=VALUE`.
    pub fn parse(spec: &str) -> Result<EnvOverride, FlowError> {
        let refuse = |reason: &str| FlowError::InvalidOverride {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let (service, assignment) = spec
            .split_once(':')
            .ok_or_else(|| refuse("expected <service>:KEY=VALUE"))?;
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| refuse("expected <service>:KEY=VALUE"))?;
        if service.is_empty() {
            return Err(refuse("the service name is empty"));
        }
        let mut chars = key.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(refuse(&format!(
                "`{key}` is not a valid environment variable name"
            )));
        }
        Ok(EnvOverride {
            service: service.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
}

/// What the environment of any service of one flow is computed from.
#[derive(Debug, Clone, Copy)]
pub struct EnvContext<'a> {
    pub flow_name: &'a str,
    pub workspace: &'a Workspace,
    pub graph: &'a DependencyGraph,
    /// Every address known to this flow (a producer without one is left out).
    pub ports: &'a PortMap,
    pub overrides: &'a [EnvOverride],
}

impl EnvContext<'_> {
    /// The variables `service` is started with, in a stable order; a later entry with the
    /// same key wins when they are applied in order.
    pub fn resolve(&self, service: &ServiceManifest) -> Vec<(String, String)> {
        let mut env = vec![
            ("FLOW_NAME".to_owned(), self.flow_name.to_owned()),
            ("FLOW_SERVICE".to_owned(), service.name.clone()),
        ];
        let own: Vec<(String, std::net::SocketAddr)> = service
            .endpoints
            .iter()
            .filter_map(|e| {
                self.ports
                    .addr(&service.name, &e.name)
                    .map(|a| (e.name.clone(), a))
            })
            .collect();
        for (endpoint, addr) in &own {
            let key = env_key(endpoint);
            env.push((format!("FLOW_ENDPOINT_{key}_ADDR"), addr.to_string()));
            env.push((format!("FLOW_ENDPOINT_{key}_PORT"), addr.port().to_string()));
        }
        if let [(_, addr)] = own.as_slice() {
            env.push(("PORT".to_owned(), addr.port().to_string()));
        }
        for edge in self.graph.run_needs(&service.name) {
            if !edge.kind.reaches_endpoints() {
                continue;
            }
            let Some(producer) = self.workspace.service(&edge.producer) else {
                continue;
            };
            for endpoint in &producer.endpoints {
                if !edge.endpoints.is_empty() && !edge.endpoints.contains(&endpoint.name) {
                    continue;
                }
                if let Some(addr) = self.ports.addr(&producer.name, &endpoint.name) {
                    env.push((
                        format!(
                            "FLOW_DEP_{}_{}_ADDR",
                            env_key(&producer.name),
                            env_key(&endpoint.name)
                        ),
                        addr.to_string(),
                    ));
                }
            }
        }
        for (key, value) in &service.env {
            let mut text = String::new();
            for segment in &value.segments {
                match segment {
                    EnvSegment::Text(t) => text.push_str(t),
                    EnvSegment::EndpointRef {
                        service: producer,
                        endpoint,
                    } => match self.ports.addr(producer, endpoint) {
                        Some(addr) => text.push_str(&addr.to_string()),
                        None => tracing::warn!(
                            consumer = %service.name,
                            producer = %producer,
                            endpoint = %endpoint,
                            "an endpoint reference has no address in this flow"
                        ),
                    },
                }
            }
            env.push((key.clone(), text));
        }
        for o in self.overrides.iter().filter(|o| o.service == service.name) {
            env.push((o.key.clone(), o.value.clone()));
        }
        dedupe_last_wins(env)
    }

    /// The references of `service`'s env that name an address this flow does not know, as
    /// (env key, producer, endpoint).
    pub fn unresolved(&self, service: &ServiceManifest) -> Vec<(String, String, String)> {
        let mut missing = Vec::new();
        for (key, value) in &service.env {
            for (producer, endpoint) in value.references() {
                if self.ports.addr(producer, endpoint).is_none() {
                    missing.push((key.clone(), producer.to_owned(), endpoint.to_owned()));
                }
            }
        }
        missing
    }
}

/// Keeps the last value of each key, at the position of its first appearance.
fn dedupe_last_wins(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(env.len());
    for (key, value) in env {
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => out.push((key, value)),
        }
    }
    out
}

/// `my-api` → `MY_API`.
pub fn env_key(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Renders variables as a `.env` file a shell can `source` and dotenv readers accept: a value
/// made only of safe characters stays bare, anything else is single-quoted.
pub fn dotenv(env: &[(String, String)]) -> String {
    let mut out = String::new();
    for (key, value) in env {
        let safe = !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.:/@%+,=".contains(c));
        if safe {
            out.push_str(&format!("{key}={value}\n"));
        } else {
            out.push_str(&format!("{key}='{}'\n", value.replace('\'', "'\\''")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_is_parsed_and_a_malformed_one_is_refused_with_a_code() {
        let o = EnvOverride::parse("api:LOG=debug=1").unwrap();
        assert_eq!(
            (o.service.as_str(), o.key.as_str(), o.value.as_str()),
            ("api", "LOG", "debug=1")
        );
        for bad in ["api", "api:LOG", ":LOG=1", "api:1X=2", "api:A-B=1"] {
            let err = EnvOverride::parse(bad).unwrap_err();
            assert_eq!(err.code(), "flow.invalid_override", "{bad}");
        }
    }

    #[test]
    fn a_later_value_wins_in_the_place_of_the_first() {
        let env = dedupe_last_wins(vec![
            ("A".into(), "1".into()),
            ("B".into(), "2".into()),
            ("A".into(), "3".into()),
        ]);
        assert_eq!(
            env,
            vec![("A".into(), "3".into()), ("B".into(), "2".into())]
        );
    }

    #[test]
    fn dotenv_quotes_only_what_needs_it() {
        let text = dotenv(&[
            ("ADDR".into(), "127.0.0.1:80".into()),
            ("MSG".into(), "it's here".into()),
            ("EMPTY".into(), String::new()),
        ]);
        assert_eq!(text, "ADDR=127.0.0.1:80\nMSG='it'\\''s here'\nEMPTY=''\n");
    }
}
