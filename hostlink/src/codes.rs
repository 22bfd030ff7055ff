//! HostLink's numeric and textual codes. Owns every code a client can branch on: the HostLink
//! error codes (carried in a successful RPC reply), the Centrifuge reply error codes, and the
//! disconnect codes (sent as the WebSocket close code). Never decides *when* a code applies:
//! that is the link's job.
//!
//! Disconnect codes follow Centrifuge's ranges: 3000–3499 and 4000–4499 ask a client to
//! reconnect, 3500–3999 and 4500–4999 are terminal (the official SDKs stop reconnecting).

use std::fmt;

use wire_enum::{UnknownValue, wire_enum};

wire_enum! {
    /// A HostLink error code: the `code` member of an error record. `ALL` is in the documented
    /// order.
    pub enum HostLinkErrorCode {
        /// Place elsewhere (the Host is draining) or re-place the session.
        NotAdmitting = "not_admitting",
        /// Wait and re-place; the session is durable.
        Releasing = "releasing",
        /// Place elsewhere.
        NoCapacity = "no_capacity",
        /// Refresh from the registry; on attach the epoch is the other holder's.
        EpochMismatch = "epoch_mismatch",
        /// Place on a Host with the named build.
        RuntimeMismatch = "runtime_mismatch",
        /// Deliberately uninformative: never reveals whether another tenant's session exists.
        RuntimeUnavailable = "runtime_unavailable",
    }
    kind = "hostlink_error_code";
    from_str(UnknownCode);
}

impl HostLinkErrorCode {
    /// The Centrifuge reply error code this refusal takes where a command's reply cannot carry
    /// a record (a delivery is a `publish`, whose reply has no data): the message is the wire
    /// string. The numbers sit in Centrifuge's application range (400–1999).
    pub fn reply_error_code(self) -> u32 {
        match self {
            HostLinkErrorCode::NotAdmitting => 1001,
            HostLinkErrorCode::Releasing => 1002,
            HostLinkErrorCode::NoCapacity => 1003,
            HostLinkErrorCode::EpochMismatch => 1004,
            HostLinkErrorCode::RuntimeMismatch => 1005,
            HostLinkErrorCode::RuntimeUnavailable => 1006,
        }
    }
}

impl serde::Serialize for HostLinkErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for HostLinkErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A string and nothing else (a derived enum would also take `{"releasing": null}`).
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        HostLinkErrorCode::from_wire(&text).map_err(|_| serde::de::Error::custom("unknown code"))
    }
}

/// A code string no HostLink build defines.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("unknown HostLink error code")]
pub struct UnknownCode;

impl From<UnknownValue> for UnknownCode {
    fn from(_: UnknownValue) -> Self {
        UnknownCode
    }
}

/// A Centrifuge reply error: `{"code":N,"message":"..."}` in place of a command's result.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReplyError {
    pub code: u32,
    pub message: &'static str,
    /// Centrifuge's hint that retrying may succeed.
    pub temporary: bool,
}

impl ReplyError {
    /// A Host-side failure with no placement class; retry is safe.
    pub const INTERNAL: ReplyError = ReplyError {
        code: 100,
        message: "internal server error",
        temporary: true,
    };
    /// The channel is not this link's to use (subscribe without the bind).
    pub const PERMISSION_DENIED: ReplyError = ReplyError {
        code: 103,
        message: "permission denied",
        temporary: false,
    };
    /// An RPC method this Host does not serve (a capability token sent as a method included).
    pub const METHOD_NOT_FOUND: ReplyError = ReplyError {
        code: 104,
        message: "method not found",
        temporary: false,
    };
    /// The channel is already subscribed on this link.
    pub const ALREADY_SUBSCRIBED: ReplyError = ReplyError {
        code: 105,
        message: "already subscribed",
        temporary: false,
    };
    /// A bound of this link or tenant is reached (bindings per link, per tenant).
    pub const LIMIT_EXCEEDED: ReplyError = ReplyError {
        code: 106,
        message: "limit exceeded",
        temporary: false,
    };
    /// The command's data (or channel) is malformed; retrying does not help.
    pub const BAD_REQUEST: ReplyError = ReplyError {
        code: 107,
        message: "bad request",
        temporary: false,
    };
    /// A Centrifuge feature HostLink does not offer (presence, history, refresh, ...).
    pub const NOT_AVAILABLE: ReplyError = ReplyError {
        code: 108,
        message: "not available",
        temporary: false,
    };
    /// A history `since` position the stream cannot continue from (another epoch, or an
    /// offset it never reached): reload from the stream's current position.
    pub const UNRECOVERABLE_POSITION: ReplyError = ReplyError {
        code: 112,
        message: "unrecoverable position",
        temporary: false,
    };
    /// The connection token's own `exp` has passed (Centrifuge's code: the SDK asks its
    /// `getToken` for a fresh token and connects again).
    pub const TOKEN_EXPIRED: ReplyError = ReplyError {
        code: 109,
        message: "token expired",
        temporary: false,
    };
    /// Rate limited.
    pub const TOO_MANY_REQUESTS: ReplyError = ReplyError {
        code: 111,
        message: "too many requests",
        temporary: true,
    };

    /// A HostLink refusal where the reply cannot carry a record (see
    /// [`HostLinkErrorCode::reply_error_code`]).
    pub fn hostlink(code: HostLinkErrorCode) -> ReplyError {
        ReplyError {
            code: code.reply_error_code(),
            message: code.as_str(),
            temporary: false,
        }
    }
}

/// Why a link ends: the WebSocket close code and reason (Centrifuge protocol v2 sends
/// disconnects in the close frame, not as a push, on a WebSocket).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Disconnect {
    pub code: u16,
    pub reason: &'static str,
}

impl Disconnect {
    /// The peer went away; nothing is sent.
    pub const CONNECTION_CLOSED: Disconnect = Disconnect {
        code: 3000,
        reason: "connection closed",
    };
    /// The Host is stopping (reconnect elsewhere or later).
    pub const SHUTDOWN: Disconnect = Disconnect {
        code: 3001,
        reason: "shutdown",
    };
    /// The connection token expired and no `refresh` with a fresh one came in time
    /// (Centrifuge's code: the SDKs reconnect, are told "token expired" (109) and ask their
    /// `getToken` for a fresh token).
    pub const EXPIRED: Disconnect = Disconnect {
        code: 3005,
        reason: "expired",
    };
    /// An internal failure ended the link (reconnect).
    pub const SERVER_ERROR: Disconnect = Disconnect {
        code: 3004,
        reason: "internal server error",
    };
    /// The client did not read fast enough: its outbound queue stayed full, or its session
    /// feed overflowed.
    pub const SLOW: Disconnect = Disconnect {
        code: 3008,
        reason: "slow",
    };
    /// The client did not answer an application ping in time.
    pub const NO_PONG: Disconnect = Disconnect {
        code: 3012,
        reason: "no pong",
    };
    /// A frame that is not a decodable command, a command before connect, a second connect.
    pub const BAD_REQUEST: Disconnect = Disconnect {
        code: 3501,
        reason: "bad request",
    };
    /// No connect command arrived within the handshake timeout.
    pub const STALE: Disconnect = Disconnect {
        code: 3502,
        reason: "stale",
    };
    /// An idle link (no bindings) was evicted to admit another at `max_tenant_links`.
    pub const IDLE_LINK_EVICTED: Disconnect = Disconnect {
        code: 4001,
        reason: "idle link evicted",
    };
    /// `max_tenant_links` is reached and every link holds bindings; retry later.
    pub const LINK_LIMIT: Disconnect = Disconnect {
        code: 4002,
        reason: "link limit reached",
    };
    /// The tenant credential was refused (never says whether the tenant is known).
    pub const AUTHENTICATION_FAILED: Disconnect = Disconnect {
        code: 4500,
        reason: "service authentication failed",
    };
    /// The credential the link connected with was removed or replaced (the credentials file
    /// or a key file changed): terminal, the same token would be refused.
    pub const CREDENTIAL_REVOKED: Disconnect = Disconnect {
        code: 4502,
        reason: "credential revoked",
    };
    /// The client does not offer HostLink wire version 1.
    pub const UNSUPPORTED_WIRE_VERSION: Disconnect = Disconnect {
        code: 4501,
        reason: "unsupported wire version",
    };
    /// A WebSocket message larger than `max_frame_bytes` (the WebSocket code, as Centrifuge's
    /// Go server sends it for its read limit).
    pub const MESSAGE_TOO_BIG: Disconnect = Disconnect {
        code: 1009,
        reason: "message too big",
    };

    /// Whether a client should reconnect after this disconnect (Centrifuge's rule).
    pub fn reconnect(self) -> bool {
        let c = self.code;
        c < 3500 || (4000..4500).contains(&c) || c >= 5000
    }
}

impl fmt::Display for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hostlink_code_round_trips_through_its_wire_string() {
        for code in HostLinkErrorCode::ALL {
            assert_eq!(code.as_str().parse::<HostLinkErrorCode>(), Ok(code));
        }
        assert!("invalid".parse::<HostLinkErrorCode>().is_err());
    }

    #[test]
    fn terminal_disconnects_are_the_ones_sdks_do_not_reconnect_after() {
        assert!(!Disconnect::AUTHENTICATION_FAILED.reconnect());
        assert!(!Disconnect::UNSUPPORTED_WIRE_VERSION.reconnect());
        assert!(!Disconnect::BAD_REQUEST.reconnect());
        assert!(!Disconnect::CREDENTIAL_REVOKED.reconnect());
        assert!(Disconnect::EXPIRED.reconnect());
        assert!(Disconnect::SLOW.reconnect());
        assert!(Disconnect::NO_PONG.reconnect());
        assert!(Disconnect::IDLE_LINK_EVICTED.reconnect());
        assert!(Disconnect::LINK_LIMIT.reconnect());
    }

    #[test]
    fn refusal_reply_codes_are_distinct_and_in_the_application_range() {
        let mut seen = std::collections::HashSet::new();
        for code in HostLinkErrorCode::ALL {
            let n = code.reply_error_code();
            assert!((400..2000).contains(&n));
            assert!(seen.insert(n));
        }
    }
}
