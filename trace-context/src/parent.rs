//! `traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lower-case, exactly
//! 55 characters. Only version `00` is read: a later version may add fields this build cannot
//! check, and reading a prefix of it would be the half-parse the protocol forbids.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::TraceContextError;

/// The length of a version-00 `traceparent`.
const LEN: usize = 55;

/// Where the work continues from: a trace, the caller's span in it, and the sampled flag.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// A parent from raw ids; all-zero ids are refused as in the header form.
    pub fn new(
        trace_id: [u8; 16],
        parent_id: [u8; 8],
        sampled: bool,
    ) -> Result<TraceParent, TraceContextError> {
        if trace_id == [0; 16] {
            return Err(TraceContextError::parent("the trace id is all zeros"));
        }
        if parent_id == [0; 8] {
            return Err(TraceContextError::parent("the parent id is all zeros"));
        }
        Ok(TraceParent {
            trace_id,
            parent_id,
            flags: u8::from(sampled),
        })
    }

    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    pub fn parent_id(&self) -> [u8; 8] {
        self.parent_id
    }

    /// The trace flags byte as the caller sent it.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the caller recorded its span (the `sampled` flag).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    pub fn trace_id_hex(&self) -> String {
        hex_lower(&self.trace_id)
    }

    pub fn parent_id_hex(&self) -> String {
        hex_lower(&self.parent_id)
    }
}

fn hex_lower(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Lower-case hex into `out`; anything else (upper case included) is refused.
fn unhex(text: &[u8], out: &mut [u8]) -> Result<(), TraceContextError> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    for (i, pair) in text.chunks_exact(2).enumerate() {
        let (Some(hi), Some(lo)) = (digit(pair[0]), digit(pair[1])) else {
            return Err(TraceContextError::parent(
                "fields must be lower-case hexadecimal",
            ));
        };
        out[i] = hi << 4 | lo;
    }
    Ok(())
}

impl FromStr for TraceParent {
    type Err = TraceContextError;

    fn from_str(s: &str) -> Result<TraceParent, TraceContextError> {
        let b = s.as_bytes();
        if b.len() < 2 {
            return Err(TraceContextError::parent("too short"));
        }
        let mut version = [0u8; 1];
        unhex(&b[..2], &mut version)?;
        if version[0] == 0xff {
            return Err(TraceContextError::parent("version ff is forbidden"));
        }
        if version[0] != 0 {
            return Err(TraceContextError::parent("only version 00 is understood"));
        }
        if b.len() != LEN {
            return Err(TraceContextError::parent(
                "a version-00 traceparent is 55 characters",
            ));
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceContextError::parent(
                "fields must be separated by single dashes",
            ));
        }
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        let mut flags = [0u8; 1];
        unhex(&b[3..35], &mut trace_id)?;
        unhex(&b[36..52], &mut parent_id)?;
        unhex(&b[53..55], &mut flags)?;
        let mut p = TraceParent::new(trace_id, parent_id, false)?;
        p.flags = flags[0];
        Ok(p)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.parent_id_hex(),
            self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

impl Serialize for TraceParent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceParent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TraceParent, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_read_into_its_fields() {
        let p: TraceParent = GOOD.parse().unwrap();
        assert_eq!(p.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id_hex(), "00f067aa0ba902b7");
        assert!(p.sampled());
        assert_eq!(p.to_string(), GOOD);
    }

    #[test]
    fn every_malformed_traceparent_is_refused_whole() {
        let bad = [
            "",
            "0",
            "00",
            // upper-case hex
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // all-zero trace id and parent id
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // forbidden and unknown versions
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // trailing data, short fields, wrong separators, non-hex
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert!(b.parse::<TraceParent>().is_err(), "accepted {b:?}");
        }
    }

    #[test]
    fn serde_refuses_a_malformed_traceparent_and_keeps_a_good_one() {
        let p: TraceParent = serde_json::from_str(&format!("\"{GOOD}\"")).unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{GOOD}\""));
        assert!(serde_json::from_str::<TraceParent>("\"00-abc\"").is_err());
        assert!(serde_json::from_str::<TraceParent>("7").is_err());
    }

    proptest! {
        #[test]
        fn any_valid_ids_round_trip_through_the_header(
            t in any::<[u8; 16]>(), p in any::<[u8; 8]>(), f in any::<u8>()
        ) {
            prop_assume!(t != [0; 16] && p != [0; 8]);
            let mut parent = TraceParent::new(t, p, false).unwrap();
            parent.flags = f;
            let again: TraceParent = parent.to_string().parse().unwrap();
            prop_assert_eq!(again, parent);
        }

        #[test]
        fn no_text_of_another_length_is_accepted(s in "[0-9a-f-]{0,80}") {
            prop_assume!(s.len() != LEN);
            prop_assert!(s.parse::<TraceParent>().is_err());
        }
    }
}
