//! The HostLink surface's options. Owns every bound a link runs under, its type and default (a
//! serde type: a config file's `[link]` section), and the one validation that turns
//! [`LinkOptions`] into an immutable [`LinkConfig`]; a refusal is a [`LinkOptionsError`] with a
//! stable code and the field it concerns. Never reads the environment (the binary layers its
//! `HOST_*` variables and flags over these fields).

use std::time::Duration;

use hostlink::frame::MAX_FRAME_BYTES_CEILING;
use serde::{Deserialize, Serialize};

use timing::duration_text;
use wire_enum::wire_enum;

/// The default largest inbound message a link accepts (1 MiB: above Centrifuge's 64 KiB read
/// limit, so a command body near the inline limit still fits in one frame).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Upper bounds (named so refusals can say them).
pub mod bounds {
    use std::time::Duration;

    pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
    pub const MAX_BINDINGS: usize = 1_000_000;
    pub const MAX_TENANT_LINKS: usize = 100_000;
    pub const MAX_OUTBOUND_QUEUE: usize = 65_536;
    pub const MAX_PREVIEW_RATE_BYTES_PER_SEC: u64 = 64 * 1024 * 1024;
    pub const MAX_PREVIEW_BURST_BYTES: usize = 16 * 1024 * 1024;
    pub const MAX_RECOVERY_WINDOW: usize = 100_000;
    pub const MAX_HISTORY_LIMIT: usize = 10_000;
}

wire_enum! {
    /// A stable option-refusal code.
    pub enum LinkOptionsCode {
        NotPositive = "not_positive",
        AboveBound = "above_bound",
        /// The pong timeout is not shorter than the ping interval.
        HeartbeatMargin = "heartbeat_margin",
    }
    kind = "link_options_code";
}

/// An option refused at validation.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{}: option {field}: {reason}", .code.as_str())]
pub struct LinkOptionsError {
    pub code: LinkOptionsCode,
    pub field: &'static str,
    pub reason: String,
}

/// Everything the HostLink surface is configured with. Build one, then
/// [`LinkOptions::validate`] it. Absent members of a config file take the defaults below.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkOptions {
    /// How often the server sends an application ping (`{}`); advertised in the connect reply
    /// in whole seconds, rounded up. Paired with `pong_timeout`: both zero turn the
    /// heartbeat off (no ping is sent or advertised; a dead peer is then found only by TCP).
    #[serde(with = "duration_text")]
    pub ping_interval: Duration,
    /// How long after a ping the client's pong (`{}`) may arrive before the link is closed
    /// with 3012. Shorter than `ping_interval`.
    #[serde(with = "duration_text")]
    pub pong_timeout: Duration,
    /// The largest inbound WebSocket message; a larger one closes the link (1009).
    pub max_frame_bytes: usize,
    /// The most sessions one link may have bound.
    pub max_bindings_per_link: usize,
    /// The most bindings one tenant may hold across its links.
    pub max_bindings_per_tenant: usize,
    /// The most authenticated links this Host keeps at once; at the bound the
    /// least-recently-used link holding no bindings is evicted to admit a new one.
    pub max_tenant_links: usize,
    /// The bound of each link's outbound queue, in messages.
    pub outbound_queue: usize,
    /// How long an enduring record or reply may wait for room in a full outbound queue
    /// before the link is closed as slow (3008).
    #[serde(with = "duration_text")]
    pub slow_consumer_timeout: Duration,
    /// How long a new WebSocket may take to send its connect command (else 3502).
    #[serde(with = "duration_text")]
    pub handshake_timeout: Duration,
    /// Previews: per-link rate in bytes per second.
    pub preview_rate_bytes_per_sec: u64,
    /// Previews: per-link burst in bytes (also the most preview text held for a flush).
    pub preview_burst_bytes: usize,
    /// Previews: how long deltas are merged before they are flushed.
    #[serde(with = "duration_text")]
    pub preview_flush_interval: Duration,
    /// Recovery: the most committed public records a resubscribing client may be behind and
    /// still be replayed from the durable journal (`recovered: true`); further behind it is
    /// answered `recovered: false` and reloads.
    pub recovery_window: usize,
    /// History: the most publications one `history` reply carries (a larger or unbounded
    /// `limit` is cut to it).
    pub history_limit: usize,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            ping_interval: Duration::from_secs(25),
            pong_timeout: Duration::from_secs(10),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_bindings_per_link: 1024,
            max_bindings_per_tenant: 4096,
            max_tenant_links: 64,
            outbound_queue: 1024,
            slow_consumer_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            preview_rate_bytes_per_sec: 32 * 1024,
            preview_burst_bytes: 64 * 1024,
            preview_flush_interval: Duration::from_millis(50),
            recovery_window: 1000,
            history_limit: 1000,
        }
    }
}

/// Validated options: immutable for the life of the service.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    pub(crate) options: LinkOptions,
}

impl LinkConfig {
    /// The validated options.
    pub fn options(&self) -> &LinkOptions {
        &self.options
    }

    /// Whether the application heartbeat runs (it is off when both of its options are zero).
    pub fn heartbeat(&self) -> bool {
        !self.options.ping_interval.is_zero()
    }

    /// The connect reply's `ping`: the interval in whole seconds, rounded up; 0 when the
    /// heartbeat is off.
    pub fn advertised_ping_secs(&self) -> u32 {
        if !self.heartbeat() {
            return 0;
        }
        let d = self.options.ping_interval;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
    }
}

fn err(code: LinkOptionsCode, field: &'static str, reason: impl Into<String>) -> LinkOptionsError {
    LinkOptionsError {
        code,
        field,
        reason: reason.into(),
    }
}

fn duration(field: &'static str, d: Duration) -> Result<(), LinkOptionsError> {
    if d.is_zero() {
        return Err(err(LinkOptionsCode::NotPositive, field, "must be positive"));
    }
    if d > bounds::MAX_DURATION {
        return Err(err(
            LinkOptionsCode::AboveBound,
            field,
            format!("is {d:?}; at most {:?} allowed", bounds::MAX_DURATION),
        ));
    }
    Ok(())
}

fn count(field: &'static str, n: usize, max: usize) -> Result<(), LinkOptionsError> {
    if n == 0 {
        return Err(err(LinkOptionsCode::NotPositive, field, "must be positive"));
    }
    if n > max {
        return Err(err(
            LinkOptionsCode::AboveBound,
            field,
            format!("is {n}; at most {max} allowed"),
        ));
    }
    Ok(())
}

impl LinkOptions {
    /// Validates every option once.
    pub fn validate(self) -> Result<LinkConfig, LinkOptionsError> {
        let off = self.ping_interval.is_zero() && self.pong_timeout.is_zero();
        if !off {
            duration("ping_interval", self.ping_interval)?;
            duration("pong_timeout", self.pong_timeout)?;
        }
        if !off && self.pong_timeout >= self.ping_interval {
            return Err(err(
                LinkOptionsCode::HeartbeatMargin,
                "pong_timeout",
                format!(
                    "is {:?}; must be shorter than ping_interval {:?}",
                    self.pong_timeout, self.ping_interval
                ),
            ));
        }
        count(
            "max_frame_bytes",
            self.max_frame_bytes,
            MAX_FRAME_BYTES_CEILING,
        )?;
        count(
            "max_bindings_per_link",
            self.max_bindings_per_link,
            bounds::MAX_BINDINGS,
        )?;
        count(
            "max_bindings_per_tenant",
            self.max_bindings_per_tenant,
            bounds::MAX_BINDINGS,
        )?;
        count(
            "max_tenant_links",
            self.max_tenant_links,
            bounds::MAX_TENANT_LINKS,
        )?;
        count(
            "outbound_queue",
            self.outbound_queue,
            bounds::MAX_OUTBOUND_QUEUE,
        )?;
        duration("slow_consumer_timeout", self.slow_consumer_timeout)?;
        duration("handshake_timeout", self.handshake_timeout)?;
        let rate = usize::try_from(self.preview_rate_bytes_per_sec).unwrap_or(usize::MAX);
        count(
            "preview_rate_bytes_per_sec",
            rate,
            bounds::MAX_PREVIEW_RATE_BYTES_PER_SEC as usize,
        )?;
        count(
            "preview_burst_bytes",
            self.preview_burst_bytes,
            bounds::MAX_PREVIEW_BURST_BYTES,
        )?;
        duration("preview_flush_interval", self.preview_flush_interval)?;
        count(
            "recovery_window",
            self.recovery_window,
            bounds::MAX_RECOVERY_WINDOW,
        )?;
        count(
            "history_limit",
            self.history_limit,
            bounds::MAX_HISTORY_LIMIT,
        )?;
        Ok(LinkConfig { options: self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_validate() {
        let c = LinkOptions::default().validate().unwrap();
        assert_eq!(c.advertised_ping_secs(), 25);
    }

    #[test]
    fn ping_and_pong_are_checked_as_a_pair() {
        let e = LinkOptions {
            ping_interval: Duration::from_secs(5),
            pong_timeout: Duration::from_secs(5),
            ..LinkOptions::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            (e.code, e.field),
            (LinkOptionsCode::HeartbeatMargin, "pong_timeout")
        );
        let e = LinkOptions {
            pong_timeout: Duration::ZERO,
            ..LinkOptions::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.code, LinkOptionsCode::NotPositive);
        let e = LinkOptions {
            ping_interval: Duration::ZERO,
            ..LinkOptions::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            (e.code, e.field),
            (LinkOptionsCode::NotPositive, "ping_interval")
        );
    }

    #[test]
    fn both_heartbeat_options_zero_turn_the_heartbeat_off() {
        let c = LinkOptions {
            ping_interval: Duration::ZERO,
            pong_timeout: Duration::ZERO,
            ..LinkOptions::default()
        }
        .validate()
        .unwrap();
        assert!(!c.heartbeat());
        assert_eq!(c.advertised_ping_secs(), 0);
        assert!(LinkOptions::default().validate().unwrap().heartbeat());
    }

    #[test]
    fn bounds_refuse_zero_and_too_large() {
        let e = LinkOptions {
            max_tenant_links: 0,
            ..LinkOptions::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            (e.code, e.field),
            (LinkOptionsCode::NotPositive, "max_tenant_links")
        );
        let e = LinkOptions {
            max_frame_bytes: MAX_FRAME_BYTES_CEILING + 1,
            ..LinkOptions::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            (e.code, e.field),
            (LinkOptionsCode::AboveBound, "max_frame_bytes")
        );
    }

    #[test]
    fn a_sub_second_ping_is_advertised_as_one_second() {
        let c = LinkOptions {
            ping_interval: Duration::from_millis(300),
            pong_timeout: Duration::from_millis(100),
            ..LinkOptions::default()
        }
        .validate()
        .unwrap();
        assert_eq!(c.advertised_ping_secs(), 1);
    }
}
