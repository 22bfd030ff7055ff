//! The bounds of a flow, each a named option with a default.
//!
//! This module owns the options and their validation only; it must never read the
//! environment or the command line (the binary maps flags onto these fields).

use std::time::Duration;

use crate::error::FlowError;

/// Every bound the flow engine applies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowOptions {
    /// How long one start of a service may take to pass its readiness predicates.
    #[serde(with = "timing::duration_text")]
    pub readiness_timeout: Duration,
    /// The shortest pause between two readiness rounds; each pause is a quarter of the time
    /// waited so far, at least this.
    #[serde(with = "timing::duration_text")]
    pub readiness_backoff_initial: Duration,
    /// The longest pause between two readiness rounds.
    #[serde(with = "timing::duration_text")]
    pub readiness_backoff_max: Duration,
    /// How long a single probe (a connect, an HTTP request, a gRPC health check) may take.
    #[serde(with = "timing::duration_text")]
    pub probe_timeout: Duration,
    /// How long one teardown layer may take from SIGTERM before its survivors get SIGKILL.
    #[serde(with = "timing::duration_text")]
    pub teardown_layer_budget: Duration,
    /// How long to wait for a process group to vanish after SIGKILL.
    #[serde(with = "timing::duration_text")]
    pub kill_grace: Duration,
    /// How many of a crashed service's last output lines a failure carries.
    pub crash_tail_lines: usize,
    /// The longest output line kept as one line; longer lines are split.
    pub max_line_bytes: usize,
}

impl Default for FlowOptions {
    fn default() -> Self {
        FlowOptions {
            readiness_timeout: Duration::from_secs(120),
            readiness_backoff_initial: Duration::from_millis(1),
            readiness_backoff_max: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(2),
            teardown_layer_budget: Duration::from_secs(15),
            kill_grace: Duration::from_secs(2),
            crash_tail_lines: 20,
            max_line_bytes: 64 * 1024,
        }
    }
}

impl FlowOptions {
    pub fn validate(&self) -> Result<(), FlowError> {
        let positive: [(&'static str, Duration); 6] = [
            ("readiness_timeout", self.readiness_timeout),
            ("readiness_backoff_initial", self.readiness_backoff_initial),
            ("readiness_backoff_max", self.readiness_backoff_max),
            ("probe_timeout", self.probe_timeout),
            ("teardown_layer_budget", self.teardown_layer_budget),
            ("kill_grace", self.kill_grace),
        ];
        for (option, value) in positive {
            if value.is_zero() {
                return Err(FlowError::InvalidOption {
                    option,
                    reason: "must be longer than zero".into(),
                });
            }
        }
        if self.readiness_backoff_max < self.readiness_backoff_initial {
            return Err(FlowError::InvalidOption {
                option: "readiness_backoff_max",
                reason: "must not be shorter than readiness_backoff_initial".into(),
            });
        }
        if self.max_line_bytes < 80 {
            return Err(FlowError::InvalidOption {
                option: "max_line_bytes",
                reason: "must be at least 80".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_readiness_starts_polling_within_a_millisecond() {
        let o = FlowOptions::default();
        o.validate().unwrap();
        assert_eq!(o.teardown_layer_budget, Duration::from_secs(15));
        assert_eq!(o.readiness_backoff_initial, Duration::from_millis(1));
        assert_eq!(o.readiness_backoff_max, Duration::from_secs(5));
    }

    #[test]
    fn a_zero_bound_is_refused_by_name() {
        let o = FlowOptions {
            teardown_layer_budget: Duration::ZERO,
            ..FlowOptions::default()
        };
        let err = o.validate().unwrap_err();
        assert_eq!(err.code(), "flow.invalid_option");
        assert!(err.to_string().contains("teardown_layer_budget"));
    }
}
