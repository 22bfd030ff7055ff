//! `runnable.yaml`: reading one declaration strictly, with every problem of the file reported
//! at once (line, column, key path and a stable code).
//!
//! The members: `name`, `version`, `input`, `output`, `command`, `timeout` and `effect` are
//! required; `description`, `args`, `env` and `dependencies` are optional. An unknown key at
//! any depth is refused. A null where a list or mapping belongs is refused (`[]` or `{}` says
//! "none"). `name` and `version` are taken as the exact text written (`version: 1.10` is
//! `1.10`). This module reads one file's bytes; it must never look at other declarations,
//! the package or the flow.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::error::{DeclarationProblem, codes};
use crate::identity::{Identity, check_part};
use crate::schema::Schema;
use flow::engine::env_key;
use strict_yaml::Node;
use strict_yaml::read::{self, Map, Problem, Report};
use wire_enum::wire_enum;

/// The file name of a declaration inside a runnable's folder.
pub const DECLARATION_FILE: &str = "runnable.yaml";
/// The longest timeout a declaration may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

const TOP_KEYS: &[&str] = &[
    "name",
    "version",
    "description",
    "input",
    "output",
    "command",
    "args",
    "env",
    "timeout",
    "effect",
    "dependencies",
];
const REQUIRED_KEYS: &[&str] = &[
    "name", "version", "input", "output", "command", "timeout", "effect",
];
const DEPENDENCY_KEYS: &[&str] = &["service", "endpoints"];
/// What `command`, `args` items and `env` values take.
const SCALAR: &str = "must be a string, number or boolean, not {found}";
/// Environment prefixes hostd injects; a declaration may not set them itself.
const RESERVED_ENV_PREFIXES: &[&str] = &["HOSTD_", "FLOW_DEP_"];

wire_enum! {
    /// What running a runnable may do to the world.
    pub enum Effect {
        /// Changes nothing: safe to run again.
        ReadOnly = "read_only",
        /// Changes the world, but running it again with the same `effect_id` changes nothing
        /// more.
        Idempotent = "idempotent",
        /// Changes the world each time it runs.
        Effectful = "effectful",
    }
    kind = "effect";
    serde;
}

impl Effect {
    /// Whether running it again (with the same effect id) is harmless.
    pub fn replay_safe(self) -> bool {
        !matches!(self, Effect::Effectful)
    }
}

/// One declared dependency on a flow service's endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyDecl {
    pub service: String,
    pub endpoints: Vec<String>,
}

impl DependencyDecl {
    /// The environment variable an endpoint's address is injected as: the flows' own naming,
    /// `FLOW_DEP_<SERVICE>_<ENDPOINT>_ADDR`.
    pub fn env_var(service: &str, endpoint: &str) -> String {
        format!("FLOW_DEP_{}_{}_ADDR", env_key(service), env_key(endpoint))
    }
}

/// A loaded declaration.
#[derive(Debug, Clone)]
pub struct Declaration {
    pub identity: Identity,
    pub description: String,
    pub input: Schema,
    pub output: Schema,
    /// A program on `PATH` (no `/`) or a file of the package (relative, with `/`).
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub effect: Effect,
    pub dependencies: Vec<DependencyDecl>,
    /// The declaration file, and the runnable's folder.
    pub file: PathBuf,
    pub folder: PathBuf,
}

impl Declaration {
    /// `command` and `args` as one line, for listings.
    pub fn command_line(&self) -> String {
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Reads the declaration at `file` (inside `folder`), naming the release `workspace`.
    pub fn load(
        workspace: &str,
        folder: &Path,
        file: &Path,
    ) -> Result<Declaration, Vec<DeclarationProblem>> {
        let bytes = std::fs::read(file).map_err(|e| {
            vec![DeclarationProblem {
                file: file.to_path_buf(),
                line: 0,
                column: 0,
                code: codes::UNREADABLE,
                path: String::new(),
                message: format!("cannot read the declaration: {e}"),
            }]
        })?;
        Declaration::parse(workspace, folder, file, &bytes)
    }

    /// Parses declaration bytes; `file` and `folder` are used for messages and path checks.
    pub fn parse(
        workspace: &str,
        folder: &Path,
        file: &Path,
        bytes: &[u8],
    ) -> Result<Declaration, Vec<DeclarationProblem>> {
        let exists = |rel: &str| std::fs::symlink_metadata(folder.join(rel)).is_ok();
        Declaration::parse_with(workspace, folder, file, bytes, &exists)
    }

    /// Parses declaration bytes whose handler files are wherever `exists` (given a path
    /// relative to the runnable's folder) finds them: the folder on disk for [`Self::parse`],
    /// the file list of a package for a packaged declaration.
    pub(crate) fn parse_with(
        workspace: &str,
        folder: &Path,
        file: &Path,
        bytes: &[u8],
        exists: &dyn Fn(&str) -> bool,
    ) -> Result<Declaration, Vec<DeclarationProblem>> {
        let syntax = |line: usize, column: usize, message: String| {
            vec![DeclarationProblem {
                file: file.to_path_buf(),
                line,
                column,
                code: codes::SYNTAX,
                path: String::new(),
                message,
            }]
        };
        let text =
            std::str::from_utf8(bytes).map_err(|e| syntax(0, 0, format!("not UTF-8 text: {e}")))?;
        let doc = strict_yaml::load(text).map_err(|e| syntax(e.line, e.column, e.message))?;
        let mut problems = Vec::new();
        let parsed = parse_document(&doc, workspace, folder, file, exists, &mut problems);
        match parsed {
            Some(d) if problems.is_empty() => Ok(d),
            _ => Err(problems
                .into_iter()
                .map(|p| DeclarationProblem::read(file, p))
                .collect()),
        }
    }
}

fn parse_document(
    doc: &Node,
    workspace: &str,
    folder: &Path,
    file: &Path,
    exists: &dyn Fn(&str) -> bool,
    problems: &mut Vec<Problem>,
) -> Option<Declaration> {
    let top = problems.keep(read::mapping(
        doc,
        "",
        "a declaration is a mapping of keys, not {found}",
    ))?;
    problems.extend(top.unknown(TOP_KEYS));
    problems.extend(top.missing(REQUIRED_KEYS));

    let name = top
        .get("name")
        .and_then(|n| identity_part(n, "name", problems));
    let version = top
        .get("version")
        .and_then(|n| identity_part(n, "version", problems));
    let description = match top.get("description") {
        None => String::new(),
        Some(d) => problems
            .keep(read::string(
                d,
                "description",
                "must be a string, not {found}",
            ))
            .map(str::to_owned)
            .unwrap_or_default(),
    };
    let input = top.get("input").and_then(|n| schema(n, "input", problems));
    let output = top
        .get("output")
        .and_then(|n| schema(n, "output", problems));
    let command = top.get("command").and_then(|c| {
        let text = problems
            .keep(read::text(c, "command", SCALAR))?
            .text
            .clone();
        check_command(c, &text, folder, exists, problems);
        Some(text)
    });
    let args = parse_args(&top, problems);
    let env = parse_env(&top, problems);
    let timeout = top.get("timeout").and_then(|t| parse_timeout(t, problems));
    let effect =
        top.get("effect").and_then(
            |e| match e.as_str().and_then(|s| Effect::from_wire(s).ok()) {
                Some(effect) => Some(effect),
                None => {
                    problems.report(Problem::format(
                    e,
                    "effect",
                    codes::INVALID_VALUE,
                    format!(
                        "{} is not an effect; use exactly one of read_only, idempotent, effectful",
                        e.describe()
                    ),
                ));
                    None
                }
            },
        );
    let dependencies = parse_dependencies(&top, problems);

    Some(Declaration {
        identity: Identity {
            workspace: workspace.to_owned(),
            name: name?,
            version: version?,
        },
        description,
        input: input?,
        output: output?,
        command: command?,
        args,
        env,
        timeout: timeout?,
        effect: effect?,
        dependencies,
        file: file.to_path_buf(),
        folder: folder.to_path_buf(),
    })
}

fn schema(node: &Node, path: &str, problems: &mut Vec<Problem>) -> Option<Schema> {
    Schema::read(node, path)
        .map_err(|list| problems.extend(list))
        .ok()
}

/// `name` or `version`: any non-null scalar, taken as written.
fn identity_part(node: &Node, key: &str, problems: &mut Vec<Problem>) -> Option<String> {
    let text = problems
        .keep(read::text(node, key, "must be a single value, not {found}"))?
        .text
        .clone();
    if let Err(reason) = check_part(&text) {
        problems.report(Problem::format(node, key, codes::INVALID_VALUE, reason));
        return None;
    }
    Some(text)
}

/// Whether `rel` stays inside its base: relative, no `..`, no root.
pub(crate) fn stays_inside(rel: &str) -> bool {
    let p = Path::new(rel);
    !rel.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn check_command(
    node: &Node,
    command: &str,
    folder: &Path,
    exists: &dyn Fn(&str) -> bool,
    problems: &mut Vec<Problem>,
) {
    let mut refuse = |code: &'static str, message: String| {
        problems.report(Problem::format(node, "command", code, message));
    };
    if command.trim().is_empty() {
        refuse(codes::INVALID_VALUE, "is empty".into());
        return;
    }
    if !command.contains('/') {
        return; // a program found on PATH
    }
    if !stays_inside(command) {
        refuse(
            codes::PATH_ESCAPE,
            format!(
                "`{command}` leaves the runnable's folder; a handler path is relative to the folder and may not use `..` or start with `/`"
            ),
        );
        return;
    }
    if !exists(command) {
        refuse(
            codes::INVALID_VALUE,
            format!("`{command}` names no file in {}", folder.display()),
        );
    }
}

fn parse_args(top: &Map, problems: &mut Vec<Problem>) -> Vec<String> {
    let Some(node) = top.get("args") else {
        return Vec::new();
    };
    let Some(items) = problems.keep(read::sequence(
        node,
        "args",
        "must be a list (write `[]` for none), not {found}",
    )) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = read::index("args", i);
        if let Some(scalar) = problems.keep(read::text(item, &path, SCALAR)) {
            let text = scalar.text.clone();
            if text == ".." || text.starts_with("../") {
                problems.report(Problem::format(
                    item,
                    path,
                    codes::PATH_ESCAPE,
                    format!("`{text}` leaves the runnable's folder"),
                ));
            }
            out.push(text);
        }
    }
    out
}

fn valid_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_env(top: &Map, problems: &mut Vec<Problem>) -> Vec<(String, String)> {
    let Some(node) = top.get("env") else {
        return Vec::new();
    };
    let Some(env) = problems.keep(read::mapping(
        node,
        "env",
        "must be a mapping (write `{}` for none), not {found}",
    )) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, value) in env.entries() {
        let name = key.key_text();
        let path = env.path_of(name);
        if !valid_env_name(name) {
            problems.report(Problem::format(
                key,
                path,
                codes::INVALID_VALUE,
                format!("`{name}` is not a valid environment variable name"),
            ));
            continue;
        }
        if let Some(prefix) = RESERVED_ENV_PREFIXES.iter().find(|p| name.starts_with(*p)) {
            problems.report(Problem::format(
                key,
                path,
                codes::INVALID_VALUE,
                format!("names starting with `{prefix}` are set by hostd"),
            ));
            continue;
        }
        if let Some(scalar) = problems.keep(read::text(value, &path, SCALAR)) {
            out.push((name.to_owned(), scalar.text.clone()));
        }
    }
    out
}

fn parse_timeout(node: &Node, problems: &mut Vec<Problem>) -> Option<Duration> {
    let text = problems.keep(read::string(
        node,
        "timeout",
        "must be a duration with a unit, like 30s or 2m, not {found}",
    ))?;
    let duration = problems.keep(read::duration(node, "timeout", text))?;
    let refuse = |message: &str| Problem::format(node, "timeout", codes::INVALID_VALUE, message);
    if duration.is_zero() {
        problems.report(refuse("must be longer than zero"));
        None
    } else if duration > MAX_TIMEOUT {
        problems.report(refuse("may be at most 24h"));
        None
    } else {
        Some(duration)
    }
}

fn parse_dependencies(top: &Map, problems: &mut Vec<Problem>) -> Vec<DependencyDecl> {
    let Some(node) = top.get("dependencies") else {
        return Vec::new();
    };
    let Some(items) = problems.keep(read::sequence(
        node,
        "dependencies",
        "must be a list of {service, endpoints} entries (write `[]` for none), not {found}",
    )) else {
        return Vec::new();
    };
    let mut out: Vec<DependencyDecl> = Vec::new();
    // env variable → (service/endpoint, line) of the first that took it
    let mut taken: Vec<(String, String, usize)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(entry) = problems.keep(read::mapping(
            item,
            &read::index("dependencies", i),
            "must be a mapping with `service` and `endpoints`, not {found}",
        )) else {
            continue;
        };
        problems.extend(entry.unknown(DEPENDENCY_KEYS));
        let service = problems
            .keep(entry.require("service"))
            .and_then(|s| match s.as_str() {
                Some(t) if !t.is_empty() => Some(t.to_owned()),
                _ => {
                    problems.report(Problem::wrong_type(
                        s,
                        entry.path_of("service"),
                        "must be a service name, not {found}",
                    ));
                    None
                }
            });
        let epath = entry.path_of("endpoints");
        let endpoints: Vec<(String, &Node)> = match entry.get("endpoints") {
            None => {
                problems.report(Problem::format(
                    item,
                    &epath,
                    codes::MISSING_KEY,
                    "the required member `endpoints` is missing: name the endpoints the handler calls",
                ));
                Vec::new()
            }
            Some(e) => match e.items() {
                Some(list) if !list.is_empty() => list
                    .iter()
                    .filter_map(|n| match n.as_str() {
                        Some(t) if !t.is_empty() => Some((t.to_owned(), n)),
                        _ => {
                            problems.report(Problem::wrong_type(
                                n,
                                &epath,
                                "must list endpoint names, not {found}",
                            ));
                            None
                        }
                    })
                    .collect(),
                _ => {
                    problems.report(Problem::wrong_type(
                        e,
                        &epath,
                        "must be a non-empty list of endpoint names, not {found}",
                    ));
                    Vec::new()
                }
            },
        };
        let Some(service) = service else { continue };
        let mut names = Vec::new();
        for (endpoint, at) in endpoints {
            let var = DependencyDecl::env_var(&service, &endpoint);
            let label = format!("{service}/{endpoint}");
            if let Some((_, first, line)) = taken.iter().find(|(v, _, _)| *v == var) {
                let (code, message) = if *first == label {
                    (
                        codes::INVALID_VALUE,
                        format!("`{label}` is declared twice (first on line {line})"),
                    )
                } else {
                    (
                        codes::ENV_COLLISION,
                        format!(
                            "`{label}` and `{first}` (line {line}) would both be injected as {var}"
                        ),
                    )
                };
                problems.report(Problem::format(at, &epath, code, message));
                continue;
            }
            taken.push((var, label, at.line));
            names.push(endpoint);
        }
        out.push(DependencyDecl {
            service,
            endpoints: names,
        });
    }
    out
}
