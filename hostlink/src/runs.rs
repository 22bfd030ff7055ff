//! The records of HostLink's workflow-run family (`run.*`, advertised by the capability token
//! `hostlink.run`). Requests decode strictly like every HostLink record: one JSON object, no
//! unknown, duplicate or `null` members, no trailing data, `version` exactly 1 — a request
//! that fails is Centrifuge error 107 and the link stays up. No request names a tenant, a
//! host, a holder or an answerer: the link's authenticated tenant scopes every call, and the
//! link's actor (its credential's principal, else `tenant:<tenant>`, see
//! [`crate::auth::actor_of`]) is recorded as the run's starter and as the answerer.
//!
//! | method | request members | result |
//! |---|---|---|
//! | `run.start` | `version`, `program`, `input`?, `idempotency_key`?, `traceparent`?, `tracestate`? | [`RunStarted`] |
//! | `run.resume` | `version`, `run_id`, `traceparent`?, `tracestate`? | [`RunStarted`] |
//! | `run.answer` | `version`, `run_id`, `checkpoint`, `value`, `traceparent`?, `tracestate`? | [`RunAnswered`] |
//! | `run.status` | `version`, `run_id`, `traceparent`?, `tracestate`? | [`RunView`] |
//! | `run.list` (alias `run.ps`) | `version`, `limit`?, `after`?, `traceparent`?, `tracestate`? | [`RunList`] |
//! | `run.cancel` | `version`, `run_id`, `traceparent`?, `tracestate`? | [`RunView`] |
//!
//! `traceparent`/`tracestate` are W3C trace context, parsed strictly like everywhere in HostLink
//! (a malformed one, or a `tracestate` alone, is 107). The call's span continues it; a run
//! started under a trace records the start call's context, and every step of the run, on
//! whichever Host drives it, continues that one trace.
//!
//! Every reply is a successful RPC reply whose data is `{"version":1,"result":…}` or
//! `{"version":1,"error":`[`RunRefusal`]`}`. Refusal codes ([`refusal_codes`]) are stable.
//!
//! Step events of a run are published on the channel `run:<tenant>:<run_id>` as
//! [`RunEvent`] records to a link of that tenant that subscribed to it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sessionstore::ids::check_opaque_id;
use sessionstore::{RunId, TenantId};

use trace_context::{TraceContext, TraceParent, TraceState};

use crate::records::{RecordError, V1, check_trace, decode_object, trace_of};

/// The capability token a Host serving runs advertises.
pub const RUN_CAPABILITY: &str = "hostlink.run";

/// The methods of the family.
pub const RUN_METHODS: [&str; 7] = [
    "run.start",
    "run.resume",
    "run.answer",
    "run.status",
    "run.list",
    "run.ps",
    "run.cancel",
];

/// The stable codes of a [`RunRefusal`].
pub mod refusal_codes {
    /// No such run for this tenant, or no such open checkpoint.
    pub const NOT_FOUND: &str = "not_found";
    /// Another attempt holds the run, or a different answer was recorded first.
    pub const CONFLICT: &str = "conflict";
    /// The Host is booting (its run reconcile has not finished) or the store is unreachable;
    /// retry.
    pub const UNAVAILABLE: &str = "unavailable";
    /// This Host drives as many runs as its admission cap allows.
    pub const RESOURCE_EXHAUSTED: &str = "resource_exhausted";
    /// The program (with `problems`) or the answer does not validate.
    pub const INVALID: &str = "invalid";
    /// The run is finished (or waits for an operator) and cannot do that.
    pub const STATE: &str = "state";
    /// The Host is draining.
    pub const NOT_ADMITTING: &str = "not_admitting";
    /// A running run whose program record is missing.
    pub const PROGRAM_MISSING: &str = "program_missing";
}

fn fail(record: &'static str, reason: impl Into<String>) -> RecordError {
    RecordError {
        record,
        reason: reason.into(),
    }
}

fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn no_null(record: &'static str, raw: &RawValue) -> Result<(), RecordError> {
    if raw.get().trim() == "null" {
        return Err(fail(record, "a member is null"));
    }
    Ok(())
}

/// `run.start`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStartRequest {
    pub version: V1,
    /// The program's exact source (YAML).
    pub program: String,
    /// The run's input (any JSON but `null`); `{}` when absent.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub input: Option<Box<RawValue>>,
    /// A retried start with the same key returns the run recorded first.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub idempotency_key: Option<String>,
    /// W3C trace context of the caller (see the module documentation).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl RunStartRequest {
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let r: RunStartRequest = decode_object("run_start", bytes)?;
        check_trace(&r.traceparent, &r.tracestate).map_err(|e| fail("run_start", e))?;
        if let Some(i) = &r.input {
            no_null("run_start", i)?;
        }
        if let Some(k) = &r.idempotency_key {
            check_opaque_id("idempotency_key", k).map_err(|e| fail("run_start", e.to_string()))?;
        }
        Ok(r)
    }

    /// The caller's trace context, if it gave one.
    pub fn trace(&self) -> Option<TraceContext> {
        trace_of(&self.traceparent, &self.tracestate)
    }
}

/// `run.resume`, `run.status`, `run.cancel`: one run.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub version: V1,
    pub run_id: RunId,
    /// W3C trace context of the caller (see the module documentation).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl RunRequest {
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let r: RunRequest = decode_object("run_request", bytes)?;
        check_trace(&r.traceparent, &r.tracestate).map_err(|e| fail("run_request", e))?;
        Ok(r)
    }
}

/// `run.answer`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAnswerRequest {
    pub version: V1,
    pub run_id: RunId,
    pub checkpoint: String,
    pub value: Box<RawValue>,
    /// W3C trace context of the caller (see the module documentation).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl RunAnswerRequest {
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let r: RunAnswerRequest = decode_object("run_answer", bytes)?;
        check_trace(&r.traceparent, &r.tracestate).map_err(|e| fail("run_answer", e))?;
        no_null("run_answer", &r.value)?;
        if r.checkpoint.is_empty() || r.checkpoint.len() > 128 {
            return Err(fail("run_answer", "checkpoint must be 1-128 bytes"));
        }
        Ok(r)
    }
}

/// The most runs one `run.list` reply carries, and what it carries when no `limit` is asked.
pub const RUN_LIST_MAX_LIMIT: u32 = 500;

/// `run.list` / `run.ps`: a page of the tenant's runs, oldest first.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunListRequest {
    pub version: V1,
    /// The most runs in the reply, 1 to [`RUN_LIST_MAX_LIMIT`] (the default).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub limit: Option<u32>,
    /// The run the page starts after: the `next` of the previous reply.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub after: Option<RunId>,
    /// W3C trace context of the caller (see the module documentation).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub traceparent: Option<TraceParent>,
    /// W3C vendor trace state; only with a `traceparent`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracestate: Option<TraceState>,
}

impl RunListRequest {
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let r: RunListRequest = decode_object("run_list", bytes)?;
        check_trace(&r.traceparent, &r.tracestate).map_err(|e| fail("run_list", e))?;
        if r.limit.is_some_and(|l| l == 0 || l > RUN_LIST_MAX_LIMIT) {
            return Err(fail(
                "run_list",
                format!("limit is from 1 to {RUN_LIST_MAX_LIMIT}"),
            ));
        }
        Ok(r)
    }

    /// The page size asked for, or the largest.
    pub fn page_limit(&self) -> u32 {
        self.limit.unwrap_or(RUN_LIST_MAX_LIMIT)
    }
}

/// A started (or resumed) run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStarted {
    pub run_id: String,
    pub epoch: u64,
    /// False when the idempotency key named a run started earlier.
    pub created: bool,
}

/// A recorded answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAnswered {
    pub run_id: String,
    pub checkpoint: String,
    /// False when the same answer was recorded before.
    pub recorded: bool,
    pub answerer: String,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFailureView {
    pub code: String,
    pub step: String,
    pub message: String,
}

/// The open checkpoint of a parked run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointView {
    pub name: String,
    /// ask, sleep or attention.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_ms: Option<i64>,
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    pub seq: u64,
    pub step: String,
    /// began, result or failure.
    pub entry: String,
    pub attempt: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    pub epoch: u64,
    pub recorded_at_ms: i64,
    pub body: serde_json::Value,
}

/// `run.status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: String,
    pub state: String,
    pub holder: String,
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<RunFailureView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointView>,
    pub journal: Vec<StepView>,
    /// Who started the run; `None` when the store does not know (a run recorded before it
    /// kept the starter).
    #[serde(default)]
    pub started_by: Option<String>,
    /// Every answer recorded for the run, with who gave it, in checkpoint order.
    #[serde(default)]
    pub answers: Vec<AnswerView>,
}

/// One recorded answer of a run: the checkpoint, who answered and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerView {
    pub checkpoint: String,
    pub answerer: String,
    pub answered_at_ms: i64,
}

/// One line of `run.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub epoch: u64,
    pub created_at_ms: i64,
}

/// `run.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// Present when more runs follow: ask again with `after` set to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One program problem (no source text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemView {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub line: usize,
    pub column: usize,
}

/// A refusal of a `run.*` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRefusal {
    /// One of [`refusal_codes`].
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ProblemView>,
}

/// A step event, published on the run's channel (see [`run_channel`]). The end of a drive is
/// published as `kind: "run"`, `phase: "finished"`, `outcome` the run's state (`completed`,
/// `failed`, `needs_attention`, `cancelled`), `step` the step it ended at (empty when none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvent {
    pub run_id: String,
    pub epoch: u64,
    pub step: String,
    pub kind: String,
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// A reply of the family: a result or a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunReply<T> {
    pub version: V1,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunRefusal>,
}

impl<T: Serialize> RunReply<T> {
    pub fn ok(result: T) -> String {
        serde_json::to_string(&RunReply {
            version: V1,
            result: Some(result),
            error: None,
        })
        .unwrap_or_default()
    }
}

impl RunReply<()> {
    pub fn refused(refusal: RunRefusal) -> String {
        serde_json::to_string(&RunReply::<()> {
            version: V1,
            result: None,
            error: Some(refusal),
        })
        .unwrap_or_default()
    }
}

impl<T: DeserializeOwned> RunReply<T> {
    /// Decodes a reply: the result, or the refusal.
    pub fn decode(bytes: &[u8]) -> Result<Result<T, RunRefusal>, RecordError> {
        let r: RunReply<T> = decode_object("run_reply", bytes)?;
        match (r.result, r.error) {
            (Some(v), None) => Ok(Ok(v)),
            (None, Some(e)) => Ok(Err(e)),
            _ => Err(fail("run_reply", "exactly one of result and error")),
        }
    }
}

/// The prefix of every run channel.
pub const RUN_CHANNEL_PREFIX: &str = "hostlink.run.v1.";

/// The channel of one run's step events: `hostlink.run.v1.<tenant>.<run>`, each id base64url
/// without padding (like a session channel, so any id fits).
pub fn run_channel(tenant: &TenantId, run: &RunId) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{RUN_CHANNEL_PREFIX}{}.{}",
        b64.encode(tenant.as_str()),
        b64.encode(run.as_str())
    )
}

/// The tenant and run a run channel names; `None` for anything else.
pub fn parse_run_channel(channel: &str) -> Option<(TenantId, RunId)> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let rest = channel.strip_prefix(RUN_CHANNEL_PREFIX)?;
    let (tenant, run) = rest.split_once('.')?;
    if run.contains('.') {
        return None;
    }
    Some((
        TenantId::from_bytes(&b64.decode(tenant).ok()?).ok()?,
        RunId::new(String::from_utf8(b64.decode(run).ok()?).ok()?).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_with_an_extra_or_null_member_or_another_version_is_refused() {
        for bad in [
            r#"{"version":1,"program":"x","host_id":"h"}"#,
            r#"{"version":1,"program":"x","run_id":"r"}"#,
            r#"{"version":1,"program":"x","input":null}"#,
            r#"{"version":2,"program":"x"}"#,
            r#"{"version":1,"program":"x","program":"y"}"#,
            r#"{"version":1,"program":"x"} {}"#,
        ] {
            assert!(RunStartRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
        let ok =
            RunStartRequest::decode(br#"{"version":1,"program":"x","input":{"a":1}}"#).unwrap();
        assert_eq!(ok.input.unwrap().get(), r#"{"a":1}"#);
    }

    #[test]
    fn an_answer_naming_who_answered_is_refused() {
        for bad in [
            r#"{"version":1,"run_id":"r","checkpoint":"c","value":1,"by":"bob"}"#,
            r#"{"version":1,"run_id":"r","checkpoint":"c","value":1,"answerer":"bob"}"#,
            r#"{"version":1,"run_id":"r","checkpoint":"c","value":null}"#,
        ] {
            assert!(RunAnswerRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_resume_carrying_a_program_is_refused() {
        assert!(RunRequest::decode(br#"{"version":1,"run_id":"r","program":"x"}"#).is_err());
        assert!(RunRequest::decode(br#"{"version":1,"run_id":"r"}"#).is_ok());
    }

    #[test]
    fn a_reply_is_a_result_or_a_refusal() {
        let ok = RunReply::ok(RunList {
            runs: Vec::new(),
            next: None,
        });
        assert_eq!(
            RunReply::<RunList>::decode(ok.as_bytes()).unwrap(),
            Ok(RunList {
                runs: Vec::new(),
                next: None,
            })
        );
        let no = RunReply::refused(RunRefusal {
            code: refusal_codes::NOT_FOUND.into(),
            message: "no such run".into(),
            problems: Vec::new(),
        });
        assert!(RunReply::<RunList>::decode(no.as_bytes()).unwrap().is_err());
    }

    #[test]
    fn a_run_channel_names_its_tenant_and_run() {
        let t = TenantId::new("acme").unwrap();
        let r = RunId::new("run-1").unwrap();
        assert_eq!(parse_run_channel(&run_channel(&t, &r)), Some((t, r)));
        let odd = TenantId::new("a:b.c").unwrap();
        let r = RunId::new("run-2").unwrap();
        assert_eq!(parse_run_channel(&run_channel(&odd, &r)), Some((odd, r)));
        assert_eq!(parse_run_channel("hostlink.v1.YWNtZQ.cw"), None);
        assert_eq!(parse_run_channel("hostlink.run.v1.YWNtZQ"), None);
    }
}
