//! HostLink records: every object carried in a command's `data`, an RPC reply or a push.
//! Owns their strict decoding (one object, no duplicate or unknown members, no trailing data,
//! `null` refused, `version` exactly 1 where a record is versioned, zero epochs and
//! generations refused, ids by the id rule) and their encoding with a fixed member order.
//! Never performs I/O and never decides what a request means.
//!
//! | record | members, in wire order |
//! |---|---|
//! | [`ConnectData`] | `supported_versions` |
//! | [`AttachRequest`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `agent_id`, `runtime_compatibility_id`, `mode`, `actor_id`, `trace_id`?, `idempotency_key` |
//! | [`BindRequest`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `lease_epoch`, `runtime_compatibility_id`, `idempotency_key` |
//! | [`UnbindRequest`] | the bind members minus `runtime_compatibility_id` |
//! | [`DrainRequest`] | `version`, `host_id`, `host_generation`, `idempotency_key`, [`tenant_id`, `session_id`] |
//! | [`Delivery`] | `command_id` (a `version` of 1 is accepted, never written) |
//! | [`RegistryObservation`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `agent_id`, `runtime_compatibility_id`, `placement`, `internal_endpoint`, `residency`, `accepting`, `lease_epoch`, `observed_at`, `expires_at` |
//! | [`DrainObservation`] | `host_id`, `host_generation`, `drain_generation`, `state`, [`tenant_id`, `session_id`] |
//! | [`HostLinkError`] | `code`, and `current_lease_epoch` (only and always with `epoch_mismatch`) or `runtime_compatibility_id` (only and always with `runtime_mismatch`) |
//! | [`SubscribeOptions`] | `version`, `ephemeral`? |
//! | [`EnduringPublication`] | `tenant_id`, `session_id`, `event_id`, `journal_seq`, `covered_through`, `body` |
//! | [`EphemeralPublication`] | `tenant_id`, `session_id`, `stream`, `text`, `gap` |
//!
//! `SubscribeOptions` and `EphemeralPublication` are this module's design (HOSTLINK.md names
//! the opt-in and the preview but not their members): a client opts in to previews with
//! subscribe `data` `{"version":1,"ephemeral":true}`; a preview carries the merged text delta
//! of one `stream` (`text` or `reasoning`) and `gap: true` when text before it was dropped
//! (rate limit, overflow) so a viewer knows the preview is incomplete until the next enduring
//! record supersedes it.

use std::num::NonZeroU64;

use serde_json::Value;
use serde_json::value::RawValue;
use sessionstore::ids::check_opaque_id;
use sessionstore::wire::{DecodeError, StrictObject};
use sessionstore::{
    AgentId, CommandId, CompatibilityId, EventId, HostId, Placement, ResidencyState, SessionId,
    TenantId,
};

use super::codes::HostLinkErrorCode;
use super::json::{ObjectWriter, RawObject, is_null};
use super::timestamp::Timestamp;

/// The one HostLink wire version this build speaks.
pub const WIRE_VERSION: u64 = 1;
/// The longest `supported_versions` list a client may offer.
pub const MAX_SUPPORTED_VERSIONS: usize = 16;
/// The longest `internal_endpoint` a registry observation may carry.
pub const MAX_ENDPOINT_BYTES: usize = 2048;
/// The largest preview text a single ephemeral publication may carry.
pub const MAX_PREVIEW_TEXT_BYTES: usize = 64 * 1024;

/// Why a record could not be decoded. Every variant is a malformed request to the link.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{record}: {reason}")]
pub struct RecordError {
    /// The record being decoded.
    pub record: &'static str,
    /// What was wrong (never quotes a credential).
    pub reason: String,
}

fn fail(record: &'static str, reason: impl Into<String>) -> RecordError {
    RecordError {
        record,
        reason: reason.into(),
    }
}

fn from_decode(record: &'static str) -> impl Fn(DecodeError) -> RecordError {
    move |e| fail(record, e.to_string())
}

macro_rules! opaque_text_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, Debug)]
        pub struct $name(String);

        impl $name {
            /// The wire name of this kind of id.
            pub const FIELD: &'static str = $field;

            /// Validates `value` by the id rule.
            pub fn new(value: impl Into<String>) -> Result<Self, RecordError> {
                let value = value.into();
                check_opaque_id($field, &value).map_err(|e| fail($field, e.to_string()))?;
                Ok(Self(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

opaque_text_id!(
    /// Who asked for an attach (opaque to the Host; recorded for attribution).
    ActorId,
    "actor_id"
);
opaque_text_id!(
    /// A caller's trace id, carried through for correlation.
    TraceId,
    "trace_id"
);
opaque_text_id!(
    /// The caller's key that makes a retried request idempotent.
    IdempotencyKey,
    "idempotency_key"
);

/// Strict member access for one record, in terms of the session store's [`StrictObject`].
struct Reader {
    record: &'static str,
    obj: StrictObject,
}

impl Reader {
    fn parse(record: &'static str, bytes: &[u8], known: &[&str]) -> Result<Reader, RecordError> {
        let obj = StrictObject::parse(bytes).map_err(from_decode(record))?;
        obj.only(known).map_err(from_decode(record))?;
        Ok(Reader { record, obj })
    }

    fn member(&self, key: &str) -> Option<&Value> {
        self.obj
            .members()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    fn version(&self) -> Result<(), RecordError> {
        let v = self
            .obj
            .version(WIRE_VERSION)
            .map_err(from_decode(self.record))?;
        if v != WIRE_VERSION {
            return Err(fail(self.record, "version must be 1"));
        }
        Ok(())
    }

    fn optional_version(&self) -> Result<(), RecordError> {
        match self.member("version") {
            None => Ok(()),
            Some(_) => self.version(),
        }
    }

    fn string(&self, key: &str) -> Result<String, RecordError> {
        self.obj.string(key).map_err(from_decode(self.record))
    }

    fn opt_string(&self, key: &str) -> Result<Option<String>, RecordError> {
        self.obj.opt_string(key).map_err(from_decode(self.record))
    }

    fn positive(&self, key: &str) -> Result<NonZeroU64, RecordError> {
        let n = self.obj.positive(key).map_err(from_decode(self.record))?;
        NonZeroU64::new(n).ok_or_else(|| fail(self.record, format!("{key} must be positive")))
    }

    fn unsigned(&self, key: &str) -> Result<u64, RecordError> {
        match self.member(key) {
            None => Err(fail(self.record, format!("missing {key}"))),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| fail(self.record, format!("{key} must be an unsigned integer"))),
        }
    }

    fn boolean(&self, key: &str) -> Result<bool, RecordError> {
        self.obj
            .opt_bool(key)
            .map_err(from_decode(self.record))?
            .ok_or_else(|| fail(self.record, format!("missing {key}")))
    }

    fn opt_boolean(&self, key: &str) -> Result<Option<bool>, RecordError> {
        self.obj.opt_bool(key).map_err(from_decode(self.record))
    }

    fn timestamp(&self, key: &str) -> Result<Timestamp, RecordError> {
        let text = self.string(key)?;
        Timestamp::parse(&text).map_err(|e| fail(self.record, format!("{key}: {e}")))
    }

    fn id<T>(
        &self,
        key: &str,
        make: impl Fn(String) -> Result<T, sessionstore::StoreError>,
    ) -> Result<T, RecordError> {
        let text = self.string(key)?;
        make(text).map_err(|e| fail(self.record, e.to_string()))
    }

    fn opt_id<T>(
        &self,
        key: &str,
        make: impl Fn(String) -> Result<T, sessionstore::StoreError>,
    ) -> Result<Option<T>, RecordError> {
        match self.opt_string(key)? {
            None => Ok(None),
            Some(text) => make(text)
                .map(Some)
                .map_err(|e| fail(self.record, e.to_string())),
        }
    }

    fn text_id<T>(
        &self,
        key: &str,
        make: impl Fn(String) -> Result<T, RecordError>,
    ) -> Result<T, RecordError> {
        make(self.string(key)?)
    }

    fn scope(&self) -> Result<Option<SessionScope>, RecordError> {
        let tenant = self.opt_id("tenant_id", TenantId::new)?;
        let session = self.opt_id("session_id", SessionId::new)?;
        match (tenant, session) {
            (Some(tenant_id), Some(session_id)) => Ok(Some(SessionScope {
                tenant_id,
                session_id,
            })),
            (None, None) => Ok(None),
            _ => Err(fail(
                self.record,
                "tenant_id and session_id come together or not at all",
            )),
        }
    }
}

/// The `data` of a connect command: which HostLink wire versions the client speaks.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConnectData {
    /// Non-empty, no 0, no duplicates, in the client's order.
    pub supported_versions: Vec<NonZeroU64>,
}

impl ConnectData {
    const NAME: &'static str = "connect_data";

    /// Whether the client offers this build's wire version.
    pub fn offers_wire_version(&self) -> bool {
        self.supported_versions
            .iter()
            .any(|v| v.get() == WIRE_VERSION)
    }

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<ConnectData, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, &["supported_versions"])?;
        let list = match r.member("supported_versions") {
            None => return Err(fail(Self::NAME, "missing supported_versions")),
            Some(Value::Array(list)) => list,
            Some(_) => return Err(fail(Self::NAME, "supported_versions must be a list")),
        };
        if list.is_empty() {
            return Err(fail(Self::NAME, "supported_versions must not be empty"));
        }
        if list.len() > MAX_SUPPORTED_VERSIONS {
            return Err(fail(Self::NAME, "supported_versions is too long"));
        }
        let mut versions: Vec<NonZeroU64> = Vec::with_capacity(list.len());
        for v in list {
            let n = v
                .as_u64()
                .and_then(NonZeroU64::new)
                .ok_or_else(|| fail(Self::NAME, "a version must be a positive integer"))?;
            if versions.contains(&n) {
                return Err(fail(Self::NAME, "supported_versions has a duplicate"));
            }
            versions.push(n);
        }
        Ok(ConnectData {
            supported_versions: versions,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .numbers(
                "supported_versions",
                self.supported_versions.iter().map(|v| v.get()),
            )
            .finish()
    }
}

/// How an attach asks for the session (the Host decides create vs restore from the journal).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AttachMode {
    Create,
    Restore,
}

impl AttachMode {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Create => "create",
            AttachMode::Restore => "restore",
        }
    }

    fn parse(record: &'static str, s: &str) -> Result<AttachMode, RecordError> {
        match s {
            "create" => Ok(AttachMode::Create),
            "restore" => Ok(AttachMode::Restore),
            _ => Err(fail(record, "mode must be create or restore")),
        }
    }
}

/// `hostlink.attach`: make the session resident here.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AttachRequest {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub agent_id: AgentId,
    pub runtime_compatibility_id: CompatibilityId,
    pub mode: AttachMode,
    pub actor_id: ActorId,
    pub trace_id: Option<TraceId>,
    pub idempotency_key: IdempotencyKey,
}

impl AttachRequest {
    const NAME: &'static str = "attach_request";
    const MEMBERS: &'static [&'static str] = &[
        "version",
        "tenant_id",
        "session_id",
        "host_id",
        "host_generation",
        "agent_id",
        "runtime_compatibility_id",
        "mode",
        "actor_id",
        "trace_id",
        "idempotency_key",
    ];

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<AttachRequest, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        r.version()?;
        Ok(AttachRequest {
            tenant_id: r.id("tenant_id", TenantId::new)?,
            session_id: r.id("session_id", SessionId::new)?,
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            agent_id: r.id("agent_id", AgentId::new)?,
            runtime_compatibility_id: r.id("runtime_compatibility_id", CompatibilityId::new)?,
            mode: AttachMode::parse(Self::NAME, &r.string("mode")?)?,
            actor_id: r.text_id("actor_id", ActorId::new)?,
            trace_id: match r.opt_string("trace_id")? {
                None => None,
                Some(t) => Some(TraceId::new(t)?),
            },
            idempotency_key: r.text_id("idempotency_key", IdempotencyKey::new)?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        let mut w = ObjectWriter::new();
        w.number("version", WIRE_VERSION)
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .string("agent_id", self.agent_id.as_str())
            .string(
                "runtime_compatibility_id",
                self.runtime_compatibility_id.as_str(),
            )
            .string("mode", self.mode.as_str())
            .string("actor_id", self.actor_id.as_str());
        if let Some(t) = &self.trace_id {
            w.string("trace_id", t.as_str());
        }
        w.string("idempotency_key", self.idempotency_key.as_str())
            .finish()
    }
}

/// `hostlink.bind`: route this link to a resident session. Grants nothing.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BindRequest {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub lease_epoch: NonZeroU64,
    pub runtime_compatibility_id: CompatibilityId,
    pub idempotency_key: IdempotencyKey,
}

impl BindRequest {
    const NAME: &'static str = "bind_request";
    const MEMBERS: &'static [&'static str] = &[
        "version",
        "tenant_id",
        "session_id",
        "host_id",
        "host_generation",
        "lease_epoch",
        "runtime_compatibility_id",
        "idempotency_key",
    ];

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<BindRequest, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        r.version()?;
        Ok(BindRequest {
            tenant_id: r.id("tenant_id", TenantId::new)?,
            session_id: r.id("session_id", SessionId::new)?,
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            lease_epoch: r.positive("lease_epoch")?,
            runtime_compatibility_id: r.id("runtime_compatibility_id", CompatibilityId::new)?,
            idempotency_key: r.text_id("idempotency_key", IdempotencyKey::new)?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .number("version", WIRE_VERSION)
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .number("lease_epoch", self.lease_epoch.get())
            .string(
                "runtime_compatibility_id",
                self.runtime_compatibility_id.as_str(),
            )
            .string("idempotency_key", self.idempotency_key.as_str())
            .finish()
    }
}

/// `hostlink.unbind`: drop this link's route to a session. Idempotent; never releases
/// residency.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UnbindRequest {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub lease_epoch: NonZeroU64,
    pub idempotency_key: IdempotencyKey,
}

impl UnbindRequest {
    const NAME: &'static str = "unbind_request";
    const MEMBERS: &'static [&'static str] = &[
        "version",
        "tenant_id",
        "session_id",
        "host_id",
        "host_generation",
        "lease_epoch",
        "idempotency_key",
    ];

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<UnbindRequest, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        r.version()?;
        Ok(UnbindRequest {
            tenant_id: r.id("tenant_id", TenantId::new)?,
            session_id: r.id("session_id", SessionId::new)?,
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            lease_epoch: r.positive("lease_epoch")?,
            idempotency_key: r.text_id("idempotency_key", IdempotencyKey::new)?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .number("version", WIRE_VERSION)
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .number("lease_epoch", self.lease_epoch.get())
            .string("idempotency_key", self.idempotency_key.as_str())
            .finish()
    }
}

/// A tenant and one of its sessions, named together (drain scope, drain observation).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SessionScope {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
}

/// `hostlink.drain` and `hostlink.drain_status`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DrainRequest {
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub idempotency_key: IdempotencyKey,
    /// `None` is the whole-Host scope, which no tenant-authenticated link may ask for.
    pub scope: Option<SessionScope>,
}

impl DrainRequest {
    const NAME: &'static str = "drain_request";
    const MEMBERS: &'static [&'static str] = &[
        "version",
        "host_id",
        "host_generation",
        "idempotency_key",
        "tenant_id",
        "session_id",
    ];

    /// Decodes strictly (`tenant_id` and `session_id` together or not at all).
    pub fn decode(bytes: &[u8]) -> Result<DrainRequest, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        r.version()?;
        Ok(DrainRequest {
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            idempotency_key: r.text_id("idempotency_key", IdempotencyKey::new)?,
            scope: r.scope()?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        let mut w = ObjectWriter::new();
        w.number("version", WIRE_VERSION)
            .string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .string("idempotency_key", self.idempotency_key.as_str());
        if let Some(s) = &self.scope {
            w.string("tenant_id", s.tenant_id.as_str())
                .string("session_id", s.session_id.as_str());
        }
        w.finish()
    }
}

/// A delivery: published on the session channel to wake the session's consumer. The command
/// itself is already in the durable inbox.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Delivery {
    pub command_id: CommandId,
}

impl Delivery {
    const NAME: &'static str = "delivery";

    /// Decodes strictly; a `version` member, if present, must be 1.
    pub fn decode(bytes: &[u8]) -> Result<Delivery, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, &["version", "command_id"])?;
        r.optional_version()?;
        Ok(Delivery {
            command_id: r.id("command_id", CommandId::new)?,
        })
    }

    /// Encodes as `{"command_id":"..."}`.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .string("command_id", self.command_id.as_str())
            .finish()
    }
}

fn parse_placement(record: &'static str, s: &str) -> Result<Placement, RecordError> {
    Placement::ALL
        .iter()
        .copied()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| fail(record, "placement must be pooled or dedicated"))
}

fn parse_residency(record: &'static str, s: &str) -> Result<ResidencyState, RecordError> {
    ResidencyState::ALL
        .iter()
        .copied()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| fail(record, "unknown residency"))
}

/// What `hostlink.attach` answers: the session's registration as this Host sees it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegistryObservation {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub agent_id: AgentId,
    pub runtime_compatibility_id: CompatibilityId,
    pub placement: Placement,
    pub internal_endpoint: String,
    pub residency: ResidencyState,
    pub accepting: bool,
    pub lease_epoch: NonZeroU64,
    pub observed_at: Timestamp,
    pub expires_at: Timestamp,
}

impl RegistryObservation {
    const NAME: &'static str = "registry_observation";
    const MEMBERS: &'static [&'static str] = &[
        "version",
        "tenant_id",
        "session_id",
        "host_id",
        "host_generation",
        "agent_id",
        "runtime_compatibility_id",
        "placement",
        "internal_endpoint",
        "residency",
        "accepting",
        "lease_epoch",
        "observed_at",
        "expires_at",
    ];

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<RegistryObservation, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        r.version()?;
        let internal_endpoint = r.string("internal_endpoint")?;
        if internal_endpoint.is_empty() || internal_endpoint.len() > MAX_ENDPOINT_BYTES {
            return Err(fail(Self::NAME, "internal_endpoint must be 1-2048 bytes"));
        }
        Ok(RegistryObservation {
            tenant_id: r.id("tenant_id", TenantId::new)?,
            session_id: r.id("session_id", SessionId::new)?,
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            agent_id: r.id("agent_id", AgentId::new)?,
            runtime_compatibility_id: r.id("runtime_compatibility_id", CompatibilityId::new)?,
            placement: parse_placement(Self::NAME, &r.string("placement")?)?,
            internal_endpoint,
            residency: parse_residency(Self::NAME, &r.string("residency")?)?,
            accepting: r.boolean("accepting")?,
            lease_epoch: r.positive("lease_epoch")?,
            observed_at: r.timestamp("observed_at")?,
            expires_at: r.timestamp("expires_at")?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .number("version", WIRE_VERSION)
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .string("agent_id", self.agent_id.as_str())
            .string(
                "runtime_compatibility_id",
                self.runtime_compatibility_id.as_str(),
            )
            .string("placement", self.placement.as_str())
            .string("internal_endpoint", &self.internal_endpoint)
            .string("residency", self.residency.as_str())
            .boolean("accepting", self.accepting)
            .number("lease_epoch", self.lease_epoch.get())
            .string("observed_at", &self.observed_at.to_string())
            .string("expires_at", &self.expires_at.to_string())
            .finish()
    }
}

/// Where a drain is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum DrainState {
    Draining,
    Drained,
}

impl DrainState {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainState::Draining => "draining",
            DrainState::Drained => "drained",
        }
    }
}

/// What `hostlink.drain` and `hostlink.drain_status` answer.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DrainObservation {
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub drain_generation: NonZeroU64,
    pub state: DrainState,
    pub scope: Option<SessionScope>,
}

impl DrainObservation {
    const NAME: &'static str = "drain_observation";
    const MEMBERS: &'static [&'static str] = &[
        "host_id",
        "host_generation",
        "drain_generation",
        "state",
        "tenant_id",
        "session_id",
    ];

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<DrainObservation, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        let state = match r.string("state")?.as_str() {
            "draining" => DrainState::Draining,
            "drained" => DrainState::Drained,
            _ => return Err(fail(Self::NAME, "state must be draining or drained")),
        };
        Ok(DrainObservation {
            host_id: r.id("host_id", HostId::new)?,
            host_generation: r.positive("host_generation")?,
            drain_generation: r.positive("drain_generation")?,
            state,
            scope: r.scope()?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        let mut w = ObjectWriter::new();
        w.string("host_id", self.host_id.as_str())
            .number("host_generation", self.host_generation.get())
            .number("drain_generation", self.drain_generation.get())
            .string("state", self.state.as_str());
        if let Some(s) = &self.scope {
            w.string("tenant_id", s.tenant_id.as_str())
                .string("session_id", s.session_id.as_str());
        }
        w.finish()
    }
}

/// A HostLink refusal: the data of a *successful* RPC reply. The extra member exists only
/// (and always) where its code needs it, so a record that breaks the rule cannot be built.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum HostLinkError {
    NotAdmitting,
    Releasing,
    NoCapacity,
    /// The other holder's epoch on attach; never bind with it.
    EpochMismatch {
        current_lease_epoch: NonZeroU64,
    },
    RuntimeMismatch {
        runtime_compatibility_id: CompatibilityId,
    },
    RuntimeUnavailable,
}

impl HostLinkError {
    const NAME: &'static str = "error";

    /// The record's code.
    pub fn code(&self) -> HostLinkErrorCode {
        match self {
            HostLinkError::NotAdmitting => HostLinkErrorCode::NotAdmitting,
            HostLinkError::Releasing => HostLinkErrorCode::Releasing,
            HostLinkError::NoCapacity => HostLinkErrorCode::NoCapacity,
            HostLinkError::EpochMismatch { .. } => HostLinkErrorCode::EpochMismatch,
            HostLinkError::RuntimeMismatch { .. } => HostLinkErrorCode::RuntimeMismatch,
            HostLinkError::RuntimeUnavailable => HostLinkErrorCode::RuntimeUnavailable,
        }
    }

    /// Decodes strictly: the extra member is refused where the code does not take it and
    /// required where it does.
    pub fn decode(bytes: &[u8]) -> Result<HostLinkError, RecordError> {
        let r = Reader::parse(
            Self::NAME,
            bytes,
            &["code", "current_lease_epoch", "runtime_compatibility_id"],
        )?;
        let code: HostLinkErrorCode = r
            .string("code")?
            .parse()
            .map_err(|_| fail(Self::NAME, "unknown code"))?;
        let has_epoch = r.member("current_lease_epoch").is_some();
        let has_build = r.member("runtime_compatibility_id").is_some();
        let error = match code {
            HostLinkErrorCode::EpochMismatch => {
                if has_build {
                    return Err(fail(
                        Self::NAME,
                        "runtime_compatibility_id is not allowed here",
                    ));
                }
                HostLinkError::EpochMismatch {
                    current_lease_epoch: r.positive("current_lease_epoch")?,
                }
            }
            HostLinkErrorCode::RuntimeMismatch => {
                if has_epoch {
                    return Err(fail(Self::NAME, "current_lease_epoch is not allowed here"));
                }
                HostLinkError::RuntimeMismatch {
                    runtime_compatibility_id: r
                        .id("runtime_compatibility_id", CompatibilityId::new)?,
                }
            }
            other => {
                if has_epoch || has_build {
                    return Err(fail(Self::NAME, "only code is allowed for this code"));
                }
                match other {
                    HostLinkErrorCode::NotAdmitting => HostLinkError::NotAdmitting,
                    HostLinkErrorCode::Releasing => HostLinkError::Releasing,
                    HostLinkErrorCode::NoCapacity => HostLinkError::NoCapacity,
                    _ => HostLinkError::RuntimeUnavailable,
                }
            }
        };
        Ok(error)
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        let mut w = ObjectWriter::new();
        w.string("code", self.code().as_str());
        match self {
            HostLinkError::EpochMismatch {
                current_lease_epoch,
            } => {
                w.number("current_lease_epoch", current_lease_epoch.get());
            }
            HostLinkError::RuntimeMismatch {
                runtime_compatibility_id,
            } => {
                w.string(
                    "runtime_compatibility_id",
                    runtime_compatibility_id.as_str(),
                );
            }
            _ => {}
        }
        w.finish()
    }
}

/// The `data` of a subscribe to a session channel (optional): the preview opt-in.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SubscribeOptions {
    /// Push `ephemeral_publication` previews too (default false).
    pub ephemeral: bool,
}

impl SubscribeOptions {
    const NAME: &'static str = "subscribe_options";

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<SubscribeOptions, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, &["version", "ephemeral"])?;
        r.version()?;
        Ok(SubscribeOptions {
            ephemeral: r.opt_boolean("ephemeral")?.unwrap_or(false),
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .number("version", WIRE_VERSION)
            .boolean("ephemeral", self.ephemeral)
            .finish()
    }
}

/// A committed journal event, pushed on the session channel. The body is kept as the exact
/// JSON text it was given (member order and every byte). On the wire the one exception is a
/// raw line break, which in JSON can only be insignificant whitespace: the frame encoder turns
/// it into a space because Centrifuge batching is line-delimited.
#[derive(Clone, Debug)]
pub struct EnduringPublication {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub event_id: EventId,
    pub journal_seq: NonZeroU64,
    /// The journal sequence the relay had covered when this event was published.
    pub covered_through: u64,
    body: Box<RawValue>,
}

impl PartialEq for EnduringPublication {
    fn eq(&self, other: &Self) -> bool {
        self.tenant_id == other.tenant_id
            && self.session_id == other.session_id
            && self.event_id == other.event_id
            && self.journal_seq == other.journal_seq
            && self.covered_through == other.covered_through
            && self.body.get() == other.body.get()
    }
}

impl Eq for EnduringPublication {}

impl EnduringPublication {
    const NAME: &'static str = "enduring_publication";
    const MEMBERS: &'static [&'static str] = &[
        "tenant_id",
        "session_id",
        "event_id",
        "journal_seq",
        "covered_through",
        "body",
    ];

    /// Builds one; the body must be JSON other than `null` (it is emitted as given).
    pub fn new(
        tenant_id: TenantId,
        session_id: SessionId,
        event_id: EventId,
        journal_seq: NonZeroU64,
        covered_through: u64,
        body: Box<RawValue>,
    ) -> Result<EnduringPublication, RecordError> {
        if is_null(&body) {
            return Err(fail(Self::NAME, "body must not be null"));
        }
        Ok(EnduringPublication {
            tenant_id,
            session_id,
            event_id,
            journal_seq,
            covered_through,
            body,
        })
    }

    /// The body, exactly as given.
    pub fn body(&self) -> &RawValue {
        &self.body
    }

    /// Decodes strictly, keeping the body's bytes.
    pub fn decode(bytes: &[u8]) -> Result<EnduringPublication, RecordError> {
        let r = Reader::parse(Self::NAME, bytes, Self::MEMBERS)?;
        let mut raw = RawObject::parse(bytes).map_err(|e| fail(Self::NAME, e.0))?;
        let body = raw
            .take("body")
            .ok_or_else(|| fail(Self::NAME, "missing body"))?;
        EnduringPublication::new(
            r.id("tenant_id", TenantId::new)?,
            r.id("session_id", SessionId::new)?,
            r.id("event_id", EventId::new)?,
            r.positive("journal_seq")?,
            r.unsigned("covered_through")?,
            body,
        )
    }

    /// Encodes with the fixed member order; the body byte for byte.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("event_id", self.event_id.as_str())
            .number("journal_seq", self.journal_seq.get())
            .number("covered_through", self.covered_through)
            .raw("body", self.body.get())
            .finish()
    }
}

/// Which live text a preview belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PreviewStream {
    /// The model's visible answer text.
    Text,
    /// Visible model reasoning.
    Reasoning,
}

impl PreviewStream {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            PreviewStream::Text => "text",
            PreviewStream::Reasoning => "reasoning",
        }
    }
}

/// A live text preview (token deltas merged in a flush window): transient, never retried,
/// superseded by the next enduring record.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EphemeralPublication {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub stream: PreviewStream,
    /// The delta (non-empty, at most [`MAX_PREVIEW_TEXT_BYTES`]).
    pub text: String,
    /// True when preview text before this one was dropped on this link.
    pub gap: bool,
}

impl EphemeralPublication {
    const NAME: &'static str = "ephemeral_publication";

    /// A delta as a runtime produces it (no gap).
    pub fn delta(
        tenant_id: TenantId,
        session_id: SessionId,
        stream: PreviewStream,
        text: impl Into<String>,
    ) -> EphemeralPublication {
        EphemeralPublication {
            tenant_id,
            session_id,
            stream,
            text: text.into(),
            gap: false,
        }
    }

    /// Decodes strictly.
    pub fn decode(bytes: &[u8]) -> Result<EphemeralPublication, RecordError> {
        let r = Reader::parse(
            Self::NAME,
            bytes,
            &["tenant_id", "session_id", "stream", "text", "gap"],
        )?;
        let stream = match r.string("stream")?.as_str() {
            "text" => PreviewStream::Text,
            "reasoning" => PreviewStream::Reasoning,
            _ => return Err(fail(Self::NAME, "stream must be text or reasoning")),
        };
        let text = r.string("text")?;
        if text.is_empty() || text.len() > MAX_PREVIEW_TEXT_BYTES {
            return Err(fail(Self::NAME, "text must be 1-65536 bytes"));
        }
        Ok(EphemeralPublication {
            tenant_id: r.id("tenant_id", TenantId::new)?,
            session_id: r.id("session_id", SessionId::new)?,
            stream,
            text,
            gap: r.boolean("gap")?,
        })
    }

    /// Encodes with the fixed member order.
    pub fn encode(&self) -> String {
        ObjectWriter::new()
            .string("tenant_id", self.tenant_id.as_str())
            .string("session_id", self.session_id.as_str())
            .string("stream", self.stream.as_str())
            .string("text", &self.text)
            .boolean("gap", self.gap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip<T: PartialEq + std::fmt::Debug>(
        bytes: &[u8],
        decode: fn(&[u8]) -> Result<T, RecordError>,
        encode: fn(&T) -> String,
    ) {
        if let Ok(record) = decode(bytes) {
            let text = encode(&record);
            let again = decode(text.as_bytes()).unwrap();
            assert_eq!(again, record);
            assert_eq!(encode(&again), text);
        }
    }

    fn every_decoder(bytes: &[u8]) {
        roundtrip(bytes, ConnectData::decode, ConnectData::encode);
        roundtrip(bytes, AttachRequest::decode, AttachRequest::encode);
        roundtrip(bytes, BindRequest::decode, BindRequest::encode);
        roundtrip(bytes, UnbindRequest::decode, UnbindRequest::encode);
        roundtrip(bytes, DrainRequest::decode, DrainRequest::encode);
        roundtrip(bytes, Delivery::decode, Delivery::encode);
        roundtrip(
            bytes,
            RegistryObservation::decode,
            RegistryObservation::encode,
        );
        roundtrip(bytes, DrainObservation::decode, DrainObservation::encode);
        roundtrip(bytes, HostLinkError::decode, HostLinkError::encode);
        roundtrip(bytes, SubscribeOptions::decode, SubscribeOptions::encode);
        roundtrip(
            bytes,
            EnduringPublication::decode,
            EnduringPublication::encode,
        );
        roundtrip(
            bytes,
            EphemeralPublication::decode,
            EphemeralPublication::encode,
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_a_record_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            every_decoder(&bytes);
        }

        #[test]
        fn mutated_records_decode_or_refuse_and_what_decodes_round_trips(
            which in 0usize..4,
            at in 0usize..400,
            byte in any::<u8>(),
        ) {
            let samples = [
                r#"{"version":1,"tenant_id":"t","session_id":"s","host_id":"h","host_generation":1,"lease_epoch":2,"runtime_compatibility_id":"b","idempotency_key":"k"}"#,
                r#"{"tenant_id":"t","session_id":"s","event_id":"e","journal_seq":1,"covered_through":1,"body":{"a":[1,{"b":2}]}}"#,
                r#"{"code":"epoch_mismatch","current_lease_epoch":4}"#,
                r#"{"version":1,"host_id":"h","host_generation":1,"idempotency_key":"k","tenant_id":"t","session_id":"s"}"#,
            ];
            let mut bytes = samples[which].as_bytes().to_vec();
            let at = at % bytes.len();
            bytes[at] = byte;
            every_decoder(&bytes);
            every_decoder(samples[which].as_bytes());
        }
    }

    fn nz(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).unwrap()
    }

    fn bind() -> BindRequest {
        BindRequest {
            tenant_id: TenantId::new("t").unwrap(),
            session_id: SessionId::new("s").unwrap(),
            host_id: HostId::new("h").unwrap(),
            host_generation: nz(3),
            lease_epoch: nz(9),
            runtime_compatibility_id: CompatibilityId::new("build-1").unwrap(),
            idempotency_key: IdempotencyKey::new("k").unwrap(),
        }
    }

    #[test]
    fn a_bind_request_encodes_in_wire_order_and_decodes_back() {
        let text = bind().encode();
        assert_eq!(
            text,
            r#"{"version":1,"tenant_id":"t","session_id":"s","host_id":"h","host_generation":3,"lease_epoch":9,"runtime_compatibility_id":"build-1","idempotency_key":"k"}"#
        );
        assert_eq!(BindRequest::decode(text.as_bytes()), Ok(bind()));
    }

    #[test]
    fn a_bind_request_refuses_every_kind_of_malformation() {
        let good = bind().encode();
        let cases = [
            good.replace(r#""version":1"#, r#""version":2"#),
            good.replace(r#""version":1,"#, ""),
            good.replace(r#""lease_epoch":9"#, r#""lease_epoch":0"#),
            good.replace(r#""lease_epoch":9"#, r#""lease_epoch":null"#),
            good.replace(r#""lease_epoch":9"#, r#""lease_epoch":9.0"#),
            good.replace(r#""lease_epoch":9"#, r#""lease_epoch":-9"#),
            good.replace(r#""host_generation":3"#, r#""host_generation":0"#),
            good.replace(r#""tenant_id":"t""#, r#""tenant_id":"""#),
            good.replace(r#""tenant_id":"t""#, r#""tenant_id":"a\u0000b""#),
            good.replace(
                r#""tenant_id":"t""#,
                &format!(r#""tenant_id":"{}""#, "x".repeat(257)),
            ),
            good.replace(
                r#""idempotency_key":"k""#,
                r#""idempotency_key":"k","extra":1"#,
            ),
            good.replace(
                r#""idempotency_key":"k""#,
                r#""idempotency_key":"k","tenant_id":"t""#,
            ),
            format!("{good} {{}}"),
            format!("{good}x"),
            "[]".into(),
            String::new(),
        ];
        for bad in cases {
            assert!(BindRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn connect_data_refuses_empty_zero_and_duplicate_versions() {
        let ok = ConnectData::decode(br#"{"supported_versions":[2,1]}"#).unwrap();
        assert!(ok.offers_wire_version());
        let no_one = ConnectData::decode(br#"{"supported_versions":[2]}"#).unwrap();
        assert!(!no_one.offers_wire_version());
        for bad in [
            &br#"{"supported_versions":[]}"#[..],
            br#"{"supported_versions":[0]}"#,
            br#"{"supported_versions":[1,1]}"#,
            br#"{"supported_versions":["1"]}"#,
            br#"{"supported_versions":null}"#,
            br#"{"supported_versions":[1],"x":1}"#,
            br#"{}"#,
        ] {
            assert!(
                ConnectData::decode(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_drain_scope_names_tenant_and_session_together_or_not_at_all() {
        let base = r#"{"version":1,"host_id":"h","host_generation":1,"idempotency_key":"k""#;
        let whole = DrainRequest::decode(format!("{base}}}").as_bytes()).unwrap();
        assert_eq!(whole.scope, None);
        let scoped = DrainRequest::decode(
            format!(r#"{base},"tenant_id":"t","session_id":"s"}}"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(
            scoped.encode(),
            format!(r#"{base},"tenant_id":"t","session_id":"s"}}"#)
        );
        assert!(DrainRequest::decode(format!(r#"{base},"tenant_id":"t"}}"#).as_bytes()).is_err());
        assert!(DrainRequest::decode(format!(r#"{base},"session_id":"s"}}"#).as_bytes()).is_err());
    }

    #[test]
    fn the_error_record_carries_its_extra_member_only_and_always_with_its_code() {
        let e = HostLinkError::EpochMismatch {
            current_lease_epoch: nz(4),
        };
        assert_eq!(
            e.encode(),
            r#"{"code":"epoch_mismatch","current_lease_epoch":4}"#
        );
        assert_eq!(HostLinkError::decode(e.encode().as_bytes()), Ok(e));
        let m = HostLinkError::RuntimeMismatch {
            runtime_compatibility_id: CompatibilityId::new("b2").unwrap(),
        };
        assert_eq!(
            m.encode(),
            r#"{"code":"runtime_mismatch","runtime_compatibility_id":"b2"}"#
        );
        assert_eq!(HostLinkError::decode(m.encode().as_bytes()), Ok(m));
        assert_eq!(
            HostLinkError::RuntimeUnavailable.encode(),
            r#"{"code":"runtime_unavailable"}"#
        );
        for bad in [
            &br#"{"code":"epoch_mismatch"}"#[..],
            br#"{"code":"epoch_mismatch","current_lease_epoch":0}"#,
            br#"{"code":"epoch_mismatch","current_lease_epoch":1,"runtime_compatibility_id":"b"}"#,
            br#"{"code":"runtime_mismatch"}"#,
            br#"{"code":"runtime_mismatch","runtime_compatibility_id":"b","current_lease_epoch":1}"#,
            br#"{"code":"no_capacity","current_lease_epoch":1}"#,
            br#"{"code":"runtime_unavailable","runtime_compatibility_id":"b"}"#,
            br#"{"code":"invalid"}"#,
        ] {
            assert!(HostLinkError::decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_enduring_publication_keeps_its_body_byte_for_byte() {
        let body = r#"{"z": 1, "a":[ true ,"é\u00e9"], "dup":1, "dup":2}"#;
        let text = format!(
            r#"{{"tenant_id":"t","session_id":"s","event_id":"e","journal_seq":5,"covered_through":7,"body":{body}}}"#
        );
        let p = EnduringPublication::decode(text.as_bytes()).unwrap();
        assert_eq!(p.body().get(), body);
        assert_eq!(p.encode(), text);
        let zero = text.replace(r#""journal_seq":5"#, r#""journal_seq":0"#);
        assert!(EnduringPublication::decode(zero.as_bytes()).is_err());
        let null = text.replace(body, "null");
        assert!(EnduringPublication::decode(null.as_bytes()).is_err());
    }

    #[test]
    fn a_registry_observation_round_trips_with_rfc3339_times() {
        let o = RegistryObservation {
            tenant_id: TenantId::new("t").unwrap(),
            session_id: SessionId::new("s").unwrap(),
            host_id: HostId::new("h").unwrap(),
            host_generation: nz(2),
            agent_id: AgentId::new("a").unwrap(),
            runtime_compatibility_id: CompatibilityId::new("b").unwrap(),
            placement: Placement::Pooled,
            internal_endpoint: "ws://h:9".into(),
            residency: ResidencyState::Resident,
            accepting: true,
            lease_epoch: nz(7),
            observed_at: Timestamp::from_unix_millis(1_700_000_000_000).unwrap(),
            expires_at: Timestamp::from_unix_millis(1_700_000_020_500).unwrap(),
        };
        let text = o.encode();
        assert!(text.ends_with(
            r#""lease_epoch":7,"observed_at":"2023-11-14T22:13:20Z","expires_at":"2023-11-14T22:13:40.500Z"}"#
        ));
        assert_eq!(RegistryObservation::decode(text.as_bytes()), Ok(o));
        let offset = text.replace("22:13:20Z", "22:13:20+00:00");
        assert!(RegistryObservation::decode(offset.as_bytes()).is_err());
    }

    #[test]
    fn a_delivery_is_its_command_id_alone() {
        let d = Delivery::decode(br#"{"command_id":"c1"}"#).unwrap();
        assert_eq!(d.encode(), r#"{"command_id":"c1"}"#);
        assert!(Delivery::decode(br#"{"version":1,"command_id":"c1"}"#).is_ok());
        assert!(Delivery::decode(br#"{"version":2,"command_id":"c1"}"#).is_err());
        assert!(Delivery::decode(br#"{"command_id":""}"#).is_err());
        assert!(Delivery::decode(br#"{"command_id":"c1","x":null}"#).is_err());
    }
}
