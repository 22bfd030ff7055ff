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

use crate::error::{DeclarationProblem, Sink, codes};
use crate::identity::{Identity, check_part};
use crate::schema::{Schema, join};
use flow::engine::env_key;
use strict_yaml::{Node, Resolved};

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
/// Environment prefixes hostd injects; a declaration may not set them itself.
const RESERVED_ENV_PREFIXES: &[&str] = &["HOSTD_", "FLOW_DEP_"];

/// What running a runnable may do to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Changes nothing: safe to run again.
    ReadOnly,
    /// Changes the world, but running it again with the same `effect_id` changes nothing more.
    Idempotent,
    /// Changes the world each time it runs.
    Effectful,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read_only",
            Effect::Idempotent => "idempotent",
            Effect::Effectful => "effectful",
        }
    }

    fn parse(s: &str) -> Option<Effect> {
        match s {
            "read_only" => Some(Effect::ReadOnly),
            "idempotent" => Some(Effect::Idempotent),
            "effectful" => Some(Effect::Effectful),
            _ => None,
        }
    }

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

    /// Parses the declaration of a package: the handler path is looked up among `files`.
    pub fn parse_packaged(
        workspace: &str,
        folder: &Path,
        file: &Path,
        bytes: &[u8],
        files: &[crate::package::PackagedFile],
    ) -> Result<Declaration, Vec<DeclarationProblem>> {
        let exists = |rel: &str| {
            let rel = rel.trim_start_matches("./");
            files.iter().any(|f| f.path == rel)
        };
        Declaration::parse_with(workspace, folder, file, bytes, &exists)
    }

    fn parse_with(
        workspace: &str,
        folder: &Path,
        file: &Path,
        bytes: &[u8],
        exists: &dyn Fn(&str) -> bool,
    ) -> Result<Declaration, Vec<DeclarationProblem>> {
        let mut sink = Sink::new(file);
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                sink.at_pos(0, 0, codes::SYNTAX, "", format!("not UTF-8 text: {e}"));
                return Err(sink.problems);
            }
        };
        let doc = match strict_yaml::load(text) {
            Ok(d) => d,
            Err(e) => {
                sink.at_pos(e.line, e.column, codes::SYNTAX, "", e.message);
                return Err(sink.problems);
            }
        };
        let parsed = parse_document(&doc, workspace, folder, file, exists, &mut sink);
        match parsed {
            Some(d) if sink.problems.is_empty() => Ok(d),
            _ => Err(sink.problems),
        }
    }
}

fn parse_document(
    doc: &Node,
    workspace: &str,
    folder: &Path,
    file: &Path,
    exists: &dyn Fn(&str) -> bool,
    sink: &mut Sink,
) -> Option<Declaration> {
    let Some(entries) = doc.entries() else {
        sink.at(
            doc,
            codes::WRONG_TYPE,
            "",
            format!("a declaration is a mapping of keys, not {}", doc.describe()),
        );
        return None;
    };
    for (key, _) in entries {
        let name = key.scalar().map(|s| s.text.as_str()).unwrap_or_default();
        if !TOP_KEYS.contains(&name) {
            sink.at(
                key,
                codes::UNKNOWN_KEY,
                name,
                format!("unknown key (allowed: {})", TOP_KEYS.join(", ")),
            );
        }
    }
    for key in REQUIRED_KEYS {
        if doc.get(key).is_none() {
            sink.at(
                doc,
                codes::MISSING_KEY,
                key,
                format!("the required member `{key}` is missing"),
            );
        }
    }

    let name = identity_part(doc, "name", sink);
    let version = identity_part(doc, "version", sink);
    let description = match doc.get("description") {
        None => String::new(),
        Some(d) => match d.as_str() {
            Some(s) => s.to_owned(),
            None => {
                sink.at(
                    d,
                    codes::WRONG_TYPE,
                    "description",
                    format!("must be a string, not {}", d.describe()),
                );
                String::new()
            }
        },
    };
    let input = doc
        .get("input")
        .and_then(|n| Schema::parse(n, "input", sink));
    let output = doc
        .get("output")
        .and_then(|n| Schema::parse(n, "output", sink));
    let command = doc.get("command").and_then(|c| {
        let text = scalar_text(c, "command", sink)?;
        check_command(c, &text, folder, exists, sink);
        Some(text)
    });
    let args = parse_args(doc, sink);
    let env = parse_env(doc, sink);
    let timeout = doc.get("timeout").and_then(|t| parse_timeout(t, sink));
    let effect = doc
        .get("effect")
        .and_then(|e| match e.as_str().and_then(Effect::parse) {
            Some(effect) => Some(effect),
            None => {
                sink.at(
                    e,
                    codes::INVALID_VALUE,
                    "effect",
                    format!(
                        "{} is not an effect; use exactly one of read_only, idempotent, effectful",
                        e.describe()
                    ),
                );
                None
            }
        });
    let dependencies = parse_dependencies(doc, sink);

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

/// `name` or `version`: any non-null scalar, taken as written.
fn identity_part(doc: &Node, key: &str, sink: &mut Sink) -> Option<String> {
    let node = doc.get(key)?;
    let text = match node.scalar() {
        Some(s) if s.resolved != Resolved::Null => s.text.clone(),
        _ => {
            sink.at(
                node,
                codes::WRONG_TYPE,
                key,
                format!("must be a single value, not {}", node.describe()),
            );
            return None;
        }
    };
    if let Err(reason) = check_part(&text) {
        sink.at(node, codes::INVALID_VALUE, key, reason);
        return None;
    }
    Some(text)
}

/// A string, number or boolean as its text.
fn scalar_text(node: &Node, path: &str, sink: &mut Sink) -> Option<String> {
    match node.scalar() {
        Some(s) if s.resolved != Resolved::Null => Some(s.text.clone()),
        _ => {
            sink.at(
                node,
                codes::WRONG_TYPE,
                path,
                format!(
                    "must be a string, number or boolean, not {}",
                    node.describe()
                ),
            );
            None
        }
    }
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
    sink: &mut Sink,
) {
    if command.trim().is_empty() {
        sink.at(node, codes::INVALID_VALUE, "command", "is empty");
        return;
    }
    if !command.contains('/') {
        return; // a program found on PATH
    }
    if !stays_inside(command) {
        sink.at(
            node,
            codes::PATH_ESCAPE,
            "command",
            format!(
                "`{command}` leaves the runnable's folder; a handler path is relative to the folder and may not use `..` or start with `/`"
            ),
        );
        return;
    }
    if !exists(command) {
        sink.at(
            node,
            codes::INVALID_VALUE,
            "command",
            format!("`{command}` names no file in {}", folder.display()),
        );
    }
}

fn parse_args(doc: &Node, sink: &mut Sink) -> Vec<String> {
    let Some(node) = doc.get("args") else {
        return Vec::new();
    };
    let Some(items) = node.items() else {
        sink.at(
            node,
            codes::WRONG_TYPE,
            "args",
            format!(
                "must be a list (write `[]` for none), not {}",
                node.describe()
            ),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("args[{i}]");
        if let Some(text) = scalar_text(item, &path, sink) {
            if text == ".." || text.starts_with("../") {
                sink.at(
                    item,
                    codes::PATH_ESCAPE,
                    &path,
                    format!("`{text}` leaves the runnable's folder"),
                );
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

fn parse_env(doc: &Node, sink: &mut Sink) -> Vec<(String, String)> {
    let Some(node) = doc.get("env") else {
        return Vec::new();
    };
    let Some(entries) = node.entries() else {
        sink.at(
            node,
            codes::WRONG_TYPE,
            "env",
            format!(
                "must be a mapping (write `{{}}` for none), not {}",
                node.describe()
            ),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, value) in entries {
        let name = key.scalar().map(|s| s.text.clone()).unwrap_or_default();
        let path = join("env", &name);
        if !valid_env_name(&name) {
            sink.at(
                key,
                codes::INVALID_VALUE,
                &path,
                format!("`{name}` is not a valid environment variable name"),
            );
            continue;
        }
        if let Some(prefix) = RESERVED_ENV_PREFIXES.iter().find(|p| name.starts_with(*p)) {
            sink.at(
                key,
                codes::INVALID_VALUE,
                &path,
                format!("names starting with `{prefix}` are set by hostd"),
            );
            continue;
        }
        if let Some(text) = scalar_text(value, &path, sink) {
            out.push((name, text));
        }
    }
    out
}

fn parse_timeout(node: &Node, sink: &mut Sink) -> Option<Duration> {
    let text = match node.as_str() {
        Some(t) => t,
        None => {
            sink.at(
                node,
                codes::WRONG_TYPE,
                "timeout",
                format!(
                    "must be a duration with a unit, like 30s or 2m, not {}",
                    node.describe()
                ),
            );
            return None;
        }
    };
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => {
            sink.at(
                node,
                codes::INVALID_VALUE,
                "timeout",
                "must be longer than zero",
            );
            None
        }
        Ok(d) if d > MAX_TIMEOUT => {
            sink.at(node, codes::INVALID_VALUE, "timeout", "may be at most 24h");
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            sink.at(
                node,
                codes::INVALID_VALUE,
                "timeout",
                format!("`{text}` is not a positive duration like 500ms, 30s or 2m ({e})"),
            );
            None
        }
    }
}

fn parse_dependencies(doc: &Node, sink: &mut Sink) -> Vec<DependencyDecl> {
    let Some(node) = doc.get("dependencies") else {
        return Vec::new();
    };
    let Some(items) = node.items() else {
        sink.at(
            node,
            codes::WRONG_TYPE,
            "dependencies",
            format!(
                "must be a list of {{service, endpoints}} entries (write `[]` for none), not {}",
                node.describe()
            ),
        );
        return Vec::new();
    };
    let mut out: Vec<DependencyDecl> = Vec::new();
    // env variable → (service/endpoint, line) of the first that took it
    let mut taken: Vec<(String, String, usize)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("dependencies[{i}]");
        let Some(entries) = item.entries() else {
            sink.at(
                item,
                codes::WRONG_TYPE,
                &path,
                format!(
                    "must be a mapping with `service` and `endpoints`, not {}",
                    item.describe()
                ),
            );
            continue;
        };
        for (key, _) in entries {
            let k = key.scalar().map(|s| s.text.as_str()).unwrap_or_default();
            if !DEPENDENCY_KEYS.contains(&k) {
                sink.at(
                    key,
                    codes::UNKNOWN_KEY,
                    &join(&path, k),
                    format!("unknown key (allowed: {})", DEPENDENCY_KEYS.join(", ")),
                );
            }
        }
        let service = match item.get("service") {
            None => {
                sink.at(
                    item,
                    codes::MISSING_KEY,
                    &join(&path, "service"),
                    "the required member `service` is missing",
                );
                None
            }
            Some(s) => match s.as_str() {
                Some(t) if !t.is_empty() => Some(t.to_owned()),
                _ => {
                    sink.at(
                        s,
                        codes::WRONG_TYPE,
                        &join(&path, "service"),
                        format!("must be a service name, not {}", s.describe()),
                    );
                    None
                }
            },
        };
        let epath = join(&path, "endpoints");
        let endpoints: Vec<(String, &Node)> = match item.get("endpoints") {
            None => {
                sink.at(
                    item,
                    codes::MISSING_KEY,
                    &epath,
                    "the required member `endpoints` is missing: name the endpoints the handler calls",
                );
                Vec::new()
            }
            Some(e) => match e.items() {
                Some(list) if !list.is_empty() => list
                    .iter()
                    .filter_map(|n| match n.as_str() {
                        Some(t) if !t.is_empty() => Some((t.to_owned(), n)),
                        _ => {
                            sink.at(
                                n,
                                codes::WRONG_TYPE,
                                &epath,
                                format!("must list endpoint names, not {}", n.describe()),
                            );
                            None
                        }
                    })
                    .collect(),
                _ => {
                    sink.at(
                        e,
                        codes::WRONG_TYPE,
                        &epath,
                        format!(
                            "must be a non-empty list of endpoint names, not {}",
                            e.describe()
                        ),
                    );
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
                if *first == label {
                    sink.at(
                        at,
                        codes::INVALID_VALUE,
                        &epath,
                        format!("`{label}` is declared twice (first on line {line})"),
                    );
                } else {
                    sink.at(
                        at,
                        codes::ENV_COLLISION,
                        &epath,
                        format!(
                            "`{label}` and `{first}` (line {line}) would both be injected as {var}"
                        ),
                    );
                }
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
