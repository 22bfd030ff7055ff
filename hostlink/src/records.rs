//! HostLink records: every object carried in a command's `data`, an RPC reply or a push.
//! Each record is a serde type whose fields are its members in wire order, so its decoding and
//! encoding are derived from one declaration. Owns their strictness (one object, no duplicate
//! or unknown members, no trailing data, `null` refused, `version` exactly 1 where a record is
//! versioned, zero epochs and generations refused, ids by the id rule, and the few rules
//! between members checked after decoding). Never performs I/O and never decides what a
//! request means.
//!
//! | record | members, in wire order |
//! |---|---|
//! | [`ConnectData`] | `supported_versions`, `traceparent`?, `tracestate`? (the link's trace context) |
//! | [`AttachRequest`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `agent_id`, `runtime_compatibility_id`?, `mode`, `actor_id`, `trace_id`?, `traceparent`?, `tracestate`?, `idempotency_key` |
//! | [`BindRequest`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `lease_epoch`, `runtime_compatibility_id`, `idempotency_key` |
//! | [`UnbindRequest`] | the bind members minus `runtime_compatibility_id` |
//! | [`DrainRequest`] | `version`, `host_id`, `host_generation`, `idempotency_key`, [`tenant_id`, `session_id`] |
//! | [`Delivery`] | `command_id`, `traceparent`?, `tracestate`? (a `version` of 1 is accepted, never written) |
//! | [`RegistryObservation`] | `version`, `tenant_id`, `session_id`, `host_id`, `host_generation`, `agent_id`, `runtime_compatibility_id`, `placement`, `internal_endpoint`, `residency`, `accepting`, `lease_epoch`, `observed_at`, `expires_at` |
//! | [`DrainObservation`] | `host_id`, `host_generation`, `drain_generation`, `state`, [`tenant_id`, `session_id`] |
//! | [`HostLinkError`] | `code`, and `current_lease_epoch` (only with `epoch_mismatch`, absent when the holder's epoch was unreadable) or `runtime_compatibility_id` (only and always with `runtime_mismatch`) |
//! | [`SubscribeOptions`] | `version`, `ephemeral`?, `reasoning`?, `tool_steps`? (these two need `ephemeral`), `bind`? (a [`BindRequest`]) |
//! | [`EnduringPublication`] | `tenant_id`, `session_id`, `event_id`, `journal_seq`, `covered_through`, `body` |
//! | [`EphemeralPublication`] | `tenant_id`, `session_id`, `stream`, `text`, `gap`, `tool` (only and always with stream `tool_step`: `call_id`, `name`, `phase`, `is_error`?) |
//!
//! `traceparent` and `tracestate` are W3C trace context (the `trace-context` crate parses
//! them): a malformed one refuses the whole record, and a `tracestate` without a
//! `traceparent` is refused. A request's own context wins over its link's.
//!
//! `SubscribeOptions` and `EphemeralPublication` are this module's design (HOSTLINK.md names
//! the opt-in and the preview but not their members): a client opts in to previews with
//! subscribe `data` `{"version":1,"ephemeral":true}` (answer text), adding `"reasoning":true`
//! for visible model reasoning and `"tool_steps":true` for each tool call's start (the tool's
//! audit summary or its name, never its arguments) and finish (at most 2 KiB of its result);
//! a preview carries the merged text delta of one `stream` (`text`, `reasoning`; a
//! `tool_step` is never merged) and `gap: true` when text before it was dropped (rate limit,
//! overflow) so a viewer knows the preview is incomplete until the next enduring record
//! supersedes it.

use std::num::NonZeroU64;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use sessionstore::ids::check_opaque_id;
use sessionstore::{
    AgentId, CommandId, CompatibilityId, EventId, HostId, Placement, ResidencyState, SessionId,
    TenantId,
};
use trace_context::{TraceContext, TraceParent, TraceState};
use wire_enum::wire_enum;

use super::codes::HostLinkErrorCode;
use super::json::is_null;
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

/// Decodes `bytes` as the record `record` through its serde derivation, strictly: exactly one
/// JSON object (a derived struct would also take a positional array) and no trailing data.
/// Unknown, duplicate and missing members are the derivation's to refuse.
pub(crate) fn decode_object<T: DeserializeOwned>(
    record: &'static str,
    bytes: &[u8],
) -> Result<T, RecordError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(fail(record, "not a single JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = T::deserialize(&mut de).map_err(|e| fail(record, e.to_string()))?;
    de.end()
        .map_err(|_| fail(record, "trailing data after the object"))?;
    Ok(value)
}

/// A record's wire name, its strict decoding and its encoding, all from its serde derivation.
trait Record: Serialize + DeserializeOwned {
    const NAME: &'static str;

    /// The rules between members that a field's type cannot say.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    fn decode_strict(bytes: &[u8]) -> Result<Self, RecordError> {
        let record: Self = decode_object(Self::NAME, bytes)?;
        record.check().map_err(|reason| fail(Self::NAME, reason))?;
        Ok(record)
    }

    fn encode_compact(&self) -> String {
        // Every member is a string, a number, a boolean or already-valid raw JSON.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// `decode` and `encode` as inherent methods (what callers and the fuzz targets name).
macro_rules! codec {
    ($($ty:ident),+ $(,)?) => {$(
        impl $ty {
            /// Decodes strictly.
            pub fn decode(bytes: &[u8]) -> Result<$ty, RecordError> {
                <$ty as Record>::decode_strict(bytes)
            }

            /// Encodes with the fixed member order.
            pub fn encode(&self) -> String {
                self.encode_compact()
            }
        }
    )+};
}

/// The `version` member: exactly 1 on the wire, both ways.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct V1;

impl Serialize for V1 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(WIRE_VERSION)
    }
}

impl<'de> Deserialize<'de> for V1 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<V1, D::Error> {
        match u64::deserialize(d)? {
            WIRE_VERSION => Ok(V1),
            _ => Err(serde::de::Error::custom("version must be 1")),
        }
    }
}

/// An optional member that, when present, must not be `null` (serde would read `null` as
/// absent). Used as `#[serde(default, deserialize_with = "present")]`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A `tracestate` is refused without the `traceparent` it belongs to.
pub(crate) fn check_trace(
    parent: &Option<TraceParent>,
    state: &Option<TraceState>,
) -> Result<(), String> {
    TraceContext::from_parts(*parent, state.clone())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

pub(crate) fn trace_of(
    parent: &Option<TraceParent>,
    state: &Option<TraceState>,
) -> Option<TraceContext> {
    parent.map(|parent| TraceContext {
        parent,
        state: state.clone(),
    })
}

macro_rules! opaque_text_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
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

        impl TryFrom<String> for $name {
            type Error = RecordError;
            fn try_from(value: String) -> Result<Self, RecordError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
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

/// The `data` of a connect command: which HostLink wire versions the client speaks.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectData {
    /// Non-empty, no 0, no duplicates, in the client's order.
    pub supported_versions: Vec<NonZeroU64>,
    /// W3C trace context: the caller's span every request of this link continues unless the request names its own (strictly parsed; a
    /// malformed one refuses the whole record).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl ConnectData {
    /// The link's trace context, if the client gave one.
    pub fn trace(&self) -> Option<TraceContext> {
        trace_of(&self.traceparent, &self.tracestate)
    }

    /// Whether the client offers this build's wire version.
    pub fn offers_wire_version(&self) -> bool {
        self.supported_versions
            .iter()
            .any(|v| v.get() == WIRE_VERSION)
    }
}

impl Record for ConnectData {
    const NAME: &'static str = "connect_data";

    fn check(&self) -> Result<(), String> {
        let v = &self.supported_versions;
        if v.is_empty() {
            return Err("supported_versions must not be empty".into());
        }
        if v.len() > MAX_SUPPORTED_VERSIONS {
            return Err("supported_versions is too long".into());
        }
        if v.iter().enumerate().any(|(i, x)| v[..i].contains(x)) {
            return Err("supported_versions has a duplicate".into());
        }
        check_trace(&self.traceparent, &self.tracestate)
    }
}

wire_enum! {
    /// How an attach asks for the session (the Host decides create vs restore from the
    /// journal).
    pub enum AttachMode {
        Create = "create",
        Restore = "restore",
    }
    serde;
}

/// `hostlink.attach`: make the session resident here.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub version: V1,
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub agent_id: AgentId,
    /// Optional; when present the Host refuses (`runtime_mismatch`) unless it equals the
    /// agent's runtime build and a resident session's.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_compatibility_id: Option<CompatibilityId>,
    pub mode: AttachMode,
    pub actor_id: ActorId,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub trace_id: Option<TraceId>,
    /// W3C trace context: the caller's span this work continues (strictly parsed; a
    /// malformed one refuses the whole record).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
    pub idempotency_key: IdempotencyKey,
}

impl AttachRequest {
    /// The caller's trace context, if it gave one.
    pub fn trace(&self) -> Option<TraceContext> {
        trace_of(&self.traceparent, &self.tracestate)
    }
}

impl Record for AttachRequest {
    const NAME: &'static str = "attach_request";

    fn check(&self) -> Result<(), String> {
        check_trace(&self.traceparent, &self.tracestate)
    }
}

/// `hostlink.bind`: route this link to a resident session. Grants nothing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindRequest {
    pub version: V1,
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub lease_epoch: NonZeroU64,
    pub runtime_compatibility_id: CompatibilityId,
    pub idempotency_key: IdempotencyKey,
}

impl Record for BindRequest {
    const NAME: &'static str = "bind_request";
}

/// `hostlink.unbind`: drop this link's route to a session. Idempotent; never releases
/// residency.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnbindRequest {
    pub version: V1,
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub lease_epoch: NonZeroU64,
    pub idempotency_key: IdempotencyKey,
}

impl Record for UnbindRequest {
    const NAME: &'static str = "unbind_request";
}

/// A tenant and one of its sessions, named together (drain scope, drain observation).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SessionScope {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
}

/// The two scope members as they travel: together or not at all.
fn scope_of(
    tenant_id: Option<TenantId>,
    session_id: Option<SessionId>,
) -> Result<Option<SessionScope>, &'static str> {
    match (tenant_id, session_id) {
        (Some(tenant_id), Some(session_id)) => Ok(Some(SessionScope {
            tenant_id,
            session_id,
        })),
        (None, None) => Ok(None),
        _ => Err("tenant_id and session_id come together or not at all"),
    }
}

fn scope_members(scope: Option<SessionScope>) -> (Option<TenantId>, Option<SessionId>) {
    match scope {
        Some(s) => (Some(s.tenant_id), Some(s.session_id)),
        None => (None, None),
    }
}

/// `hostlink.drain` and `hostlink.drain_status`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(try_from = "DrainRequestWire", into = "DrainRequestWire")]
pub struct DrainRequest {
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub idempotency_key: IdempotencyKey,
    /// `None` is the whole-Host scope, which no tenant-authenticated link may ask for.
    pub scope: Option<SessionScope>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainRequestWire {
    version: V1,
    host_id: HostId,
    host_generation: NonZeroU64,
    idempotency_key: IdempotencyKey,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    tenant_id: Option<TenantId>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    session_id: Option<SessionId>,
}

impl TryFrom<DrainRequestWire> for DrainRequest {
    type Error = &'static str;
    fn try_from(w: DrainRequestWire) -> Result<Self, &'static str> {
        Ok(DrainRequest {
            host_id: w.host_id,
            host_generation: w.host_generation,
            idempotency_key: w.idempotency_key,
            scope: scope_of(w.tenant_id, w.session_id)?,
        })
    }
}

impl From<DrainRequest> for DrainRequestWire {
    fn from(r: DrainRequest) -> Self {
        let (tenant_id, session_id) = scope_members(r.scope);
        DrainRequestWire {
            version: V1,
            host_id: r.host_id,
            host_generation: r.host_generation,
            idempotency_key: r.idempotency_key,
            tenant_id,
            session_id,
        }
    }
}

impl Record for DrainRequest {
    const NAME: &'static str = "drain_request";
}

/// A delivery: published on the session channel to wake the session's consumer. The command
/// itself is already in the durable inbox. A `version` of 1 is accepted and never written.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    #[serde(default, skip_serializing)]
    pub version: V1,
    pub command_id: CommandId,
    /// W3C trace context: the caller's span this work continues (strictly parsed; a
    /// malformed one refuses the whole record).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl Delivery {
    /// A delivery of `command_id` carrying no trace context.
    pub fn of(command_id: CommandId) -> Delivery {
        Delivery {
            version: V1,
            command_id,
            traceparent: None,
            tracestate: None,
        }
    }

    /// The caller's trace context, if it gave one.
    pub fn trace(&self) -> Option<TraceContext> {
        trace_of(&self.traceparent, &self.tracestate)
    }
}

impl Record for Delivery {
    const NAME: &'static str = "delivery";

    fn check(&self) -> Result<(), String> {
        check_trace(&self.traceparent, &self.tracestate)
    }
}

/// What `hostlink.attach` answers: the session's registration as this Host sees it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryObservation {
    pub version: V1,
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

impl Record for RegistryObservation {
    const NAME: &'static str = "registry_observation";

    fn check(&self) -> Result<(), String> {
        let n = self.internal_endpoint.len();
        if n == 0 || n > MAX_ENDPOINT_BYTES {
            return Err("internal_endpoint must be 1-2048 bytes".into());
        }
        Ok(())
    }
}

wire_enum! {
    /// Where a drain is.
    pub enum DrainState {
        Draining = "draining",
        Drained = "drained",
    }
    serde;
}

/// What `hostlink.drain` and `hostlink.drain_status` answer.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(try_from = "DrainObservationWire", into = "DrainObservationWire")]
pub struct DrainObservation {
    pub host_id: HostId,
    pub host_generation: NonZeroU64,
    pub drain_generation: NonZeroU64,
    pub state: DrainState,
    pub scope: Option<SessionScope>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainObservationWire {
    host_id: HostId,
    host_generation: NonZeroU64,
    drain_generation: NonZeroU64,
    state: DrainState,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    tenant_id: Option<TenantId>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    session_id: Option<SessionId>,
}

impl TryFrom<DrainObservationWire> for DrainObservation {
    type Error = &'static str;
    fn try_from(w: DrainObservationWire) -> Result<Self, &'static str> {
        Ok(DrainObservation {
            host_id: w.host_id,
            host_generation: w.host_generation,
            drain_generation: w.drain_generation,
            state: w.state,
            scope: scope_of(w.tenant_id, w.session_id)?,
        })
    }
}

impl From<DrainObservation> for DrainObservationWire {
    fn from(o: DrainObservation) -> Self {
        let (tenant_id, session_id) = scope_members(o.scope);
        DrainObservationWire {
            host_id: o.host_id,
            host_generation: o.host_generation,
            drain_generation: o.drain_generation,
            state: o.state,
            tenant_id,
            session_id,
        }
    }
}

impl Record for DrainObservation {
    const NAME: &'static str = "drain_observation";
}

/// A HostLink refusal: the data of a *successful* RPC reply. The extra member exists only
/// (and always) where its code needs it, so a record that breaks the rule cannot be built.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(try_from = "ErrorWire", into = "ErrorWire")]
pub enum HostLinkError {
    NotAdmitting,
    Releasing,
    NoCapacity,
    /// The other holder's epoch on attach, when it was readable (absent otherwise); it is
    /// never this Host's, and a caller must never bind with it.
    EpochMismatch {
        current_lease_epoch: Option<NonZeroU64>,
    },
    RuntimeMismatch {
        runtime_compatibility_id: CompatibilityId,
    },
    RuntimeUnavailable,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorWire {
    code: HostLinkErrorCode,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    current_lease_epoch: Option<NonZeroU64>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    runtime_compatibility_id: Option<CompatibilityId>,
}

impl TryFrom<ErrorWire> for HostLinkError {
    type Error = &'static str;
    fn try_from(w: ErrorWire) -> Result<Self, &'static str> {
        use HostLinkErrorCode as C;
        match (w.code, w.current_lease_epoch, w.runtime_compatibility_id) {
            (C::EpochMismatch, current_lease_epoch, None) => Ok(HostLinkError::EpochMismatch {
                current_lease_epoch,
            }),
            (C::EpochMismatch, _, Some(_)) => {
                Err("epoch_mismatch takes at most current_lease_epoch")
            }
            (C::RuntimeMismatch, None, Some(runtime_compatibility_id)) => {
                Ok(HostLinkError::RuntimeMismatch {
                    runtime_compatibility_id,
                })
            }
            (C::RuntimeMismatch, _, _) => {
                Err("runtime_mismatch takes runtime_compatibility_id and nothing else")
            }
            (_, Some(_), _) | (_, _, Some(_)) => Err("only code is allowed for this code"),
            (C::NotAdmitting, None, None) => Ok(HostLinkError::NotAdmitting),
            (C::Releasing, None, None) => Ok(HostLinkError::Releasing),
            (C::NoCapacity, None, None) => Ok(HostLinkError::NoCapacity),
            (C::RuntimeUnavailable, None, None) => Ok(HostLinkError::RuntimeUnavailable),
        }
    }
}

impl From<HostLinkError> for ErrorWire {
    fn from(e: HostLinkError) -> Self {
        let code = e.code();
        let (current_lease_epoch, runtime_compatibility_id) = match e {
            HostLinkError::EpochMismatch {
                current_lease_epoch,
            } => (current_lease_epoch, None),
            HostLinkError::RuntimeMismatch {
                runtime_compatibility_id,
            } => (None, Some(runtime_compatibility_id)),
            _ => (None, None),
        };
        ErrorWire {
            code,
            current_lease_epoch,
            runtime_compatibility_id,
        }
    }
}

impl HostLinkError {
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
}

impl Record for HostLinkError {
    const NAME: &'static str = "error";
}

/// The `data` of a subscribe to a session channel (optional): the preview opt-in, and the
/// session's bind parameters when the subscribe is to bind the link too (so an SDK's own
/// resubscribe after a reconnect, on a link that holds no bind, needs no application code).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeOptions {
    pub version: V1,
    /// Push `ephemeral_publication` previews too (default false): answer text.
    #[serde(default, deserialize_with = "present_bool")]
    pub ephemeral: bool,
    /// With `ephemeral`, also visible model reasoning (default false).
    #[serde(
        default,
        deserialize_with = "present_bool",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub reasoning: bool,
    /// With `ephemeral`, also each tool call's start and finish (default false).
    #[serde(
        default,
        deserialize_with = "present_bool",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub tool_steps: bool,
    /// Bind the link to the session first, exactly as `hostlink.bind` with this request would
    /// (same checks, same refusals). Its tenant and session must be the channel's.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub bind: Option<BindRequest>,
}

/// A boolean member that may be absent (false) but never `null`.
fn present_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    bool::deserialize(d)
}

impl Record for SubscribeOptions {
    const NAME: &'static str = "subscribe_options";

    fn check(&self) -> Result<(), String> {
        if (self.reasoning || self.tool_steps) && !self.ephemeral {
            return Err("reasoning and tool_steps need ephemeral".into());
        }
        Ok(())
    }
}

/// A committed journal event, pushed on the session channel. The body is kept as the exact
/// JSON text it was given (member order and every byte). On the wire the one exception is a
/// raw line break, which in JSON can only be insignificant whitespace: the frame encoder turns
/// it into a space because the SDKs split every message on line feeds (Centrifuge batching).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Builds one; the body must be JSON other than `null` (it is emitted as given).
    pub fn new(
        tenant_id: TenantId,
        session_id: SessionId,
        event_id: EventId,
        journal_seq: NonZeroU64,
        covered_through: u64,
        body: Box<RawValue>,
    ) -> Result<EnduringPublication, RecordError> {
        let p = EnduringPublication {
            tenant_id,
            session_id,
            event_id,
            journal_seq,
            covered_through,
            body,
        };
        p.check().map_err(|reason| fail(Self::NAME, reason))?;
        Ok(p)
    }

    /// The body, exactly as given.
    pub fn body(&self) -> &RawValue {
        &self.body
    }
}

impl Record for EnduringPublication {
    const NAME: &'static str = "enduring_publication";

    fn check(&self) -> Result<(), String> {
        if is_null(&self.body) {
            return Err("body must not be null".into());
        }
        Ok(())
    }
}

wire_enum! {
    /// Which live text a preview belongs to.
    pub enum PreviewStream {
        /// The model's visible answer text.
        Text = "text",
        /// Visible model reasoning (subscribe option `reasoning`).
        Reasoning = "reasoning",
        /// A tool call's start or finish (subscribe option `tool_steps`); the publication
        /// carries `tool`.
        ToolStep = "tool_step",
    }
    serde;
}

wire_enum! {
    /// Which moment of a tool call a `tool_step` preview shows.
    pub enum ToolPhase {
        Started = "started",
        Finished = "finished",
    }
    serde;
}

/// The tool call a `tool_step` preview belongs to. `call_id` is the key a viewer joins the
/// preview to the committed `tool_result` on.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolStepPreview {
    pub call_id: String,
    pub name: String,
    pub phase: ToolPhase,
    /// On `finished`: whether the result is an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

/// A live text preview (token deltas merged in a flush window): transient, never retried,
/// superseded by the next enduring record.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EphemeralPublication {
    pub tenant_id: TenantId,
    pub session_id: SessionId,
    pub stream: PreviewStream,
    /// The delta (non-empty, at most [`MAX_PREVIEW_TEXT_BYTES`]); for a tool step, its audit
    /// summary (or name) on start and at most 2 KiB of its result on finish.
    pub text: String,
    /// True when preview text before this one was dropped on this link.
    pub gap: bool,
    /// The tool call, present only and always with stream `tool_step`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool: Option<ToolStepPreview>,
}

impl EphemeralPublication {
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
            tool: None,
        }
    }

    /// A tool step's preview.
    pub fn tool_step(
        tenant_id: TenantId,
        session_id: SessionId,
        tool: ToolStepPreview,
        text: impl Into<String>,
    ) -> EphemeralPublication {
        EphemeralPublication {
            tool: Some(tool),
            ..EphemeralPublication::delta(tenant_id, session_id, PreviewStream::ToolStep, text)
        }
    }
}

impl Record for EphemeralPublication {
    const NAME: &'static str = "ephemeral_publication";

    fn check(&self) -> Result<(), String> {
        if self.text.is_empty() || self.text.len() > MAX_PREVIEW_TEXT_BYTES {
            return Err("text must be 1-65536 bytes".into());
        }
        if (self.stream == PreviewStream::ToolStep) != self.tool.is_some() {
            return Err("tool comes only and always with stream tool_step".into());
        }
        Ok(())
    }
}

codec!(
    ConnectData,
    AttachRequest,
    BindRequest,
    UnbindRequest,
    DrainRequest,
    Delivery,
    RegistryObservation,
    DrainObservation,
    HostLinkError,
    SubscribeOptions,
    EnduringPublication,
    EphemeralPublication,
);

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
            version: V1,
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
    fn the_error_record_carries_its_extra_member_only_with_its_code() {
        let e = HostLinkError::EpochMismatch {
            current_lease_epoch: Some(nz(4)),
        };
        assert_eq!(
            e.encode(),
            r#"{"code":"epoch_mismatch","current_lease_epoch":4}"#
        );
        assert_eq!(HostLinkError::decode(e.encode().as_bytes()), Ok(e));
        // The holder's epoch may be unreadable: the refusal still says epoch_mismatch.
        let unknown = HostLinkError::EpochMismatch {
            current_lease_epoch: None,
        };
        assert_eq!(unknown.encode(), r#"{"code":"epoch_mismatch"}"#);
        assert_eq!(
            HostLinkError::decode(br#"{"code":"epoch_mismatch"}"#),
            Ok(unknown)
        );
        assert!(
            HostLinkError::decode(br#"{"code":"epoch_mismatch","runtime_compatibility_id":"b2"}"#)
                .is_err()
        );
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
            &br#"{"code":"epoch_mismatch","current_lease_epoch":0}"#[..],
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
            version: V1,
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
    fn records_refuse_arrays_nulls_duplicates_and_unknown_members_everywhere() {
        let drain = r#"{"version":1,"host_id":"h","host_generation":1,"idempotency_key":"k""#;
        for bad in [
            // A positional array is not an object, even with the right values in order.
            r#"[1,"h",1,"k"]"#.to_owned(),
            format!("{drain},\"extra\":1}}"),
            format!("{drain},\"tenant_id\":null,\"session_id\":\"s\"}}"),
            format!("{drain},\"host_id\":\"h\"}}"),
        ] {
            assert!(DrainRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(SubscribeOptions::decode(br#"{"version":1,"ephemeral":null}"#).is_err());
        assert!(SubscribeOptions::decode(br#"{"version":1}"#).is_ok());
        assert!(SubscribeOptions::decode(br#"{"version":1,"bind":null}"#).is_err());
        assert!(SubscribeOptions::decode(br#"{"version":1,"bind":{"version":1}}"#).is_err());
        let bind = r#"{"version":1,"tenant_id":"t","session_id":"s","host_id":"h","host_generation":2,"lease_epoch":3,"runtime_compatibility_id":"b","idempotency_key":"k"}"#;
        let with_bind =
            SubscribeOptions::decode(format!(r#"{{"version":1,"bind":{bind}}}"#).as_bytes())
                .unwrap();
        assert_eq!(with_bind.bind.unwrap().lease_epoch.get(), 3);
        assert!(
            SubscribeOptions::decode(
                format!(
                    r#"{{"version":1,"bind":{}}}"#,
                    bind.replace("\"lease_epoch\":3", "\"lease_epoch\":0")
                )
                .as_bytes()
            )
            .is_err()
        );
        let attach = r#"{"version":1,"tenant_id":"t","session_id":"s","host_id":"h","host_generation":1,"agent_id":"a","runtime_compatibility_id":"b","mode":"create","actor_id":"x","idempotency_key":"k""#;
        assert!(AttachRequest::decode(format!("{attach}}}").as_bytes()).is_ok());
        // The runtime build is optional; when sent it is a build id, never null.
        let without = format!("{attach}}}").replace(r#""runtime_compatibility_id":"b","#, "");
        let decoded = AttachRequest::decode(without.as_bytes()).unwrap();
        assert_eq!(decoded.runtime_compatibility_id, None);
        assert!(!decoded.encode().contains("runtime_compatibility_id"));
        for bad in [
            without.replace(r#""mode""#, r#""runtime_compatibility_id":null,"mode""#),
            format!("{attach},\"trace_id\":null}}"),
            format!("{attach},\"mode\":\"create\"}}"),
            format!("{attach}}}").replace("create", "resume"),
        ] {
            assert!(AttachRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(
            DrainObservation::decode(
                br#"{"host_id":"h","host_generation":1,"drain_generation":1,"state":"drained","x":1}"#
            )
            .is_err()
        );
    }

    #[test]
    fn an_attach_request_needs_an_actor_and_may_leave_the_trace_out() {
        let attach = r#"{"version":1,"tenant_id":"t","session_id":"s","host_id":"h","host_generation":1,"agent_id":"a","mode":"create","actor_id":"x","idempotency_key":"k"}"#;
        let plain = AttachRequest::decode(attach.as_bytes()).unwrap();
        assert_eq!(plain.trace_id, None);
        let traced = attach.replace(
            r#""idempotency_key""#,
            r#""trace_id":"tr","idempotency_key""#,
        );
        assert!(
            AttachRequest::decode(traced.as_bytes())
                .unwrap()
                .trace_id
                .is_some()
        );
        let anonymous = attach.replace(r#""actor_id":"x","#, "");
        assert!(AttachRequest::decode(anonymous.as_bytes()).is_err());
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
