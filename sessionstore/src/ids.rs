//! Identifiers. Owns the validation rule for every id the store accepts; an invalid id cannot be
//! represented past the constructor. Never performs I/O.
//!
//! Opaque ids (tenant, session, agent, host, command, event, gate, run, object, storage binding,
//! runtime compatibility) are non-empty, at most [`MAX_ID_BYTES`] bytes of valid UTF-8, and contain
//! no control characters. Runtime session ids, runtime command ids and attempt ids are UUIDs the
//! store or the runtime mints (version 7, time-ordered); they are private and never reach a client.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

use crate::error::StoreError;

/// The largest opaque id, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Checks the opaque-id rule and names `field` in the refusal.
pub fn check_opaque_id(field: &'static str, value: &str) -> Result<(), StoreError> {
    if value.is_empty() {
        return Err(StoreError::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(StoreError::invalid(
            field,
            format!("is {} bytes; at most {MAX_ID_BYTES} allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(StoreError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The wire name of this kind of id, used in refusals.
            pub const FIELD: &'static str = $field;

            /// Validates and wraps `value`.
            pub fn new(value: impl Into<String>) -> Result<Self, StoreError> {
                let value = value.into();
                check_opaque_id($field, &value)?;
                Ok(Self(value))
            }

            /// Validates raw bytes (which must be UTF-8) and wraps them.
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, StoreError> {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| StoreError::invalid($field, "is not valid UTF-8"))?;
                Self::new(text)
            }

            /// Wraps a literal known to satisfy the id rule (checked in debug builds).
            #[allow(dead_code)]
            pub(crate) fn from_literal(value: &'static str) -> Self {
                debug_assert!(check_opaque_id($field, value).is_ok());
                Self(value.to_owned())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Consumes the id, giving its text.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = StoreError;
            fn from_str(s: &str) -> Result<Self, StoreError> {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::new(text).map_err(serde::de::Error::custom)
            }
        }
    };
}

opaque_id!(
    /// The tenant every row is scoped by.
    TenantId,
    "tenant_id"
);
opaque_id!(
    /// A session's public id, chosen by the controller.
    SessionId,
    "session_id"
);
opaque_id!(
    /// The agent a session runs, as registered in a Host's department.
    AgentId,
    "agent_id"
);
opaque_id!(
    /// A Host process's stable identity.
    HostId,
    "host_id"
);
opaque_id!(
    /// A command's public id, chosen by the controller that admitted it.
    CommandId,
    "command_id"
);
opaque_id!(
    /// A journal event's id.
    EventId,
    "event_id"
);
opaque_id!(
    /// A gate's id (the agent mints it; harness gates are UUIDs).
    GateId,
    "gate_id"
);
opaque_id!(
    /// A workflow run's id.
    RunId,
    "run_id"
);
opaque_id!(
    /// A payload object's id.
    ObjectId,
    "object_id"
);
opaque_id!(
    /// Names the journal store a session's runtime writes to (routed by the evidence router).
    StorageBindingId,
    "storage_binding_id"
);
opaque_id!(
    /// The runtime build a session's journal was created under; restore refuses another one.
    CompatibilityId,
    "runtime_compatibility_id"
);

macro_rules! private_uuid {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// The wire name of this kind of id, used in refusals.
            pub const FIELD: &'static str = $field;

            /// Mints a fresh, time-ordered (v7) id.
            pub fn mint() -> Self {
                Self(Uuid::now_v7())
            }

            /// Wraps an existing UUID; the nil UUID is refused.
            pub fn from_uuid(uuid: Uuid) -> Result<Self, StoreError> {
                if uuid.is_nil() {
                    return Err(StoreError::invalid($field, "must not be the nil UUID"));
                }
                Ok(Self(uuid))
            }

            /// Parses the hyphenated text form.
            pub fn parse(text: &str) -> Result<Self, StoreError> {
                let uuid = Uuid::try_parse(text)
                    .map_err(|_| StoreError::invalid($field, "is not a UUID"))?;
                Self::from_uuid(uuid)
            }

            /// The UUID.
            pub fn uuid(&self) -> Uuid {
                self.0
            }

            /// The hyphenated lower-case text form (what the store keeps).
            pub fn to_text(&self) -> String {
                self.0.hyphenated().to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.to_text())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

private_uuid!(
    /// The runtime's own id for a session (private; part of the immutable binding).
    RuntimeSessionId,
    "runtime_session_id"
);
private_uuid!(
    /// The runtime's id for an admitted command (private; minted at admission).
    RuntimeCommandId,
    "runtime_command_id"
);
private_uuid!(
    /// One dispatch attempt of a command (immutable once recorded).
    AttemptId,
    "attempt_id"
);

/// A residency epoch: the Host's per-session grant from the store. Fences claims, gate and
/// registry writes and the cursor. Never derived from a journal epoch.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResidencyEpoch(pub u64);

/// A journal epoch: the runtime's lease on its journal. Stamped into applications and closures.
/// Never derived from a residency epoch.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JournalEpoch(pub u64);

impl fmt::Display for ResidencyEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for JournalEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_id_is_refused_naming_its_field() {
        let err = TenantId::new("").unwrap_err();
        assert_eq!(err.code().as_str(), "invalid");
        assert!(err.to_string().contains("tenant_id"));
    }

    #[test]
    fn an_id_of_exactly_256_bytes_is_accepted_and_257_is_refused() {
        assert!(SessionId::new("a".repeat(256)).is_ok());
        let err = SessionId::new("a".repeat(257)).unwrap_err();
        assert_eq!(err.code().as_str(), "invalid");
    }

    #[test]
    fn invalid_utf8_is_refused() {
        let err = CommandId::from_bytes(&[0x66, 0xff, 0x66]).unwrap_err();
        assert!(err.to_string().contains("UTF-8"));
    }

    #[test]
    fn control_characters_are_refused() {
        assert!(GateId::new("a\nb").is_err());
        assert!(GateId::new("a\u{0}b").is_err());
    }

    #[test]
    fn private_ids_round_trip_and_refuse_nil_and_garbage() {
        let id = RuntimeSessionId::mint();
        assert_eq!(RuntimeSessionId::parse(&id.to_text()).unwrap(), id);
        assert!(AttemptId::parse("not-a-uuid").is_err());
        assert!(AttemptId::parse("00000000-0000-0000-0000-000000000000").is_err());
    }

    #[test]
    fn minted_ids_are_time_ordered() {
        let a = RuntimeCommandId::mint();
        let b = RuntimeCommandId::mint();
        assert!(a.uuid().get_version_num() == 7);
        assert!(a <= b);
    }

    #[test]
    fn deserializing_an_invalid_id_fails() {
        let r: Result<TenantId, _> = serde_json::from_str("\"\"");
        assert!(r.is_err());
    }
}
