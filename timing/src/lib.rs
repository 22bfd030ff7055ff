//! Time as every Host crate spends it: [`duration_text`], durations written the way people
//! write them in flags and config files (`500ms`, `30s`, `5m`), and [`Backoff`], the one
//! exponential backoff between retries. This crate owns no clock and no task; it must never
//! depend on another crate of the workspace, so that every crate can use it.

#![forbid(unsafe_code)]

mod backoff;

pub use backoff::{Backoff, Retries, jitter_fraction};

/// Durations as human text (`"500ms"`, `"10s"`) in serialized options: use as
/// `#[serde(with = "timing::duration_text")]`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(de::Error::custom)
    }

    /// Parses a duration as a flag or a config file spells it.
    pub fn parse(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text.trim()).map_err(|e| format!("{e} (e.g. 500ms, 30s, 5m)"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Probe {
        #[serde(with = "crate::duration_text")]
        wait: Duration,
    }

    #[test]
    fn a_duration_round_trips_as_the_text_people_write() {
        let p = Probe {
            wait: Duration::from_millis(1500),
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"wait":"1s 500ms"}"#);
        assert_eq!(serde_json::from_str::<Probe>(&text).unwrap(), p);
    }

    #[test]
    fn a_duration_without_a_unit_is_refused_with_an_example() {
        let err = crate::duration_text::parse("30").unwrap_err();
        assert!(err.contains("e.g. 500ms"), "{err}");
    }
}
