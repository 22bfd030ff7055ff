//! The console's JSON API, version 1. Owns the handlers, the authentication of each request,
//! the role rules and the error shape. It shows public ids only: no runtime session id, runtime
//! command id, attempt id, claim token or run fencing token leaves it.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sessionstore::wire::{CommandBodyV1, GateAnswer, encode_command_body};
use sessionstore::{
    CommandBody, CommandId, CommandKind, CommandRecord, ErrorCode, GateCursor, GateId, GateRecord,
    NewCommand, RunId, RunOrder, SessionId, SessionRecord, StoreError, TenantId,
};

use crate::Console;
use crate::auth::{Operator, Role};

/// The cookie the login sets.
pub const COOKIE: &str = "hostd_console";

/// The most items one page of a list carries.
pub const MAX_PAGE: usize = 200;

/// How long an operator's gate answer may wait to be applied.
const ANSWER_APPLY_WITHIN: std::time::Duration = std::time::Duration::from_secs(600);

/// A refusal: an HTTP status and a stable code.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn unauthenticated() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "an operator credential is required",
        )
    }

    fn forbidden() -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this needs the operate role",
        )
    }

    pub(crate) fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid", message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e.code() {
            ErrorCode::NotFound => ApiError::not_found(e.to_string()),
            ErrorCode::Conflict => ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string()),
            ErrorCode::Invalid => ApiError::invalid(e.to_string()),
            ErrorCode::Unavailable => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response();
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(v: Value) -> ApiResult {
    let mut r = Json(v).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// The token a request presents: a bearer header first, then the login cookie.
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ")
    {
        return Some(t.trim().to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// The operator behind a request, or `unauthenticated`.
pub(crate) fn operator(c: &Console, headers: &HeaderMap) -> Result<Operator, ApiError> {
    presented(headers)
        .and_then(|t| c.operators.check(&t))
        .ok_or_else(ApiError::unauthenticated)
}

fn operate(c: &Console, headers: &HeaderMap) -> Result<Operator, ApiError> {
    let op = operator(c, headers)?;
    if op.role != Role::Operate {
        return Err(ApiError::forbidden());
    }
    Ok(op)
}

fn tenant(c: &Console, t: &str) -> Result<TenantId, ApiError> {
    let t = TenantId::new(t).map_err(|e| ApiError::invalid(e.to_string()))?;
    if !c.tenants.contains(&t) {
        return Err(ApiError::not_found(format!("no tenant {t} on this Host")));
    }
    Ok(t)
}

/// The tenants a list covers: the one `only` names (one of the console's), or every one.
fn listed_tenants(c: &Console, only: Option<&str>) -> Result<Vec<TenantId>, ApiError> {
    match only {
        Some(t) => Ok(vec![tenant(c, t)?]),
        None => Ok(c.tenants.iter().cloned().collect()),
    }
}

fn session_id(s: &str) -> Result<SessionId, ApiError> {
    SessionId::new(s).map_err(|e| ApiError::invalid(e.to_string()))
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such console page or API")
}

// ------------------------------------------------------------------------ login

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    token: String,
}

/// Checks a token and sets the login cookie.
pub async fn login(State(c): State<Console>, Json(body): Json<Login>) -> ApiResult {
    let op = c
        .operators
        .check(&body.token)
        .ok_or_else(ApiError::unauthenticated)?;
    // The token is the cookie's value; it is never readable by scripts.
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/console",
        body.token
    );
    let mut r = ok(json!({"operator": op}))?;
    let v =
        HeaderValue::from_str(&cookie).map_err(|_| ApiError::invalid("a token must be text"))?;
    r.headers_mut().insert(header::SET_COOKIE, v);
    Ok(r)
}

/// Clears the login cookie.
pub async fn logout() -> ApiResult {
    let mut r = ok(json!({}))?;
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "hostd_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0",
        ),
    );
    Ok(r)
}

pub async fn whoami(State(c): State<Console>, headers: HeaderMap) -> ApiResult {
    let op = operator(&c, &headers)?;
    let host = c.service.config().host_id.to_string();
    ok(json!({"operator": op, "host_id": host, "version": c.service.version()}))
}

// ------------------------------------------------------------------------ hosts

pub async fn hosts(State(c): State<Console>, headers: HeaderMap) -> ApiResult {
    operator(&c, &headers)?;
    let store = c.service.store();
    let now = store.now_ms().await?;
    let targets = store.targets(false).await?;
    let loads = store.host_loads().await?;
    let held: BTreeMap<String, u32> = loads
        .iter()
        .filter_map(|l| l.host.as_ref().map(|h| (h.to_string(), l.sessions)))
        .collect();
    let me = c.service.config().host_id.to_string();
    let readiness = c.service.readiness();
    let mut rows: Vec<Value> = Vec::with_capacity(targets.len());
    for t in &targets {
        let id = t.host.to_string();
        let this = id == me;
        // Who asked this incarnation to drain (`null`: nobody did, or it was not recorded).
        let drain = store.drain_request(&t.host, t.generation).await?;
        rows.push(json!({
                "host_id": id,
                "endpoint": t.endpoint,
                "generation": t.generation,
                "heartbeat_age_ms": now.saturating_sub(t.observed_at_ms),
                "live": t.is_live(now),
                "accepting": t.accepting,
                "draining": !t.accepting,
                "capacity": t.capacity,
                "used": t.weight_used,
                "free": t.capacity.saturating_sub(t.weight_used),
                "sessions": held.get(&id).copied().unwrap_or(0),
                "this": this,
                "ready": if this { json!(readiness.ready) } else { Value::Null },
                "reasons": if this { json!(readiness.reasons) } else { Value::Null },
                "drain_requested_by": drain.map(|d| d.requested_by),
        }));
    }
    ok(json!({"host_id": me, "hosts": rows}))
}

// ------------------------------------------------------------------------ sessions

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// Where the previous page ended (`next` of its reply).
    after: Option<String>,
    limit: Option<usize>,
    tenant: Option<String>,
}

fn page_limit(l: Option<usize>) -> Result<usize, ApiError> {
    match l {
        None => Ok(50),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid(format!("limit must be 1-{MAX_PAGE}"))),
    }
}

/// A cursor over (tenant, session): `<tenant>/<session>`, percent-free because both ids
/// exclude `/`.
fn cursor(t: &TenantId, s: &SessionId) -> String {
    format!("{t}/{s}")
}

/// One session's row; `now` is the store's time, read once per page.
async fn session_row(c: &Console, s: &SessionRecord, now: i64) -> Result<Value, ApiError> {
    let store = c.service.store();
    let lease = store.residency(&s.tenant, &s.session).await?;
    let gates = store.gates(&s.tenant, &s.session, true).await?;
    let here = c.service.residency(&s.tenant, &s.session);
    let last = store.newest_commands(&s.tenant, &s.session, 1).await?;
    let last = last.first().map(|r| {
        json!({"command_id": r.command.as_str(), "kind": r.kind.as_str(), "state": r.state.as_str()})
    });
    let blocked = c.service.command_blocked(&s.tenant, &s.session);
    let (host, epoch, live) = match &lease {
        Some(l) => (
            l.host.as_ref().map(|h| h.to_string()),
            Some(l.epoch.0),
            l.is_live(now),
        ),
        None => (None, None, false),
    };
    Ok(json!({
        "tenant_id": s.tenant.as_str(),
        "session_id": s.session.as_str(),
        "agent_id": s.agent.as_str(),
        "residency_state": s.residency_state.as_str(),
        "host_id": if live { json!(host) } else { Value::Null },
        "epoch": epoch,
        "resident_here": here.is_some(),
        "gates_open": gates.len(),
        "gate_waiting": !gates.is_empty(),
        "last_command": last,
        // Known only where the session is resident: this Host's consumer says so.
        "command_blocked": blocked,
        "created_at_ms": s.created_at_ms,
        "last_active_ms": s.last_active_ms,
    }))
}

pub async fn sessions(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Page>,
) -> ApiResult {
    operator(&c, &headers)?;
    let limit = page_limit(q.limit)?;
    let only = q.tenant.as_deref().map(|t| tenant(&c, t)).transpose()?;
    let (mut from_tenant, mut after_session) = (None, None);
    if let Some(a) = &q.after {
        let (t, s) = a
            .split_once('/')
            .ok_or_else(|| ApiError::invalid("after is `<tenant>/<session>`"))?;
        from_tenant = Some(TenantId::new(t).map_err(|e| ApiError::invalid(e.to_string()))?);
        after_session = Some(session_id(s)?);
    }
    let store = c.service.store();
    let now = store.now_ms().await?;
    let mut rows = Vec::new();
    let mut next = None;
    let mut last: Option<(TenantId, SessionId)> = None;
    'tenants: for t in c.tenants.iter() {
        if only.as_ref().is_some_and(|o| o != t) || from_tenant.as_ref().is_some_and(|f| t < f) {
            continue;
        }
        let mut after = if from_tenant.as_ref() == Some(t) {
            after_session.clone()
        } else {
            None
        };
        loop {
            let page = store
                .list_sessions(t, after.as_ref(), limit + 1 - rows.len())
                .await?;
            let full = page.len() == limit + 1 - rows.len();
            for s in &page {
                if rows.len() == limit {
                    next = last.as_ref().map(|(t, s)| cursor(t, s));
                    break 'tenants;
                }
                rows.push(session_row(&c, s, now).await?);
                last = Some((s.tenant.clone(), s.session.clone()));
            }
            match page.last() {
                Some(last) if full => after = Some(last.session.clone()),
                _ => break,
            }
        }
    }
    ok(json!({"sessions": rows, "next": next}))
}

fn command_view(r: &CommandRecord) -> Value {
    json!({
        "command_id": r.command.as_str(),
        "kind": r.kind.as_str(),
        "state": r.state.as_str(),
        "outcome": r.outcome.map(|o| o.as_str()),
        "reason": r.reason,
        "principal": r.principal,
        // Who admitted it (a gate answer's is who answered); `null`: not recorded.
        "actor": r.principal,
        "epoch": r.claim.as_ref().map(|cl| cl.epoch.0).unwrap_or(r.epoch_mark.0),
        "admitted_at_ms": r.admitted_at_ms,
        "apply_deadline_ms": r.apply_deadline_ms,
        "settled_at_ms": r.settled_at_ms,
    })
}

fn gate_view(g: &GateRecord) -> Value {
    json!({
        "tenant_id": g.tenant.as_str(),
        "session_id": g.session.as_str(),
        "gate_id": g.gate.as_str(),
        "kind": g.kind,
        "prompt": g.prompt_summary,
        "state": g.state.as_str(),
        "opened_at_ms": g.opened_at_ms,
        "deadline_ms": g.deadline_ms,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalQuery {
    /// Journal sequence to read after (`next_after` of the previous reply).
    after: Option<u64>,
}

pub async fn session(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((t, s)): Path<(String, String)>,
    Query(q): Query<JournalQuery>,
) -> ApiResult {
    operator(&c, &headers)?;
    let (t, s) = (tenant(&c, &t)?, session_id(&s)?);
    let store = c.service.store();
    let record = store.session(&t, &s).await?;
    let row = session_row(&c, &record, store.now_ms().await?).await?;
    let commands: Vec<CommandRecord> = store.newest_commands(&t, &s, MAX_PAGE).await?;
    let gates = store.gates(&t, &s, true).await?;
    let mut journal = hostlink::public_journal::PublicJournal::new(
        store.clone(),
        t.clone(),
        s.clone(),
        record.binding.clone(),
    );
    let page = journal
        .page(q.after.unwrap_or(0), None, MAX_PAGE)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    let events: Vec<Value> = page
        .events
        .iter()
        .map(|e| {
            let body: Value = serde_json::from_slice(&e.body).unwrap_or(Value::Null);
            json!({"seq": e.seq, "event_id": e.event_id, "body": body})
        })
        .collect();
    ok(json!({
        "session": row,
        "commands": commands.iter().map(command_view).collect::<Vec<_>>(),
        "gates": gates.iter().map(gate_view).collect::<Vec<_>>(),
        "journal": {"events": events, "next_after": page.next_after, "tip": page.tip},
    }))
}

// ------------------------------------------------------------------------ gates

/// A page of the open gates of the listed tenants (or one tenant's, with `tenant`), oldest
/// first: the longest wait first. `after` is the `next` of the previous page (a JSON array of
/// tenant, session and gate ids: any of them may hold a `/`).
pub async fn gates(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Page>,
) -> ApiResult {
    operator(&c, &headers)?;
    let limit = page_limit(q.limit)?;
    let tenants = listed_tenants(&c, q.tenant.as_deref())?;
    let after = q.after.as_deref().map(gate_cursor).transpose()?;
    let page = c
        .service
        .store()
        .open_gates_page(&tenants, after.as_ref(), limit)
        .await?;
    let next = page
        .next
        .map(|n| json!([n.tenant.as_str(), n.session.as_str(), n.gate.as_str()]).to_string());
    ok(json!({"gates": page.gates.iter().map(gate_view).collect::<Vec<_>>(), "next": next}))
}

/// A gates page's cursor: `["<tenant>","<session>","<gate>"]`.
fn gate_cursor(text: &str) -> Result<GateCursor, ApiError> {
    let bad = || ApiError::invalid("after is the `next` of a gates page");
    let [t, s, g]: [String; 3] = serde_json::from_str(text).map_err(|_| bad())?;
    Ok(GateCursor {
        tenant: TenantId::new(t).map_err(|e| ApiError::invalid(e.to_string()))?,
        session: session_id(&s)?,
        gate: GateId::new(g).map_err(|e| ApiError::invalid(e.to_string()))?,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateAnswerBody {
    action: String,
    text: Option<String>,
}

/// Answers a gate through the command path: a `gate_response` command admitted with the
/// operator as its principal, which the session's Host applies exactly once.
pub async fn answer_gate(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((t, s, g)): Path<(String, String, String)>,
    Json(body): Json<GateAnswerBody>,
) -> ApiResult {
    let op = operate(&c, &headers)?;
    let (t, s) = (tenant(&c, &t)?, session_id(&s)?);
    let gate = uuid::Uuid::parse_str(&g).map_err(|_| ApiError::invalid("a gate id is a UUID"))?;
    let store = c.service.store();
    let open = store
        .gates(&t, &s, true)
        .await?
        .into_iter()
        .find(|r| r.gate.as_str() == gate.to_string())
        .ok_or_else(|| ApiError::not_found(format!("no open gate {gate} on {t}/{s}")))?;
    let command = CommandId::new(format!("console-{}", uuid::Uuid::now_v7()))
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let answer = CommandBodyV1::GateResponse(GateAnswer {
        gate_id: gate,
        action: body.action,
        text: body.text,
        expected_gate_seq: Some(open.opened_seq),
    });
    let rec = store
        .admit(NewCommand {
            tenant: t.clone(),
            session: s.clone(),
            command,
            kind: CommandKind::GateResponse,
            body: CommandBody::Inline(encode_command_body(&answer)),
            principal: Some(op.principal()),
            metadata: None,
            apply_within: ANSWER_APPLY_WITHIN,
            trace: None,
        })
        .await?;
    // A wake-up for the consumer when the session is resident here; elsewhere its Host's own
    // notifications (or the fleet's placement) pick it up.
    let delivered = c.service.deliver(&t, &s).is_ok();
    tracing::info!(tenant = %t, session = %s, command = %rec.command, operator = %op.name, "a gate was answered from the console");
    ok(json!({
        "command_id": rec.command.as_str(),
        "state": rec.state.as_str(),
        "delivered_here": delivered,
    }))
}

// ------------------------------------------------------------------------ runs

/// A page of the listed tenants' runs (or one tenant's, with `tenant`), newest first; `after`
/// is the `next` of the previous page (a run id).
pub async fn runs(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Page>,
) -> ApiResult {
    operator(&c, &headers)?;
    let limit = page_limit(q.limit)?;
    let tenants = listed_tenants(&c, q.tenant.as_deref())?;
    let after = q.after.as_deref().map(run_id).transpose()?;
    let page = c
        .service
        .store()
        .runs_page(&tenants, after.as_ref(), limit, RunOrder::NewestFirst)
        .await?;
    let rows: Vec<Value> = page
        .runs
        .iter()
        .map(|r| {
            json!({
                "tenant_id": r.tenant.as_str(),
                "run_id": r.run_id.as_str(),
                "state": r.state.as_str(),
                "step": r.step,
                "epoch": r.epoch,
                "failure": r.failure.as_ref().map(|f| json!({"code": f.code, "step": f.step, "message": f.message})),
                "created_at_ms": r.created_at_ms,
                "updated_at_ms": r.updated_at_ms,
            })
        })
        .collect();
    ok(json!({"runs": rows, "next": page.next.map(|r| r.to_string())}))
}

fn run_id(r: &str) -> Result<RunId, ApiError> {
    RunId::new(r).map_err(|e| ApiError::invalid(e.to_string()))
}

fn run_refusal(e: hostlink::runs::RunRefusal) -> ApiError {
    let status = match e.code.as_str() {
        "not_found" => StatusCode::NOT_FOUND,
        "state" | "conflict" => StatusCode::CONFLICT,
        "unavailable" | "resource_exhausted" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    };
    use hostlink::runs::refusal_codes as rc;
    let code = [
        rc::NOT_FOUND,
        rc::CONFLICT,
        rc::UNAVAILABLE,
        rc::RESOURCE_EXHAUSTED,
        rc::INVALID,
        rc::STATE,
        rc::NOT_ADMITTING,
        rc::PROGRAM_MISSING,
    ]
    .into_iter()
    .find(|c| *c == e.code)
    .unwrap_or(rc::INVALID);
    ApiError::new(status, code, e.message)
}

fn no_runs() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "runs_not_hosted",
        "this Host does not host workflow runs",
    )
}

pub async fn run(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((t, r)): Path<(String, String)>,
) -> ApiResult {
    operator(&c, &headers)?;
    let (t, r) = (tenant(&c, &t)?, run_id(&r)?);
    let runs = c.runs.as_ref().ok_or_else(no_runs)?;
    let mut view = serde_json::to_value(runs.status(&t, &r).await.map_err(run_refusal)?)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    // The attempt id inside the holder is the runtime's: show the Host only.
    if let Some(h) = view.get("holder").and_then(Value::as_str) {
        let host = h.split('/').next().unwrap_or_default().to_owned();
        view["holder"] = json!(host);
    }
    ok(json!({"tenant_id": t.as_str(), "run": view}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAnswerBody {
    checkpoint: String,
    value: Value,
}

/// Answers a run's checkpoint (or its attention point: `{"action":"retry"}` or
/// `{"action":"skip","output":…}`) as the operator.
pub async fn answer_run(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((t, r)): Path<(String, String)>,
    Json(body): Json<RunAnswerBody>,
) -> ApiResult {
    let op = operate(&c, &headers)?;
    let (t, r) = (tenant(&c, &t)?, run_id(&r)?);
    let runs = c.runs.as_ref().ok_or_else(no_runs)?;
    let value = serde_json::value::to_raw_value(&body.value)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let answered = runs
        .answer_as(
            &t,
            hostlink::runs::RunAnswerRequest {
                version: hostlink::records::V1,
                run_id: r,
                checkpoint: body.checkpoint,
                value,
                traceparent: None,
                tracestate: None,
            },
            &op.principal(),
        )
        .await
        .map_err(run_refusal)?;
    ok(serde_json::to_value(answered)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?)
}

// ------------------------------------------------------------------------ drain, metrics

/// Drains this Host (what SIGTERM does, without ending the process): sessions are given back
/// and the fleet places them elsewhere. Answers the drain's report.
pub async fn drain(State(c): State<Console>, headers: HeaderMap) -> ApiResult {
    let op = operate(&c, &headers)?;
    tracing::warn!(operator = %op.name, "a drain was started from the console");
    let by = op.principal();
    let (report, request) = tokio::join!(c.service.drain(), c.service.record_drain_request(&by));
    let key = |k: &host::SessionKey| format!("{}/{}", k.tenant, k.session);
    ok(json!({
        "host_id": c.service.config().host_id.as_str(),
        "generation": report.generation,
        "state": report.state.as_str(),
        // The request that stands for this incarnation (the first one made), when recorded.
        "requested_by": request.map(|r| r.requested_by),
        "released": report.released.iter().map(key).collect::<Vec<_>>(),
        "abandoned": report.abandoned.iter().map(key).collect::<Vec<_>>(),
        "parked": report.parked.iter().map(key).collect::<Vec<_>>(),
        "failures": report.failures.iter().map(|f| json!({
            "session": f.session.as_ref().map(key),
            "step": f.step,
            "reason": f.reason,
        })).collect::<Vec<_>>(),
    }))
}

/// The numbers the charts draw, read from the Host's own metrics.
pub(crate) fn sample(c: &Console) -> Value {
    let text = c.service.metrics().render();
    let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or(name_labels);
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let key = match name {
            "host_command_apply_seconds_count" => "applied_total",
            "host_command_apply_seconds_sum" => "apply_seconds_sum",
            "host_attach_seconds_count" => "attached_total",
            "host_attach_seconds_sum" => "attach_seconds_sum",
            "host_sessions" if name_labels.contains("state=\"resident\"") => "resident",
            "host_sessions_gate_waiting" => "gate_waiting",
            "host_sessions_command_blocked" => "command_blocked",
            _ => continue,
        };
        *sums.entry(key).or_default() += v;
    }
    json!({
        "at_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        "values": sums,
    })
}

pub async fn metrics(State(c): State<Console>, headers: HeaderMap) -> ApiResult {
    operator(&c, &headers)?;
    ok(sample(&c))
}
