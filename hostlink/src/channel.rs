//! Session channel names. Owns the one spelling of a session's channel —
//! `hostlink.v1.` + base64url-unpadded(tenant) + `.` + base64url-unpadded(session) — and its
//! strict parse back. Never decides who may use a channel.
//!
//! The encoding is canonical (no padding, no trailing bits), so a channel names exactly one
//! (tenant, session) pair and every pair has exactly one channel.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sessionstore::{SessionId, TenantId};

/// The prefix every HostLink session channel starts with.
pub const CHANNEL_PREFIX: &str = "hostlink.v1.";

/// Why a channel name is not a session channel.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("the channel does not start with {CHANNEL_PREFIX}")]
    Prefix,
    #[error("the channel must have exactly two base64url parts after the prefix")]
    Shape,
    #[error("a channel part is not canonical unpadded base64url")]
    Encoding,
    #[error("a channel part is not a valid {0}")]
    Id(&'static str),
}

/// The channel of `session` of `tenant`.
pub fn session_channel(tenant: &TenantId, session: &SessionId) -> String {
    let mut out = String::with_capacity(
        CHANNEL_PREFIX.len() + 2 + (tenant.as_str().len() + session.as_str().len()) * 4 / 3,
    );
    out.push_str(CHANNEL_PREFIX);
    URL_SAFE_NO_PAD.encode_string(tenant.as_str(), &mut out);
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(session.as_str(), &mut out);
    out
}

/// Parses a session channel back into its tenant and session; both must satisfy the id rule.
pub fn parse_session_channel(channel: &str) -> Result<(TenantId, SessionId), ChannelError> {
    let rest = channel
        .strip_prefix(CHANNEL_PREFIX)
        .ok_or(ChannelError::Prefix)?;
    let (tenant_part, session_part) = rest.split_once('.').ok_or(ChannelError::Shape)?;
    if tenant_part.is_empty() || session_part.is_empty() || session_part.contains('.') {
        return Err(ChannelError::Shape);
    }
    let tenant_bytes = URL_SAFE_NO_PAD
        .decode(tenant_part)
        .map_err(|_| ChannelError::Encoding)?;
    let session_bytes = URL_SAFE_NO_PAD
        .decode(session_part)
        .map_err(|_| ChannelError::Encoding)?;
    let tenant =
        TenantId::from_bytes(&tenant_bytes).map_err(|_| ChannelError::Id(TenantId::FIELD))?;
    let session =
        SessionId::from_bytes(&session_bytes).map_err(|_| ChannelError::Id(SessionId::FIELD))?;
    Ok((tenant, session))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }
    fn s(v: &str) -> SessionId {
        SessionId::new(v).unwrap()
    }

    #[test]
    fn a_channel_spells_both_ids_in_unpadded_base64url() {
        assert_eq!(
            session_channel(&t("acme"), &s("s-1")),
            "hostlink.v1.YWNtZQ.cy0x"
        );
        assert_eq!(
            session_channel(&t("a/b?"), &s("ü")),
            "hostlink.v1.YS9iPw.w7w"
        );
    }

    #[test]
    fn foreign_shapes_encodings_and_ids_are_refused() {
        for bad in [
            "",
            "hostlink.v2.YWNtZQ.cy0x",
            "hostlink.v1.YWNtZQ",
            "hostlink.v1.YWNtZQ.",
            "hostlink.v1..cy0x",
            "hostlink.v1.YWNtZQ.cy0x.eA",
            "hostlink.v1.YWNtZQ==.cy0x",
            "hostlink.v1.YWNtZR.cy0x",
            "hostlink.v1.YWN+tZQ.cy0x",
            "hostlink.v1.AA.cy0x",
            "hostlink.v1._w.cy0x",
        ] {
            assert!(parse_session_channel(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn every_valid_pair_round_trips(tenant in "[^\\p{Cc}]{1,64}", session in "[^\\p{Cc}]{1,64}") {
            let (tenant, session) = (t(&tenant), s(&session));
            let channel = session_channel(&tenant, &session);
            prop_assert_eq!(parse_session_channel(&channel), Ok((tenant, session)));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,80}") {
            let _ = parse_session_channel(&text);
        }
    }
}
