//! Workflow programs: the YAML form, read with the shared strict YAML reader and validated completely
//! before anything is recorded. Every problem is reported (not the first), each with a stable
//! code, the step it belongs to and its line and column; no problem carries source text, so a
//! refusal's size does not grow with the program.
//!
//! ```yaml
//! steps:
//!   - name: count                 # unique, 1-64 of [a-z0-9_-]
//!     invoke: word-count@1.0.0    # exactly one runnable release
//!     input: {text: "${input.text}"}
//!     supervise: {restarts: 2, window: 10m}
//!   - name: approve
//!     ask: "Publish ${steps.count.words} words?"
//!     answer: {type: boolean}     # the bounded schema profile of runnables
//!   - name: pause
//!     sleep: 30s                  # a duration; 0s passes straight through
//!   - name: summary
//!     agent: echo
//!     prompt: "Summarise ${steps.count}"
//! ```
//!
//! A template is any YAML value; inside its strings `${input…}` reads the run's input and
//! `${steps.<earlier step>…}` an earlier step's output. A string that is exactly one reference
//! takes the referenced value as it is; elsewhere the value is spliced in as text.
//!
//! This module must never resolve anything itself: which runnables and agents exist is asked
//! of the [`Environment`] it is given.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value};

use runnable::{Effect, Schema};
use strict_yaml::read::{self, ProblemKind, Report};
use strict_yaml::{Node, NodeKind, Resolved};

/// The stable codes of program problems.
pub mod codes {
    /// Not YAML, a duplicate key, an unsupported tag.
    pub const SYNTAX: &str = "program.syntax";
    /// A key the format does not have, at any level.
    pub const UNKNOWN_KEY: &str = "program.unknown_key";
    /// A required key is absent (`steps`, a step's `name`, `answer`, `prompt`).
    pub const MISSING_KEY: &str = "program.missing_key";
    /// A value of the wrong YAML type.
    pub const WRONG_TYPE: &str = "program.wrong_type";
    /// A program without steps.
    pub const NO_STEPS: &str = "program.no_steps";
    /// A step name that breaks the name rule.
    pub const STEP_NAME: &str = "program.step_name";
    /// Two steps with one name.
    pub const DUPLICATE_STEP: &str = "program.duplicate_step";
    /// A step with none, or more than one, of invoke, ask, sleep, agent.
    pub const STEP_KIND: &str = "program.step_kind";
    /// `invoke` names no runnable release.
    pub const UNKNOWN_RUNNABLE: &str = "program.unknown_runnable";
    /// `invoke` names more than one release (candidates listed).
    pub const AMBIGUOUS_RUNNABLE: &str = "program.ambiguous_runnable";
    /// A template reference that is malformed or reads a later, unknown or the same step.
    pub const TEMPLATE: &str = "program.template";
    /// An answer schema outside the bounded profile, or a question that is not text.
    pub const ANSWER_SCHEMA: &str = "program.answer_schema";
    /// A sleep or window that is not a non-negative duration.
    pub const DURATION: &str = "program.duration";
    /// `agent` names an agent this Host cannot launch.
    pub const UNKNOWN_AGENT: &str = "program.unknown_agent";
    /// A `supervise` policy that does not parse.
    pub const SUPERVISE: &str = "program.supervise";
    /// A `supervise` policy on a step kind where a re-run means nothing (ask, sleep).
    pub const SUPERVISE_UNSUPPORTED: &str = "program.supervise_unsupported";
}

/// The most steps one program may have.
pub const MAX_STEPS: usize = 256;
/// The longest sleep.
pub const MAX_SLEEP: Duration = Duration::from_secs(366 * 24 * 3600);

/// One problem of a program.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    /// A stable code from [`codes`].
    pub code: String,
    pub message: String,
    /// The step it belongs to, when it belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// 1-based; 0 for the document as a whole.
    pub line: usize,
    pub column: usize,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: [{}] ", self.line, self.column, self.code)?;
        if let Some(s) = &self.step {
            write!(f, "step `{s}`: ")?;
        }
        f.write_str(&self.message)
    }
}

/// What the environment says about a runnable reference.
#[derive(Debug, Clone)]
pub struct RunnableInfo {
    /// `workspace/name@version`.
    pub identity: String,
    pub digest: String,
    pub effect: Effect,
    pub input: Schema,
}

/// Why a runnable reference did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    NotFound {
        available: Vec<String>,
    },
    Ambiguous {
        candidates: Vec<String>,
    },
    /// The reference is malformed or the catalog cannot be read.
    Other(String),
}

/// What a program may name: the runnables and agents of the Host (or CLI) validating it.
pub trait Environment: Send + Sync {
    fn runnable(&self, reference: &str) -> Result<RunnableInfo, Unresolved>;
    fn agent_known(&self, agent: &str) -> bool;
}

/// A step's restart budget: at most `restarts` re-runs, counted over the trailing `window`
/// (the step's whole life without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supervise {
    pub restarts: u32,
    pub window: Option<Duration>,
}

/// What a step does.
#[derive(Debug, Clone)]
pub enum StepKind {
    Invoke {
        reference: String,
        runnable: RunnableInfo,
        input: Value,
    },
    Ask {
        question: String,
        schema: Schema,
    },
    Sleep {
        duration: Duration,
    },
    Agent {
        agent: String,
        prompt: String,
    },
}

impl StepKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepKind::Invoke { .. } => "invoke",
            StepKind::Ask { .. } => "ask",
            StepKind::Sleep { .. } => "sleep",
            StepKind::Agent { .. } => "agent",
        }
    }
}

/// One validated step.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
    pub supervise: Option<Supervise>,
    pub line: usize,
}

/// A validated program.
#[derive(Debug, Clone)]
pub struct Program {
    pub steps: Vec<Step>,
}

const TOP_KEYS: &[&str] = &["steps", "description"];
const KINDS: &[&str] = &["invoke", "ask", "sleep", "agent"];
const STEP_KEYS: &[&str] = &[
    "name",
    "invoke",
    "input",
    "ask",
    "answer",
    "sleep",
    "agent",
    "prompt",
    "supervise",
];

struct Problems {
    list: Vec<Problem>,
    step: Option<String>,
}

impl Problems {
    fn at(&mut self, node: &Node, code: &str, message: impl Into<String>) {
        self.push(node.line, node.column, code, message.into());
    }

    fn push(&mut self, line: usize, column: usize, code: &str, message: String) {
        self.list.push(Problem {
            code: code.to_owned(),
            message,
            step: self.step.clone(),
            line,
            column,
        });
    }

    /// The problems of an answer schema, each under [`codes::ANSWER_SCHEMA`] naming its key.
    fn answer_schema(&mut self, problems: Vec<read::Problem>) {
        for problem in problems {
            let message = format!("`{}`: {}", problem.path, problem.message());
            self.push(problem.line, problem.column, codes::ANSWER_SCHEMA, message);
        }
    }
}

/// The reader's problems, under the program's codes and in its words.
impl Report for Problems {
    fn report(&mut self, problem: read::Problem) {
        let code = match &problem.kind {
            ProblemKind::WrongType { .. } => codes::WRONG_TYPE,
            ProblemKind::UnknownKey { .. } => codes::UNKNOWN_KEY,
            ProblemKind::MissingKey { .. } => codes::MISSING_KEY,
            ProblemKind::Duration { .. } => codes::DURATION,
            ProblemKind::Format { code, .. } => code,
        };
        self.push(problem.line, problem.column, code, problem.message());
    }
}

/// Checks a step name: 1-64 of lowercase letters, digits, `-` and `_`.
pub fn check_step_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "step name {name:?} must be 1-64 of lowercase letters, digits, `-` and `_`"
        ));
    }
    Ok(())
}

/// Reads a non-negative duration (`0s`, `250ms`, `10m`); every problem is filed under
/// [`codes::DURATION`].
fn parse_duration(node: &Node) -> Result<Duration, read::Problem> {
    let text = match &node.kind {
        NodeKind::Scalar(s) if matches!(s.resolved, Resolved::Str | Resolved::Int(_)) => {
            s.text.trim()
        }
        _ => {
            return Err(read::Problem::wrong_type(
                node,
                "",
                "a duration must be text like `30s`, not {found}",
            )
            .under(codes::DURATION));
        }
    };
    let refuse = |message: String| read::Problem::format(node, "", codes::DURATION, message);
    let d = read::duration(node, "", text).map_err(|_| {
        refuse(format!(
            "{text:?} is not a duration like `30s`, `250ms` or `10m`"
        ))
    })?;
    if d > MAX_SLEEP {
        return Err(refuse(format!("{text:?} is longer than a year")));
    }
    Ok(d)
}

/// A reference inside a template: where it reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Input,
    Step(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    pub source: Source,
    pub path: Vec<String>,
}

pub(crate) fn parse_reference(text: &str) -> Result<Reference, String> {
    let parts: Vec<&str> = text.trim().split('.').collect();
    let bad = |why: &str| {
        format!("`${{{text}}}` {why}; write `${{input.<key>}}` or `${{steps.<step>.<key>}}`")
    };
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("has an empty part"));
    }
    match parts.as_slice() {
        ["input", rest @ ..] => Ok(Reference {
            source: Source::Input,
            path: rest.iter().map(|s| (*s).to_owned()).collect(),
        }),
        ["steps", step, rest @ ..] => Ok(Reference {
            source: Source::Step((*step).to_owned()),
            path: rest.iter().map(|s| (*s).to_owned()).collect(),
        }),
        _ => Err(bad("reads neither the input nor a step")),
    }
}

/// The pieces of a template string: literal text and references, in order.
pub(crate) enum Piece<'a> {
    Text(&'a str),
    Ref(&'a str),
}

pub(crate) fn pieces(s: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        if at > 0 {
            out.push(Piece::Text(&rest[..at]));
        }
        let after = &rest[at + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("an unclosed `${{` in {s:?}"))?;
        out.push(Piece::Ref(&after[..end]));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

/// Converts a YAML node into JSON (scalars by their core-schema type).
fn to_json(node: &Node) -> Value {
    match &node.kind {
        NodeKind::Scalar(s) => match s.resolved {
            Resolved::Null => Value::Null,
            Resolved::Bool(b) => Value::Bool(b),
            Resolved::Int(i) => Value::from(i),
            Resolved::Float(f) => serde_json::Number::from_f64(f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Resolved::Str => Value::String(s.text.clone()),
        },
        NodeKind::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        NodeKind::Mapping(entries) => {
            let mut m = Map::new();
            for (k, v) in entries {
                m.insert(k.key_text().to_owned(), to_json(v));
            }
            Value::Object(m)
        }
    }
}

/// Checks every reference in a template node against the steps before this one.
fn check_template(node: &Node, earlier: &[String], own: &str, p: &mut Problems) {
    match &node.kind {
        NodeKind::Scalar(s) if s.resolved == Resolved::Str => match pieces(&s.text) {
            Err(e) => p.at(node, codes::TEMPLATE, e),
            Ok(list) => {
                for piece in list {
                    let Piece::Ref(r) = piece else { continue };
                    match parse_reference(r) {
                        Err(e) => p.at(node, codes::TEMPLATE, e),
                        Ok(Reference {
                            source: Source::Step(step),
                            ..
                        }) => {
                            if step == own {
                                p.at(
                                    node,
                                    codes::TEMPLATE,
                                    format!("`${{{r}}}` reads the step's own output"),
                                );
                            } else if !earlier.contains(&step) {
                                p.at(
                                    node,
                                    codes::TEMPLATE,
                                    format!("`${{{r}}}` reads step `{step}`, which does not run before this one"),
                                );
                            }
                        }
                        Ok(_) => {}
                    }
                }
            }
        },
        NodeKind::Scalar(_) => {}
        NodeKind::Sequence(items) => {
            for i in items {
                check_template(i, earlier, own, p);
            }
        }
        NodeKind::Mapping(entries) => {
            for (_, v) in entries {
                check_template(v, earlier, own, p);
            }
        }
    }
}

fn parse_supervise(node: &Node, p: &mut Problems) -> Option<Supervise> {
    let policy = p.keep(
        read::mapping(
            node,
            "",
            "`supervise` must be a mapping like `{restarts: 2, window: 10m}`, not {found}",
        )
        .map_err(|e| e.under(codes::SUPERVISE)),
    )?;
    let mut ok = true;
    let mut restarts = None;
    let mut window = None;
    for (k, v) in policy.entries() {
        let result = match k.key_text() {
            "restarts" => read::integer(
                v,
                "",
                0..=1000,
                "`restarts` must be an integer from 0 to 1000, not {found}",
            )
            .map(|n| {
                restarts = u32::try_from(n).ok();
            }),
            "window" => parse_duration(v).and_then(|d| {
                if d.is_zero() {
                    Err(read::Problem::format(
                        v,
                        "",
                        codes::SUPERVISE,
                        "`window` must be a positive duration",
                    ))
                } else {
                    window = Some(d);
                    Ok(())
                }
            }),
            other => Err(read::Problem::format(
                k,
                "",
                codes::SUPERVISE,
                format!("`supervise` has no key `{other}` (it takes `restarts` and `window`)"),
            )),
        };
        ok &= p
            .keep(result.map_err(|e| e.under(codes::SUPERVISE)))
            .is_some();
    }
    let Some(restarts) = restarts else {
        if ok {
            p.at(node, codes::SUPERVISE, "`supervise` needs `restarts`");
        }
        return None;
    };
    ok.then_some(Supervise { restarts, window })
}

/// Reads and validates a program, reporting every problem.
pub fn parse(source: &str, env: &dyn Environment) -> Result<Program, Vec<Problem>> {
    let mut p = Problems {
        list: Vec::new(),
        step: None,
    };
    let root = match strict_yaml::load(source) {
        Ok(n) => n,
        Err(e) => {
            return Err(vec![Problem {
                code: codes::SYNTAX.into(),
                message: e.message,
                step: None,
                line: e.line,
                column: e.column,
            }]);
        }
    };
    let Some(top) = p.keep(read::mapping(
        &root,
        "",
        "a program must be a mapping with `steps`, not {found}",
    )) else {
        return Err(p.list);
    };
    for (k, key) in top.unknown_keys(TOP_KEYS) {
        p.at(
            k,
            codes::UNKNOWN_KEY,
            format!("a program has no key `{key}` (it takes `steps` and `description`)"),
        );
    }
    if let Some(d) = top.get("description") {
        p.keep(read::string(d, "description", "`description` must be text"));
    }
    let Some(steps) = top.get("steps") else {
        p.at(&root, codes::MISSING_KEY, "a program needs `steps`");
        return Err(p.list);
    };
    let items = match p.keep(read::sequence(
        steps,
        "steps",
        "`steps` must be a list, not {found}",
    )) {
        Some([]) => {
            p.at(steps, codes::NO_STEPS, "a program needs at least one step");
            return Err(p.list);
        }
        Some(items) if items.len() > MAX_STEPS => {
            p.at(
                steps,
                codes::NO_STEPS,
                format!("a program has at most {MAX_STEPS} steps"),
            );
            return Err(p.list);
        }
        Some(items) => items,
        None => return Err(p.list),
    };
    let mut names: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    let mut steps = Vec::new();
    for item in items {
        p.step = None;
        let Some(step) = p.keep(read::mapping(
            item,
            "",
            "a step must be a mapping, not {found}",
        )) else {
            continue;
        };
        let name = match step.get("name") {
            None => {
                p.at(item, codes::MISSING_KEY, "a step needs a `name`");
                None
            }
            Some(n) => match p.keep(read::string(
                n,
                "name",
                "a step's `name` must be text, not {found}",
            )) {
                None => None,
                Some(text) => match check_step_name(text) {
                    Err(e) => {
                        p.at(n, codes::STEP_NAME, e);
                        None
                    }
                    Ok(()) if !seen.insert(text.to_owned()) => {
                        p.step = Some(text.to_owned());
                        p.at(
                            n,
                            codes::DUPLICATE_STEP,
                            format!("another step is already named `{text}`"),
                        );
                        None
                    }
                    Ok(()) => Some(text.to_owned()),
                },
            },
        };
        p.step = name.clone();
        for (k, key) in step.unknown_keys(STEP_KEYS) {
            p.at(k, codes::UNKNOWN_KEY, format!("a step has no key `{key}`"));
        }
        let kinds: Vec<&str> = KINDS
            .iter()
            .copied()
            .filter(|k| item.get(k).is_some())
            .collect();
        let own = name.clone().unwrap_or_default();
        let kind = match kinds.as_slice() {
            [one] => step_kind(item, one, &names, &own, env, &mut p),
            [] => {
                p.at(
                    item,
                    codes::STEP_KIND,
                    "a step needs exactly one of `invoke`, `ask`, `sleep`, `agent`",
                );
                None
            }
            many => {
                p.at(item, codes::STEP_KIND, format!("a step takes exactly one of `invoke`, `ask`, `sleep`, `agent`; this one has {}", many.join(", ")));
                None
            }
        };
        let misplaced: &[(&str, &str)] =
            &[("input", "invoke"), ("answer", "ask"), ("prompt", "agent")];
        for (key, owner) in misplaced {
            if let Some(n) = item.get(key)
                && !kinds.contains(owner)
            {
                p.at(
                    n,
                    codes::UNKNOWN_KEY,
                    format!("`{key}` belongs to `{owner}` steps"),
                );
            }
        }
        let supervise = match item.get("supervise") {
            None => None,
            Some(s) => {
                let parsed = parse_supervise(s, &mut p);
                if kinds.iter().any(|k| *k == "ask" || *k == "sleep") {
                    p.at(s, codes::SUPERVISE_UNSUPPORTED, "`supervise` applies to `invoke` and `agent` steps only (an ask or a sleep has nothing to re-run)");
                }
                parsed
            }
        };
        if let (Some(name), Some(kind)) = (name.clone(), kind) {
            steps.push(Step {
                name,
                kind,
                supervise,
                line: item.line,
            });
        }
        if let Some(n) = name {
            names.push(n);
        }
    }
    if p.list.is_empty() {
        Ok(Program { steps })
    } else {
        Err(p.list)
    }
}

fn step_kind(
    item: &Node,
    kind: &str,
    earlier: &[String],
    own: &str,
    env: &dyn Environment,
    p: &mut Problems,
) -> Option<StepKind> {
    let node = item.get(kind)?;
    match kind {
        "invoke" => {
            let input = item.get("input");
            if let Some(i) = input {
                check_template(i, earlier, own, p);
            }
            let reference = p.keep(read::string(
                node,
                "invoke",
                "`invoke` names a runnable, not {found}",
            ))?;
            match env.runnable(reference) {
                Ok(runnable) => Some(StepKind::Invoke {
                    reference: reference.to_owned(),
                    runnable,
                    input: input.map(to_json).unwrap_or(Value::Object(Map::new())),
                }),
                Err(Unresolved::NotFound { available }) => {
                    let hint = if available.is_empty() {
                        String::new()
                    } else {
                        format!(" (releases of that name: {})", available.join(", "))
                    };
                    p.at(
                        node,
                        codes::UNKNOWN_RUNNABLE,
                        format!("no runnable release matches `{reference}`{hint}"),
                    );
                    None
                }
                Err(Unresolved::Ambiguous { candidates }) => {
                    p.at(
                        node,
                        codes::AMBIGUOUS_RUNNABLE,
                        format!(
                            "`{reference}` matches several releases; name one: {}",
                            candidates.join(", ")
                        ),
                    );
                    None
                }
                Err(Unresolved::Other(why)) => {
                    p.at(
                        node,
                        codes::UNKNOWN_RUNNABLE,
                        format!("`{reference}` cannot be resolved: {why}"),
                    );
                    None
                }
            }
        }
        "ask" => {
            let question = p.keep(
                read::string(node, "ask", "`ask` is the question, as text, not {found}")
                    .map_err(|e| e.under(codes::ANSWER_SCHEMA)),
            );
            if question.is_some() {
                check_template(node, earlier, own, p);
            }
            let Some(answer) = item.get("answer") else {
                p.at(
                    item,
                    codes::MISSING_KEY,
                    "an `ask` step needs an `answer` schema",
                );
                return None;
            };
            let schema = Schema::read(answer, "answer")
                .map_err(|problems| p.answer_schema(problems))
                .ok();
            Some(StepKind::Ask {
                question: question?.to_owned(),
                schema: schema?,
            })
        }
        "sleep" => p
            .keep(parse_duration(node))
            .map(|duration| StepKind::Sleep { duration }),
        "agent" => {
            let prompt = match item.get("prompt") {
                None => {
                    p.at(item, codes::MISSING_KEY, "an `agent` step needs a `prompt`");
                    None
                }
                Some(pr) => {
                    let text = p.keep(read::string(
                        pr,
                        "prompt",
                        "`prompt` must be text, not {found}",
                    ));
                    if text.is_some() {
                        check_template(pr, earlier, own, p);
                    }
                    text.map(str::to_owned)
                }
            };
            let agent = p.keep(read::string(
                node,
                "agent",
                "`agent` names an agent, not {found}",
            ))?;
            if !env.agent_known(agent) {
                p.at(
                    node,
                    codes::UNKNOWN_AGENT,
                    format!("this Host cannot launch an agent named `{agent}`"),
                );
                return None;
            }
            Some(StepKind::Agent {
                agent: agent.to_owned(),
                prompt: prompt?,
            })
        }
        _ => None,
    }
}

/// Why a template could not be rendered at run time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template: {0}")]
pub struct RenderError(pub String);

fn lookup<'a>(
    r: &Reference,
    input: &'a Value,
    outputs: &'a std::collections::HashMap<String, Value>,
) -> Result<&'a Value, RenderError> {
    let mut at = match &r.source {
        Source::Input => input,
        Source::Step(s) => outputs
            .get(s)
            .ok_or_else(|| RenderError(format!("step `{s}` has no output")))?,
    };
    for key in &r.path {
        at = match at {
            Value::Object(m) => m.get(key),
            Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        }
        .ok_or_else(|| RenderError(format!("no `{key}` in the value read by the template")))?;
    }
    Ok(at)
}

/// Renders a template over the run's input and the outputs of earlier steps.
pub fn render(
    template: &Value,
    input: &Value,
    outputs: &std::collections::HashMap<String, Value>,
) -> Result<Value, RenderError> {
    Ok(match template {
        Value::String(s) => {
            let list = pieces(s).map_err(RenderError)?;
            if let [Piece::Ref(r)] = list.as_slice() {
                let reference = parse_reference(r).map_err(RenderError)?;
                lookup(&reference, input, outputs)?.clone()
            } else {
                let mut out = String::new();
                for piece in list {
                    match piece {
                        Piece::Text(t) => out.push_str(t),
                        Piece::Ref(r) => {
                            let reference = parse_reference(r).map_err(RenderError)?;
                            match lookup(&reference, input, outputs)? {
                                Value::String(v) => out.push_str(v),
                                other => out.push_str(&other.to_string()),
                            }
                        }
                    }
                }
                Value::String(out)
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| render(i, input, outputs))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                out.insert(k.clone(), render(v, input, outputs)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// Every `invoke` step of `source` in order, as (step name, reference), read syntactically
/// (for naming the step a pinned release belongs to; the program validated when recorded).
pub fn invoke_references(source: &str) -> Vec<(String, String)> {
    let Ok(root) = strict_yaml::load(source) else {
        return Vec::new();
    };
    let Some(items) = root.get("steps").and_then(Node::items) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|i| {
            let name = i.get("name").and_then(Node::as_str)?;
            let reference = i.get("invoke").and_then(Node::as_str)?;
            Some((name.to_owned(), reference.to_owned()))
        })
        .collect()
}

/// The answer schema of ask step `step` in `source` (which validated when it was recorded).
pub fn answer_schema(source: &str, step: &str) -> Option<Schema> {
    let root = strict_yaml::load(source).ok()?;
    let item = root
        .get("steps")?
        .items()?
        .iter()
        .find(|i| i.get("name").and_then(Node::as_str) == Some(step))?;
    Schema::read(item.get("answer")?, "answer").ok()
}

/// Reads a schema of the bounded profile from YAML text (for environments and tests that
/// declare runnables without a workspace).
pub fn schema_from_yaml(text: &str) -> Result<Schema, Vec<Problem>> {
    let node = strict_yaml::load(text).map_err(|e| {
        vec![Problem {
            code: codes::SYNTAX.into(),
            message: e.message,
            step: None,
            line: e.line,
            column: e.column,
        }]
    })?;
    Schema::read(&node, "").map_err(|problems| {
        problems
            .into_iter()
            .map(|p| Problem {
                code: codes::ANSWER_SCHEMA.into(),
                message: p.message(),
                step: None,
                line: p.line,
                column: p.column,
            })
            .collect()
    })
}
