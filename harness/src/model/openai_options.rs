//! The tunable behaviour of the OpenAI-compatible client: its timeouts, its retries and their
//! back-off, and the sampling bounds it sends. Owns each option's type, default, bounds and
//! the one validation that refuses a bad value with the field's name and a stable code. Never
//! reads the environment, flags or files (the binary maps those onto these fields) and never
//! holds the endpoint or its key (those live in [`super::OpenAiConfig`]).
//!
//! In a serialized form (a configuration file section), durations are human text such as
//! `"500ms"`, `"10s"` or `"2m"`; an omitted field takes its default; an unknown field is refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use timing::{Backoff, duration_text};
use wire_enum::wire_enum;

/// The most retries the options may ask for.
pub const MAX_RETRIES_LIMIT: u32 = 10;
/// The longest timeout or back-off the options may ask for.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest `max_tokens` accepted.
pub const MAX_TOKENS_LIMIT: u32 = 1_000_000;

wire_enum! {
    /// A stable code for a refused option.
    pub enum OpenAiOptionsCode {
        /// A duration or count that must be positive is zero.
        NotPositive = "not_positive",
        /// A value is above its upper bound.
        AboveBound = "above_bound",
        /// A value is outside its allowed range (for instance, a temperature that is not a
        /// number).
        OutOfRange = "out_of_range",
        /// `backoff_max` is shorter than `backoff_initial`.
        BackoffOrder = "backoff_order",
    }
    kind = "openai_options_code";
}

/// An option refused at validation: which field, why, and a stable code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: option {field}: {reason}", .code.as_str())]
pub struct OpenAiOptionsError {
    pub code: OpenAiOptionsCode,
    /// The option's name, as spelled in the serialized form.
    pub field: &'static str,
    pub reason: String,
}

/// How the OpenAI-compatible model client behaves. `Default` gives the values it has always
/// used; [`OpenAiOptions::validate`] must pass before a client is built with them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiOptions {
    /// How long establishing a connection to the model endpoint may take (TCP and TLS).
    /// Default 10s.
    #[serde(with = "duration_text")]
    pub connect_timeout: Duration,
    /// How long the model endpoint may take from the request being sent to the first byte of
    /// its streamed answer, headers included. Default 120s.
    #[serde(with = "duration_text")]
    pub request_timeout: Duration,
    /// How long the streamed answer may pause between two pieces before the step fails with a
    /// timeout. Default 60s.
    #[serde(with = "duration_text")]
    pub idle_timeout: Duration,
    /// How many times a request is sent again after a 429, a 5xx answer or a failed connect
    /// (never once an answer began streaming). At most 10; default 3.
    pub max_retries: u32,
    /// The wait before the first retry; each further retry doubles it, with jitter, up to
    /// `backoff_max`. Default 500ms.
    #[serde(with = "duration_text")]
    pub backoff_initial: Duration,
    /// The longest wait between two attempts, a `Retry-After` from the endpoint included.
    /// Default 10s.
    #[serde(with = "duration_text")]
    pub backoff_max: Duration,
    /// The most tokens the model may write in one step (sent as `max_tokens`); unset sends
    /// nothing and leaves the endpoint's own limit. Default unset.
    pub max_tokens: Option<u32>,
    /// The sampling temperature sent with each request, from 0 to 2; unset sends nothing and
    /// leaves the endpoint's default. Default unset.
    pub temperature: Option<f32>,
    /// Asks the endpoint to report each step's token usage at the end of its stream (sends
    /// `stream_options: {"include_usage": true}`); the counts go on the model call's trace
    /// span. Turn it off for an endpoint that refuses `stream_options`. Default true.
    pub stream_usage: bool,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        OpenAiOptions {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(60),
            max_retries: 3,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            max_tokens: None,
            temperature: None,
            stream_usage: true,
        }
    }
}

fn refuse(
    code: OpenAiOptionsCode,
    field: &'static str,
    reason: impl Into<String>,
) -> OpenAiOptionsError {
    OpenAiOptionsError {
        code,
        field,
        reason: reason.into(),
    }
}

impl OpenAiOptions {
    /// The waits between retries: from `backoff_initial`, doubled per retry up to
    /// `backoff_max`, each jittered to between half and all of its step.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.backoff_initial, self.backoff_max).with_jitter()
    }

    /// Checks every option; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), OpenAiOptionsError> {
        for (field, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("idle_timeout", self.idle_timeout),
            ("backoff_initial", self.backoff_initial),
            ("backoff_max", self.backoff_max),
        ] {
            if value.is_zero() {
                return Err(refuse(
                    OpenAiOptionsCode::NotPositive,
                    field,
                    "must be greater than zero",
                ));
            }
            if value > MAX_DURATION {
                return Err(refuse(
                    OpenAiOptionsCode::AboveBound,
                    field,
                    format!("is {value:?}; at most one day allowed"),
                ));
            }
        }
        if self.backoff_max < self.backoff_initial {
            return Err(refuse(
                OpenAiOptionsCode::BackoffOrder,
                "backoff_max",
                format!(
                    "is {:?}; must not be shorter than backoff_initial ({:?})",
                    self.backoff_max, self.backoff_initial
                ),
            ));
        }
        if self.max_retries > MAX_RETRIES_LIMIT {
            return Err(refuse(
                OpenAiOptionsCode::AboveBound,
                "max_retries",
                format!(
                    "is {}; at most {MAX_RETRIES_LIMIT} allowed",
                    self.max_retries
                ),
            ));
        }
        match self.max_tokens {
            Some(0) => {
                return Err(refuse(
                    OpenAiOptionsCode::NotPositive,
                    "max_tokens",
                    "must be greater than zero",
                ));
            }
            Some(n) if n > MAX_TOKENS_LIMIT => {
                return Err(refuse(
                    OpenAiOptionsCode::AboveBound,
                    "max_tokens",
                    format!("is {n}; at most {MAX_TOKENS_LIMIT} allowed"),
                ));
            }
            _ => {}
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && (0.0..=2.0).contains(&t))
        {
            return Err(refuse(
                OpenAiOptionsCode::OutOfRange,
                "temperature",
                format!("is {t}; must be between 0 and 2"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_validate_and_are_the_clients_historic_values() {
        let o = OpenAiOptions::default();
        assert_eq!(o.validate(), Ok(()));
        assert_eq!(o.request_timeout, Duration::from_secs(120));
        assert_eq!(o.max_retries, 3);
        assert_eq!(o.max_tokens, None);
    }

    #[test]
    fn a_partial_section_takes_defaults_and_reads_human_durations() {
        let o: OpenAiOptions = serde_json::from_value(serde_json::json!({
            "request_timeout": "45s",
            "backoff_initial": "250ms",
            "max_tokens": 512,
            "temperature": 0.2
        }))
        .unwrap();
        assert_eq!(o.request_timeout, Duration::from_secs(45));
        assert_eq!(o.backoff_initial, Duration::from_millis(250));
        assert_eq!(o.max_tokens, Some(512));
        assert_eq!(o.temperature, Some(0.2));
        assert_eq!(o.idle_timeout, OpenAiOptions::default().idle_timeout);
        let back: OpenAiOptions =
            serde_json::from_value(serde_json::to_value(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn unknown_fields_and_unreadable_durations_are_refused_when_read() {
        let unknown = serde_json::from_value::<OpenAiOptions>(serde_json::json!({"retries": 2}));
        assert!(unknown.unwrap_err().to_string().contains("retries"));
        let bad =
            serde_json::from_value::<OpenAiOptions>(serde_json::json!({"idle_timeout": "soon"}));
        assert!(bad.is_err());
    }

    #[test]
    fn each_bad_value_is_refused_naming_its_field_with_a_stable_code() {
        use OpenAiOptionsCode::*;
        type Breaker = fn(&mut OpenAiOptions);
        let cases: [(&str, OpenAiOptionsCode, Breaker); 11] = [
            ("connect_timeout", NotPositive, |o| {
                o.connect_timeout = Duration::ZERO
            }),
            ("request_timeout", NotPositive, |o| {
                o.request_timeout = Duration::ZERO
            }),
            ("request_timeout", AboveBound, |o| {
                o.request_timeout = Duration::MAX
            }),
            ("idle_timeout", NotPositive, |o| {
                o.idle_timeout = Duration::ZERO
            }),
            ("backoff_initial", NotPositive, |o| {
                o.backoff_initial = Duration::ZERO
            }),
            ("backoff_max", BackoffOrder, |o| {
                o.backoff_max = Duration::from_millis(1)
            }),
            ("backoff_max", AboveBound, |o| {
                o.backoff_max = Duration::from_secs(90_000)
            }),
            ("max_retries", AboveBound, |o| o.max_retries = 11),
            ("max_tokens", NotPositive, |o| o.max_tokens = Some(0)),
            ("temperature", OutOfRange, |o| {
                o.temperature = Some(f32::NAN)
            }),
            ("temperature", OutOfRange, |o| o.temperature = Some(2.5)),
        ];
        for (field, code, break_it) in cases {
            let mut o = OpenAiOptions::default();
            break_it(&mut o);
            let err = o.validate().unwrap_err();
            assert_eq!((err.field, err.code), (field, code), "{err}");
            assert!(err.to_string().starts_with(code.as_str()), "{err}");
        }
    }
}
