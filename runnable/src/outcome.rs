//! The outcome of one invocation, decided by one pure function from what was observed. CLI
//! `invoke`, agent tool calls and workflow steps all classify through [`classify`], so the same
//! handler behaviour always gets the same class.
//!
//! **The result document.** A handler writes exactly one JSON document to stdout:
//! `{"ok": true, "output": <value>}` or
//! `{"ok": false, "error": {"code": "<text>", "message": "<text>"}}` (no other members).
//! Logs go to stderr. More than one document, anything that is not one of those shapes, or
//! more than the size bound is not a result.
//!
//! **Precedence** (first match wins):
//!
//! | # | observed | class |
//! |---|---|---|
//! | 1 | a cancellation was asked for before the process ended | `cancelled` |
//! | 2 | the deadline passed before the process ended | `timed_out` |
//! | 3 | the process was ended by a signal | `crashed` |
//! | 4 | a failure document (any exit status) | `failed` |
//! | 5 | a non-zero exit status (with a success document, no document, or a bad one) | `crashed` |
//! | 6 | exit 0 and a success document whose output validates | `succeeded` |
//! | 7 | exit 0 and a success document whose output does not validate | `invalid_output` |
//! | 8 | exit 0 and no document, or a bad one | `invalid_output` |
//!
//! A document only counts when the process ended on its own before the deadline: what a
//! handler prints while it is being stopped is never believed. Only `succeeded` and `failed`
//! are **certain**; after any other class the effect may or may not have happened.
//!
//! This module is pure: it must never run, read or wait for anything.

use serde_json::Value;
use wire_enum::wire_enum;

use crate::error::HandlerError;
use crate::error::Violation;
use crate::schema::Schema;

wire_enum! {
    /// The class of an outcome. `ALL` is in the documented order.
    pub enum OutcomeClass {
        Succeeded = "succeeded",
        Failed = "failed",
        InvalidOutput = "invalid_output",
        Crashed = "crashed",
        TimedOut = "timed_out",
        Cancelled = "cancelled",
    }
    kind = "outcome_class";
    serde;
}

impl OutcomeClass {
    /// Whether the outcome proves what happened (`succeeded` and `failed` only).
    pub fn is_certain(self) -> bool {
        matches!(self, OutcomeClass::Succeeded | OutcomeClass::Failed)
    }
}

/// How the handler's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// What stdout held.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    /// Nothing but whitespace.
    Absent,
    /// Something that is not one result document.
    Malformed(String),
    Success(Value),
    Failure(HandlerError),
}

/// Everything the classifier looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// A cancellation was asked for before the process ended on its own.
    pub cancelled: bool,
    /// The deadline passed before the process ended on its own.
    pub deadline_passed: bool,
    pub exit: ExitStatus,
    pub document: Document,
}

/// The decided outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    pub class: OutcomeClass,
    pub certain: bool,
    /// The output (succeeded only).
    pub output: Option<Value>,
    /// The handler's own error (failed only).
    pub error: Option<HandlerError>,
    /// Output schema violations (invalid_output with a success document).
    pub violations: Vec<Violation>,
    /// One sentence saying what was observed and, when uncertain, that the effect is unknown.
    pub detail: String,
}

const UNKNOWN: &str = "whether its effect happened is unknown";

/// Decides the outcome (see the module docs for the precedence).
pub fn classify(obs: &Observation, output_schema: &Schema) -> Classified {
    let uncertain = |class: OutcomeClass, why: String| Classified {
        class,
        certain: false,
        output: None,
        error: None,
        violations: Vec::new(),
        detail: format!("{why}; {UNKNOWN}"),
    };
    if obs.cancelled {
        return uncertain(
            OutcomeClass::Cancelled,
            "the invocation was cancelled before the handler finished, and its process group was stopped".into(),
        );
    }
    if obs.deadline_passed {
        return uncertain(
            OutcomeClass::TimedOut,
            "the handler was still running at its deadline, and its process group was stopped"
                .into(),
        );
    }
    if let Some(sig) = obs.exit.signal {
        return uncertain(
            OutcomeClass::Crashed,
            format!("the handler was ended by signal {sig}"),
        );
    }
    if let Document::Failure(err) = &obs.document {
        return Classified {
            class: OutcomeClass::Failed,
            certain: true,
            output: None,
            error: Some(err.clone()),
            violations: Vec::new(),
            detail: format!("the handler reported failure {}: {}", err.code, err.message),
        };
    }
    let code = obs.exit.code.unwrap_or(-1);
    if code != 0 {
        let what = match &obs.document {
            Document::Success(_) => "after printing a success document",
            Document::Absent => "without a result document",
            _ => "without a valid result document",
        };
        return uncertain(
            OutcomeClass::Crashed,
            format!("the handler exited with status {code} {what}"),
        );
    }
    match &obs.document {
        Document::Success(output) => {
            let violations = output_schema.validate(output);
            if violations.is_empty() {
                Classified {
                    class: OutcomeClass::Succeeded,
                    certain: true,
                    output: Some(output.clone()),
                    error: None,
                    violations,
                    detail: "the handler succeeded and its output matches the output schema".into(),
                }
            } else {
                Classified {
                    violations,
                    ..uncertain(
                        OutcomeClass::InvalidOutput,
                        "the handler's output does not match the output schema".into(),
                    )
                }
            }
        }
        Document::Absent => uncertain(
            OutcomeClass::InvalidOutput,
            "the handler exited 0 without writing a result document".into(),
        ),
        Document::Malformed(why) => uncertain(
            OutcomeClass::InvalidOutput,
            format!("the handler exited 0 but its stdout is not a result document ({why})"),
        ),
        Document::Failure(_) => unreachable_failure(),
    }
}

/// Failure documents are handled before the exit status; kept total without a panic.
fn unreachable_failure() -> Classified {
    Classified {
        class: OutcomeClass::Crashed,
        certain: false,
        output: None,
        error: None,
        violations: Vec::new(),
        detail: format!("inconsistent observation; {UNKNOWN}"),
    }
}

/// Reads stdout into a [`Document`]. `overflowed` says the handler wrote more than the bound.
pub fn parse_document(stdout: &[u8], overflowed: bool, bound: usize) -> Document {
    if overflowed {
        return Document::Malformed(format!("more than {bound} bytes on stdout"));
    }
    if stdout.iter().all(|b| b.is_ascii_whitespace()) {
        return Document::Absent;
    }
    let mut stream = serde_json::Deserializer::from_slice(stdout).into_iter::<Value>();
    let first = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Document::Malformed(format!("not JSON: {e}")),
        None => return Document::Absent,
    };
    match stream.next() {
        None => {}
        Some(Ok(_)) => return Document::Malformed("more than one JSON document".into()),
        Some(Err(e)) => {
            return Document::Malformed(format!("trailing data after the document: {e}"));
        }
    }
    let Value::Object(doc) = first else {
        return Document::Malformed("the document is not an object".into());
    };
    if let Some(k) = doc
        .keys()
        .find(|k| !matches!(k.as_str(), "ok" | "output" | "error"))
    {
        return Document::Malformed(format!("unknown member `{k}`"));
    }
    match doc.get("ok") {
        Some(Value::Bool(true)) => {
            if doc.contains_key("error") {
                return Document::Malformed("a success document has no `error`".into());
            }
            match doc.get("output") {
                Some(out) => Document::Success(out.clone()),
                None => Document::Malformed("a success document needs `output`".into()),
            }
        }
        Some(Value::Bool(false)) => {
            if doc.contains_key("output") {
                return Document::Malformed("a failure document has no `output`".into());
            }
            let err = doc.get("error");
            let code = err.and_then(|e| e.get("code")).and_then(Value::as_str);
            let message = err.and_then(|e| e.get("message")).and_then(Value::as_str);
            let extra = err
                .and_then(Value::as_object)
                .is_some_and(|e| e.keys().any(|k| k != "code" && k != "message"));
            match (code, message) {
                (Some(code), Some(message)) if !code.is_empty() && !extra => {
                    Document::Failure(HandlerError {
                        code: code.to_owned(),
                        message: message.to_owned(),
                    })
                }
                _ => Document::Malformed(
                    "a failure document needs `error: {code, message}` (two strings, code not empty)"
                        .into(),
                ),
            }
        }
        _ => Document::Malformed("`ok` must be true or false".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        let node =
            strict_yaml::load("type: object\nproperties: {n: {type: integer}}\nrequired: [n]\n")
                .unwrap();
        Schema::read(&node, "output").unwrap()
    }

    fn exit(code: i32) -> ExitStatus {
        ExitStatus {
            code: Some(code),
            signal: None,
        }
    }

    const SIGNALLED: ExitStatus = ExitStatus {
        code: None,
        signal: Some(9),
    };

    /// Every combination of the observed facts, against the table in the module docs.
    #[test]
    fn the_precedence_table_holds_for_every_combination() {
        let s = schema();
        let docs = [
            Document::Absent,
            Document::Malformed("x".into()),
            Document::Success(json!({"n": 1})),
            Document::Success(json!({"n": "one"})),
            Document::Failure(HandlerError {
                code: "nope".into(),
                message: "m".into(),
            }),
        ];
        let exits = [exit(0), exit(3), SIGNALLED];
        for cancelled in [false, true] {
            for deadline_passed in [false, true] {
                for e in exits {
                    for d in &docs {
                        let obs = Observation {
                            cancelled,
                            deadline_passed,
                            exit: e,
                            document: d.clone(),
                        };
                        let got = classify(&obs, &s).class;
                        let want = if cancelled {
                            OutcomeClass::Cancelled
                        } else if deadline_passed {
                            OutcomeClass::TimedOut
                        } else if e.signal.is_some() {
                            OutcomeClass::Crashed
                        } else if matches!(d, Document::Failure(_)) {
                            OutcomeClass::Failed
                        } else if e.code != Some(0) {
                            OutcomeClass::Crashed
                        } else if *d == Document::Success(json!({"n": 1})) {
                            OutcomeClass::Succeeded
                        } else {
                            OutcomeClass::InvalidOutput
                        };
                        assert_eq!(got, want, "{obs:?}");
                        assert_eq!(
                            classify(&obs, &s).certain,
                            matches!(want, OutcomeClass::Succeeded | OutcomeClass::Failed)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn uncertain_outcomes_say_the_effect_is_unknown() {
        let obs = Observation {
            cancelled: false,
            deadline_passed: false,
            exit: exit(3),
            document: Document::Absent,
        };
        let c = classify(&obs, &schema());
        assert!(!c.certain);
        assert!(c.detail.contains("unknown"), "{}", c.detail);
    }

    #[test]
    fn documents_are_read_strictly() {
        assert_eq!(parse_document(b"  \n", false, 10), Document::Absent);
        assert!(matches!(
            parse_document(
                br#"{"ok":true,"output":1}{"ok":true,"output":2}"#,
                false,
                99
            ),
            Document::Malformed(_)
        ));
        assert!(matches!(
            parse_document(br#"{"ok":true}"#, false, 99),
            Document::Malformed(_)
        ));
        assert!(matches!(
            parse_document(br#"{"ok":true,"output":1,"extra":2}"#, false, 99),
            Document::Malformed(_)
        ));
        assert_eq!(
            parse_document(br#"{"ok":true,"output":{"a":1}}"#, false, 99),
            Document::Success(json!({"a": 1}))
        );
        assert!(matches!(
            parse_document(
                br#"{"ok":false,"error":{"code":"x","message":"y"}}"#,
                false,
                99
            ),
            Document::Failure(_)
        ));
        assert!(matches!(
            parse_document(b"{}", true, 2),
            Document::Malformed(_)
        ));
    }
}
