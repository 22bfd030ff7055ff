//! The gate vocabulary a runtime's public events share with the Host. A runtime that raises
//! gates journals them as public events whose JSON body has `"type": "gate_opened"` (with
//! `gate_id`, `kind`, `prompt` and `timeout_ms`) or `"type": "gate_resolved"` (with
//! `gate_id`). The Host folds these to publish gates; it reads nothing else of a body.

use serde_json::Value;

/// A gate event read from a public body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateEvent {
    Opened {
        gate_id: String,
        kind: String,
        prompt: String,
        /// The gate's own timeout, when it declares one.
        timeout_ms: Option<u64>,
    },
    Resolved {
        gate_id: String,
    },
}

impl GateEvent {
    /// Reads a gate event from a public body; `None` for any other event (or a body that is
    /// not a JSON object).
    pub fn parse(body: &[u8]) -> Option<GateEvent> {
        // A cheap filter first: most events are not gates.
        let text = std::str::from_utf8(body).ok()?;
        if !text.contains("\"gate_") {
            return None;
        }
        let v: Value = serde_json::from_str(text).ok()?;
        let obj = v.as_object()?;
        let gate_id = obj.get("gate_id")?.as_str()?.to_owned();
        match obj.get("type")?.as_str()? {
            "gate_opened" => Some(GateEvent::Opened {
                gate_id,
                kind: obj
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
                prompt: obj
                    .get("prompt")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                timeout_ms: obj.get("timeout_ms").and_then(Value::as_u64),
            }),
            "gate_resolved" => Some(GateEvent::Resolved { gate_id }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_events_are_read_and_others_ignored() {
        let o = GateEvent::parse(br#"{"type":"gate_opened","gate_id":"g","kind":"permission","prompt":"ok?","timeout_ms":5}"#);
        assert_eq!(
            o,
            Some(GateEvent::Opened {
                gate_id: "g".into(),
                kind: "permission".into(),
                prompt: "ok?".into(),
                timeout_ms: Some(5)
            })
        );
        assert_eq!(
            GateEvent::parse(br#"{"type":"gate_resolved","gate_id":"g","action":"deny"}"#),
            Some(GateEvent::Resolved {
                gate_id: "g".into()
            })
        );
        assert_eq!(
            GateEvent::parse(br#"{"type":"user_message","text":"gate_id"}"#),
            None
        );
        assert_eq!(GateEvent::parse(b"not json \"gate_"), None);
    }
}
