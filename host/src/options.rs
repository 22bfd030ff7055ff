//! Host options. Owns every bound a Host runs under, its type and default (a serde type, so a
//! config file is this same type), and the one validation that turns [`Options`] into an
//! immutable [`Config`]; every refusal is an [`OptionsError`] with a stable code and the field
//! it concerns. Flags and environment variables are layered over these defaults by the
//! binary (`hostd serve`); this module never reads either, and never performs I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sessionstore::{HostId, Placement, SessionId};
use timing::duration_text;
use wire_enum::{UnknownValue, wire_enum};

wire_enum! {
    /// How the Host admits tenants next to each other.
    #[derive(Default)]
    pub enum IsolationClass {
        /// Any tenants may be resident together.
        #[default]
        Shared = "shared",
        /// Tenants may be resident together; the runtime isolates them.
        CrossTenantIsolated = "cross_tenant_isolated",
        /// One tenant at a time: a second tenant is not admitted while the first is resident.
        TenantExclusive = "tenant_exclusive",
    }
    kind = "isolation_class";
    from_str(OptionsError);
    serde;
}

/// Parses a placement, refusing unknown spellings with `unknown_enum`.
pub fn parse_placement(s: &str) -> Result<Placement, OptionsError> {
    Placement::from_wire(s).map_err(OptionsError::from)
}

wire_enum! {
    /// A stable option-refusal code.
    pub enum OptionsCode {
        Missing = "missing",
        Invalid = "invalid",
        UnknownEnum = "unknown_enum",
        NotPositive = "not_positive",
        AboveBound = "above_bound",
        BelowBound = "below_bound",
        HeartbeatMargin = "heartbeat_margin",
        ClaimMargin = "claim_margin",
        DedicatedWithoutFixedSession = "dedicated_without_fixed_session",
        DedicatedCapacityNotOne = "dedicated_capacity_not_one",
        PooledWithFixedSession = "pooled_with_fixed_session",
        UndialableEndpoint = "undialable_endpoint",
    }
    kind = "options_code";
}

/// An option refused at validation.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{}: option {field}: {reason}{}", .code.as_str(), .cause.map(|c| format!(" ({c})")).unwrap_or_default())]
pub struct OptionsError {
    pub code: OptionsCode,
    pub field: &'static str,
    pub reason: String,
    /// A finer stable code under `code`, when there is one (the endpoint refusals:
    /// [`endpoint_causes`]).
    pub cause: Option<&'static str>,
}

impl OptionsError {
    pub(crate) fn new(code: OptionsCode, field: &'static str, reason: impl Into<String>) -> Self {
        OptionsError {
            code,
            field,
            reason: reason.into(),
            cause: None,
        }
    }

    fn because(mut self, cause: &'static str) -> Self {
        self.cause = Some(cause);
        self
    }
}

/// A flag or config value that names no value of its enum: `unknown_enum`, the field being the
/// enum's kind.
impl From<UnknownValue> for OptionsError {
    fn from(e: UnknownValue) -> Self {
        OptionsError::new(
            OptionsCode::UnknownEnum,
            e.kind,
            format!("{:?} is not one of {}", e.value, e.expected_list()),
        )
    }
}

/// The causes an `invalid` internal endpoint is refused with.
pub mod endpoint_causes {
    /// Not a `ws://` or `wss://` base with a host (scheme, credentials, query, whitespace).
    pub const INVALID_BASE: &str = "invalid_base";
    /// The per-tenant spelling `…/hostlink` or `…/hostlink/<tenant>`: give the bare base.
    pub const BASE_NAMES_TENANT: &str = "base_names_tenant";
    /// Any other path (an ingress prefix, say), or a fragment.
    pub const BASE_NOT_BARE: &str = "base_not_bare";
    /// So long that not even a one-byte tenant's address fits the advertised limit.
    pub const TOO_LONG: &str = "too_long";
}

/// Everything a Host is configured with. Build one (or read it from a config file's `[host]`
/// section), then [`Options::validate`] it. Absent members take the defaults below.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// This Host's stable identity (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id: Option<HostId>,
    /// The HostLink base a controller dials: `ws://` or `wss://` plus an authority, nothing
    /// else (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_endpoint: Option<String>,
    pub isolation_class: IsolationClass,
    pub placement: Placement,
    /// How much admission weight the Host holds (dedicated: exactly 1).
    pub capacity: u32,
    /// The one session of a dedicated Host (required for dedicated, refused for pooled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed_session: Option<SessionId>,
    /// How long a pooled session stays resident while whole-session idle.
    #[serde(with = "duration_text")]
    pub warm_ttl: Duration,
    #[serde(with = "duration_text")]
    pub registry_heartbeat: Duration,
    #[serde(with = "duration_text")]
    pub registry_expiry: Duration,
    /// How long another Host's advertisement may stay expired before a heartbeat collects it
    /// (at least the registry expiry).
    #[serde(with = "duration_text")]
    pub registry_retention: Duration,
    #[serde(with = "duration_text")]
    pub claim_ttl: Duration,
    #[serde(with = "duration_text")]
    pub apply_deadline: Duration,
    /// The bound of each session's wake-up queue.
    pub command_queue_size: usize,
    #[serde(with = "duration_text")]
    pub reconcile_interval: Duration,
    pub reconcile_batch: usize,
    #[serde(with = "duration_text")]
    pub drain_grace: Duration,
    #[serde(with = "duration_text")]
    pub idle_boundary: Duration,
    #[serde(with = "duration_text")]
    pub publish_bound: Duration,
    /// How long the store may go unanswered before `/readyz` reports it unreachable (the
    /// store is probed four times within it).
    #[serde(with = "duration_text")]
    pub store_unreachable_bound: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host_id: None,
            internal_endpoint: None,
            isolation_class: IsolationClass::Shared,
            placement: Placement::Pooled,
            capacity: 64,
            fixed_session: None,
            warm_ttl: Duration::from_secs(300),
            registry_heartbeat: Duration::from_secs(5),
            registry_expiry: Duration::from_secs(20),
            registry_retention: Duration::from_secs(600),
            claim_ttl: Duration::from_secs(30),
            apply_deadline: Duration::from_secs(600),
            command_queue_size: 256,
            reconcile_interval: Duration::from_secs(2),
            reconcile_batch: 64,
            drain_grace: Duration::from_secs(25),
            idle_boundary: Duration::from_secs(10),
            publish_bound: Duration::from_secs(5),
            store_unreachable_bound: Duration::from_secs(5),
        }
    }
}

/// Validated options: immutable for the life of a Service.
#[derive(Clone, Debug)]
pub struct Config {
    pub host_id: HostId,
    pub internal_endpoint: String,
    pub isolation_class: IsolationClass,
    pub placement: Placement,
    pub capacity: u32,
    pub fixed_session: Option<SessionId>,
    pub warm_ttl: Duration,
    pub registry_heartbeat: Duration,
    pub registry_expiry: Duration,
    pub registry_retention: Duration,
    pub claim_ttl: Duration,
    pub apply_deadline: Duration,
    pub command_queue_size: usize,
    pub reconcile_interval: Duration,
    pub reconcile_batch: usize,
    pub drain_grace: Duration,
    pub idle_boundary: Duration,
    pub publish_bound: Duration,
    pub store_unreachable_bound: Duration,
}

/// Upper bounds (named so refusals can say them).
pub mod bounds {
    use std::time::Duration;

    pub const MAX_CAPACITY: u32 = 100_000;
    pub const MAX_QUEUE: usize = 65_536;
    pub const MAX_BATCH: usize = 1_000;
    pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
    pub const MAX_REGISTRY_EXPIRY: Duration = Duration::from_secs(3600);
    pub const MAX_REGISTRY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    pub const MAX_CLAIM_TTL: Duration = Duration::from_secs(3600);
    pub const MAX_APPLY_DEADLINE: Duration = Duration::from_secs(30 * 24 * 3600);
    pub const MIN_STORE_UNREACHABLE_BOUND: Duration = Duration::from_millis(200);
    pub const MAX_STORE_UNREACHABLE_BOUND: Duration = Duration::from_secs(600);
}

fn positive(field: &'static str, d: Duration, max: Duration) -> Result<(), OptionsError> {
    if d.is_zero() {
        return Err(OptionsError::new(
            OptionsCode::NotPositive,
            field,
            "must be positive",
        ));
    }
    if d > max {
        return Err(OptionsError::new(
            OptionsCode::AboveBound,
            field,
            format!("is {d:?}; at most {max:?} allowed"),
        ));
    }
    Ok(())
}

fn count(field: &'static str, n: usize, max: usize) -> Result<(), OptionsError> {
    if n == 0 {
        return Err(OptionsError::new(
            OptionsCode::NotPositive,
            field,
            "must be positive",
        ));
    }
    if n > max {
        return Err(OptionsError::new(
            OptionsCode::AboveBound,
            field,
            format!("is {n}; at most {max} allowed"),
        ));
    }
    Ok(())
}

/// Checks a HostLink base endpoint: `ws`/`wss`, an authority with a dialable port, and no
/// path, query, fragment or credentials.
pub fn check_endpoint(endpoint: &str) -> Result<(), OptionsError> {
    use endpoint_causes::*;
    let field = "internal_endpoint";
    let invalid = |reason: &str| {
        OptionsError::new(OptionsCode::Invalid, field, reason.to_owned()).because(INVALID_BASE)
    };
    let rest = endpoint
        .strip_prefix("ws://")
        .or_else(|| endpoint.strip_prefix("wss://"))
        .ok_or_else(|| invalid("must start with ws:// or wss://"))?;
    if rest.is_empty() {
        return Err(invalid("has no authority"));
    }
    if rest.contains('?') {
        return Err(invalid("must not carry a query"));
    }
    if let Some(slash) = rest.find(['/', '#']) {
        let path = &rest[slash..];
        let names_tenant = path == "/hostlink"
            || path == "/hostlink/"
            || path
                .strip_prefix("/hostlink/")
                .is_some_and(|t| !t.is_empty() && !t.contains(['/', '#']));
        return Err(if names_tenant {
            OptionsError::new(
                OptionsCode::Invalid,
                field,
                "names the tenant path: give the bare base, the tenant path is derived",
            )
            .because(BASE_NAMES_TENANT)
        } else {
            OptionsError::new(
                OptionsCode::Invalid,
                field,
                "must be a bare base: no path or fragment (use host-based routing, not a path prefix)",
            )
            .because(BASE_NOT_BARE)
        });
    }
    // The longest address derived from it is base + "/hostlink/" + the tenant; with a one-byte
    // tenant it must still fit what a registry observation may carry.
    if endpoint.len() + hostlink_server::HOSTLINK_PATH_PREFIX.len() + 1
        > hostlink::records::MAX_ENDPOINT_BYTES
    {
        return Err(OptionsError::new(
            OptionsCode::Invalid,
            field,
            format!(
                "is {} bytes: no tenant's address would fit {} bytes",
                endpoint.len(),
                hostlink::records::MAX_ENDPOINT_BYTES
            ),
        )
        .because(TOO_LONG));
    }
    if rest.contains('@') {
        return Err(invalid("must not carry credentials"));
    }
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("must not contain whitespace"));
    }
    // Split host and port; IPv6 literals are bracketed.
    let (host, port) = if let Some(after) = rest.strip_prefix('[') {
        let close = after
            .find(']')
            .ok_or_else(|| invalid("has an unclosed IPv6 literal"))?;
        let host = &after[..close];
        let tail = &after[close + 1..];
        let port = match tail {
            "" => None,
            t => Some(
                t.strip_prefix(':')
                    .ok_or_else(|| invalid("has junk after the IPv6 literal"))?,
            ),
        };
        (host, port)
    } else {
        match rest.split_once(':') {
            None => (rest, None),
            Some((h, p)) => (h, Some(p)),
        }
    };
    if host.is_empty() {
        return Err(invalid("has an empty host"));
    }
    if let Some(p) = port {
        let undialable = |why: &str| {
            OptionsError::new(
                OptionsCode::UndialableEndpoint,
                field,
                format!("the port {p:?} {why}"),
            )
        };
        if p.is_empty() {
            return Err(undialable("is empty"));
        }
        if !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(undialable("is not a number"));
        }
        match p.parse::<u32>() {
            Ok(0) => return Err(undialable("is 0")),
            Ok(n) if n > 65_535 => return Err(undialable("is above 65535")),
            Ok(_) => {}
            Err(_) => return Err(undialable("is not a number")),
        }
    }
    Ok(())
}

impl Options {
    /// Validates every option and the rules between them.
    pub fn validate(self) -> Result<Config, OptionsError> {
        let host_id = self
            .host_id
            .ok_or_else(|| OptionsError::new(OptionsCode::Missing, "host_id", "is required"))?;
        let internal_endpoint = self.internal_endpoint.ok_or_else(|| {
            OptionsError::new(OptionsCode::Missing, "internal_endpoint", "is required")
        })?;
        check_endpoint(&internal_endpoint)?;
        if self.capacity == 0 {
            return Err(OptionsError::new(
                OptionsCode::NotPositive,
                "capacity",
                "must be positive",
            ));
        }
        if self.capacity > bounds::MAX_CAPACITY {
            return Err(OptionsError::new(
                OptionsCode::AboveBound,
                "capacity",
                format!(
                    "is {}; at most {} allowed",
                    self.capacity,
                    bounds::MAX_CAPACITY
                ),
            ));
        }
        match self.placement {
            Placement::Dedicated => {
                if self.fixed_session.is_none() {
                    return Err(OptionsError::new(
                        OptionsCode::DedicatedWithoutFixedSession,
                        "fixed_session",
                        "a dedicated Host needs the one session it serves",
                    ));
                }
                if self.capacity != 1 {
                    return Err(OptionsError::new(
                        OptionsCode::DedicatedCapacityNotOne,
                        "capacity",
                        format!("a dedicated Host holds exactly 1, not {}", self.capacity),
                    ));
                }
            }
            Placement::Pooled => {
                if self.fixed_session.is_some() {
                    return Err(OptionsError::new(
                        OptionsCode::PooledWithFixedSession,
                        "fixed_session",
                        "a pooled Host serves any session; a fixed session is for dedicated Hosts",
                    ));
                }
            }
        }
        positive("warm_ttl", self.warm_ttl, bounds::MAX_DURATION)?;
        positive(
            "registry_heartbeat",
            self.registry_heartbeat,
            bounds::MAX_REGISTRY_EXPIRY,
        )?;
        positive(
            "registry_expiry",
            self.registry_expiry,
            bounds::MAX_REGISTRY_EXPIRY,
        )?;
        if self.registry_expiry < self.registry_heartbeat * 3 {
            return Err(OptionsError::new(
                OptionsCode::HeartbeatMargin,
                "registry_expiry",
                format!(
                    "is {:?}; it must cover at least 3 heartbeats of {:?}",
                    self.registry_expiry, self.registry_heartbeat
                ),
            ));
        }
        positive(
            "registry_retention",
            self.registry_retention,
            bounds::MAX_REGISTRY_RETENTION,
        )?;
        if self.registry_retention < self.registry_expiry {
            return Err(OptionsError::new(
                OptionsCode::HeartbeatMargin,
                "registry_retention",
                format!(
                    "is {:?}; it must be at least the registry expiry of {:?}",
                    self.registry_retention, self.registry_expiry
                ),
            ));
        }
        positive("claim_ttl", self.claim_ttl, bounds::MAX_CLAIM_TTL)?;
        positive(
            "apply_deadline",
            self.apply_deadline,
            bounds::MAX_APPLY_DEADLINE,
        )?;
        if self.apply_deadline < self.claim_ttl * 2 {
            return Err(OptionsError::new(
                OptionsCode::ClaimMargin,
                "apply_deadline",
                format!(
                    "is {:?}; it must cover at least 2 claims of {:?}",
                    self.apply_deadline, self.claim_ttl
                ),
            ));
        }
        count(
            "command_queue_size",
            self.command_queue_size,
            bounds::MAX_QUEUE,
        )?;
        positive(
            "reconcile_interval",
            self.reconcile_interval,
            bounds::MAX_DURATION,
        )?;
        count("reconcile_batch", self.reconcile_batch, bounds::MAX_BATCH)?;
        positive("drain_grace", self.drain_grace, bounds::MAX_DURATION)?;
        positive("idle_boundary", self.idle_boundary, bounds::MAX_DURATION)?;
        positive("publish_bound", self.publish_bound, bounds::MAX_DURATION)?;
        positive(
            "store_unreachable_bound",
            self.store_unreachable_bound,
            bounds::MAX_STORE_UNREACHABLE_BOUND,
        )?;
        if self.store_unreachable_bound < bounds::MIN_STORE_UNREACHABLE_BOUND {
            return Err(OptionsError::new(
                OptionsCode::BelowBound,
                "store_unreachable_bound",
                format!(
                    "is {:?}; at least {:?} (one probe must have time to answer)",
                    self.store_unreachable_bound,
                    bounds::MIN_STORE_UNREACHABLE_BOUND
                ),
            ));
        }
        Ok(Config {
            host_id,
            internal_endpoint,
            isolation_class: self.isolation_class,
            placement: self.placement,
            capacity: self.capacity,
            fixed_session: self.fixed_session,
            warm_ttl: self.warm_ttl,
            registry_heartbeat: self.registry_heartbeat,
            registry_expiry: self.registry_expiry,
            registry_retention: self.registry_retention,
            claim_ttl: self.claim_ttl,
            apply_deadline: self.apply_deadline,
            command_queue_size: self.command_queue_size,
            reconcile_interval: self.reconcile_interval,
            reconcile_batch: self.reconcile_batch,
            drain_grace: self.drain_grace,
            idle_boundary: self.idle_boundary,
            publish_bound: self.publish_bound,
            store_unreachable_bound: self.store_unreachable_bound,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Options {
        Options {
            host_id: Some(HostId::new("h1").unwrap()),
            internal_endpoint: Some("ws://10.0.0.1:7400".into()),
            ..Options::default()
        }
    }

    fn code(o: Options) -> (&'static str, &'static str) {
        let e = o.validate().unwrap_err();
        (e.code.as_str(), e.field)
    }

    #[test]
    fn the_defaults_with_an_identity_validate() {
        base().validate().unwrap();
    }

    #[test]
    fn a_missing_identity_or_endpoint_is_refused() {
        assert_eq!(
            code(Options {
                host_id: None,
                ..base()
            }),
            ("missing", "host_id")
        );
        assert_eq!(
            code(Options {
                internal_endpoint: None,
                ..base()
            }),
            ("missing", "internal_endpoint")
        );
    }

    #[test]
    fn an_endpoint_must_be_a_bare_dialable_ws_base() {
        for (e, c) in [
            ("http://h:1", "invalid"),
            ("ws://h:1/hostlink", "invalid"),
            ("ws://h:1?x=1", "invalid"),
            ("ws://u:p@h:1", "invalid"),
            ("ws://", "invalid"),
            ("ws://h:1#", "invalid"),
            ("ws://h:", "undialable_endpoint"),
            ("ws://h:0", "undialable_endpoint"),
            ("ws://h:99999", "undialable_endpoint"),
            ("ws://h:80:90", "undialable_endpoint"),
        ] {
            let r = code(Options {
                internal_endpoint: Some(e.into()),
                ..base()
            });
            assert_eq!(r, (c, "internal_endpoint"), "{e}");
        }
        for ok in [
            "ws://h",
            "wss://h.example:443",
            "ws://[::1]:7400",
            "ws://127.0.0.1:7400",
        ] {
            check_endpoint(ok).unwrap();
        }
    }

    #[test]
    fn an_invalid_endpoint_names_its_cause() {
        let long = format!("ws://{}", "h".repeat(2048));
        for (e, cause) in [
            ("http://h:1", "invalid_base"),
            ("ws://u:p@h:1", "invalid_base"),
            ("ws://h:1?x=1", "invalid_base"),
            ("ws://", "invalid_base"),
            ("ws://h:1/hostlink", "base_names_tenant"),
            ("ws://h:1/hostlink/", "base_names_tenant"),
            ("ws://h:1/hostlink/acme", "base_names_tenant"),
            ("wss://gw/pods/h7/", "base_not_bare"),
            ("ws://h:1/", "base_not_bare"),
            ("ws://h:1#", "base_not_bare"),
            (long.as_str(), "too_long"),
        ] {
            let err = check_endpoint(e).unwrap_err();
            assert_eq!(
                (err.code, err.field, err.cause),
                (OptionsCode::Invalid, "internal_endpoint", Some(cause)),
                "{e}"
            );
            assert!(err.to_string().contains(cause), "{err}");
        }
        // The longest base that still fits a one-byte tenant is accepted.
        let fits = format!(
            "ws://{}",
            "h".repeat(hostlink::records::MAX_ENDPOINT_BYTES - 5 - 11)
        );
        check_endpoint(&fits).unwrap();
        assert_eq!(
            check_endpoint(&format!("{fits}h")).unwrap_err().cause,
            Some("too_long")
        );
    }

    #[test]
    fn a_wildcard_address_a_zone_or_an_unusual_host_name_is_not_refused() {
        for ok in [
            "ws://0.0.0.0:1",
            "ws://[fe80::1%25eth0]:7400",
            "ws://b\u{fc}cher.example:7400",
            "ws://h;x",
            "ws://-h",
        ] {
            assert!(check_endpoint(ok).is_ok(), "{ok} was refused");
        }
    }

    #[test]
    fn the_queue_bound_is_65536_commands_and_the_reconcile_batch_bound_1000() {
        let queue = |n| Options {
            command_queue_size: n,
            ..base()
        };
        queue(65_536).validate().unwrap();
        assert_eq!(code(queue(65_537)), ("above_bound", "command_queue_size"));
        let batch = |n| Options {
            reconcile_batch: n,
            ..base()
        };
        batch(1_000).validate().unwrap();
        assert_eq!(code(batch(1_001)), ("above_bound", "reconcile_batch"));
    }

    #[test]
    fn an_unknown_enum_spelling_is_refused() {
        assert_eq!(
            parse_placement("shared").unwrap_err().code,
            OptionsCode::UnknownEnum
        );
        assert_eq!(
            "exclusive".parse::<IsolationClass>().unwrap_err().code,
            OptionsCode::UnknownEnum
        );
        assert_eq!(
            "tenant_exclusive".parse::<IsolationClass>().unwrap(),
            IsolationClass::TenantExclusive
        );
    }

    #[test]
    fn zero_and_oversized_bounds_are_refused() {
        assert_eq!(
            code(Options {
                capacity: 0,
                ..base()
            }),
            ("not_positive", "capacity")
        );
        assert_eq!(
            code(Options {
                capacity: 1_000_000,
                ..base()
            }),
            ("above_bound", "capacity")
        );
        assert_eq!(
            code(Options {
                warm_ttl: Duration::ZERO,
                ..base()
            }),
            ("not_positive", "warm_ttl")
        );
        assert_eq!(
            code(Options {
                command_queue_size: 1 << 20,
                ..base()
            }),
            ("above_bound", "command_queue_size")
        );
        assert_eq!(
            code(Options {
                reconcile_batch: 0,
                ..base()
            }),
            ("not_positive", "reconcile_batch")
        );
    }

    #[test]
    fn the_registry_expiry_must_cover_three_heartbeats() {
        let o = Options {
            registry_heartbeat: Duration::from_secs(10),
            registry_expiry: Duration::from_secs(29),
            ..base()
        };
        assert_eq!(code(o), ("heartbeat_margin", "registry_expiry"));
    }

    #[test]
    fn the_apply_deadline_must_cover_two_claims() {
        let o = Options {
            claim_ttl: Duration::from_secs(60),
            apply_deadline: Duration::from_secs(119),
            ..base()
        };
        assert_eq!(code(o), ("claim_margin", "apply_deadline"));
    }

    #[test]
    fn placement_rules_between_options_are_enforced() {
        let dedicated = Options {
            placement: Placement::Dedicated,
            capacity: 1,
            ..base()
        };
        assert_eq!(
            code(dedicated.clone()),
            ("dedicated_without_fixed_session", "fixed_session")
        );
        let fixed = Some(SessionId::new("s").unwrap());
        assert_eq!(
            code(Options {
                capacity: 2,
                fixed_session: fixed.clone(),
                ..dedicated.clone()
            }),
            ("dedicated_capacity_not_one", "capacity")
        );
        Options {
            fixed_session: fixed.clone(),
            ..dedicated
        }
        .validate()
        .unwrap();
        assert_eq!(
            code(Options {
                fixed_session: fixed,
                ..base()
            }),
            ("pooled_with_fixed_session", "fixed_session")
        );
    }
}
