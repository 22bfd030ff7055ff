//! `tracestate`: a comma-separated list of at most 32 `key=value` members, each key unique,
//! at most 512 characters in all. Keys and values follow the W3C grammar; optional white
//! space around members is allowed on the way in and kept as sent (the text is passed on
//! byte for byte, never re-ordered here).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::TraceContextError;

const MAX_MEMBERS: usize = 32;
const MAX_LEN: usize = 512;

/// Vendors' trace state, validated and kept as text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceState(String);

impl TraceState {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `lcalpha 0*255( lcalpha / DIGIT / "_" / "-"/ "*" / "/" )`, or with a tenant:
/// `( lcalpha / DIGIT ) 0*240(...) "@" lcalpha 0*13(...)`.
fn valid_key(key: &str) -> bool {
    fn rest(c: u8) -> bool {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'*' | b'/')
    }
    match key.split_once('@') {
        None => {
            let b = key.as_bytes();
            !b.is_empty()
                && b.len() <= 256
                && b[0].is_ascii_lowercase()
                && b[1..].iter().all(|&c| rest(c))
        }
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            !t.is_empty()
                && t.len() <= 241
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t[1..].iter().all(|&c| rest(c))
                && !s.is_empty()
                && s.len() <= 14
                && s[0].is_ascii_lowercase()
                && s[1..].iter().all(|&c| rest(c))
        }
    }
}

/// Printable ASCII except `,` and `=`, at most 256, not ending in a space.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

impl FromStr for TraceState {
    type Err = TraceContextError;

    fn from_str(s: &str) -> Result<TraceState, TraceContextError> {
        if s.len() > MAX_LEN {
            return Err(TraceContextError::state("longer than 512 characters"));
        }
        let mut keys: Vec<&str> = Vec::new();
        for member in s.split(',') {
            let member = member.trim_matches(|c| c == ' ' || c == '\t');
            let Some((key, value)) = member.split_once('=') else {
                return Err(TraceContextError::state("a member is not key=value"));
            };
            if !valid_key(key) {
                return Err(TraceContextError::state("a key breaks the key grammar"));
            }
            if !valid_value(value) {
                return Err(TraceContextError::state("a value breaks the value grammar"));
            }
            if keys.contains(&key) {
                return Err(TraceContextError::state("a key is repeated"));
            }
            keys.push(key);
            if keys.len() > MAX_MEMBERS {
                return Err(TraceContextError::state("more than 32 members"));
            }
        }
        Ok(TraceState(s.to_owned()))
    }
}

impl fmt::Display for TraceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TraceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceState({:?})", self.0)
    }
}

impl Serialize for TraceState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TraceState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TraceState, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_tracestates_are_kept_as_sent() {
        for good in [
            "rojo=00f067aa0ba902b7",
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            "tenant1@vendor=abc, other=x y",
            "a/b*c_d-e=1",
        ] {
            let s: TraceState = good.parse().unwrap();
            assert_eq!(s.as_str(), good);
        }
    }

    #[test]
    fn malformed_tracestates_are_refused() {
        let too_many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let too_long = format!("k={}", "v".repeat(600));
        for bad in [
            "",
            "novalue",
            "=v",
            "Upper=v",
            "k=",
            "k=a,b",
            "k=v,k=w",
            "k=v=w",
            "k=v\u{7f}",
            "1k=v",
            "@v=x",
            too_many.as_str(),
            too_long.as_str(),
        ] {
            assert!(bad.parse::<TraceState>().is_err(), "accepted {bad:?}");
        }
    }
}
