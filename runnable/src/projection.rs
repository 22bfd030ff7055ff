//! The one projection of a runnable that `list --json` rows, `show --json` and agent tool
//! definitions are all cut from, so a shared member never differs between them.
//!
//! A list row holds: `identity`, `workspace`, `name`, `version`, `description`, `effect`,
//! `timeout` (as text, `30s`), `command` (the command line as one string), `file` (the
//! declaration, relative to the workspace) and `digest` (of the recorded release, or null when
//! it was never built). `show` is exactly a list row plus `contract` (`input` and `output` as
//! JSON Schema), `entrypoint` (`command`, `args`, `env`) and `dependencies` (the report). This
//! module must never read files or run anything.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::declaration::Declaration;
use crate::deps::EndpointReport;
use crate::package::Digest;

/// The members a list row and `show` share.
pub fn summary(decl: &Declaration, digest: Option<&Digest>, root: &Path) -> Map<String, Value> {
    let file = decl
        .file
        .strip_prefix(root)
        .unwrap_or(&decl.file)
        .to_string_lossy()
        .into_owned();
    let mut m = Map::new();
    m.insert("identity".into(), json!(decl.identity.to_string()));
    m.insert("workspace".into(), json!(decl.identity.workspace));
    m.insert("name".into(), json!(decl.identity.name));
    m.insert("version".into(), json!(decl.identity.version));
    m.insert("description".into(), json!(decl.description));
    m.insert("effect".into(), json!(decl.effect.as_str()));
    m.insert("timeout".into(), json!(timeout_text(decl)));
    m.insert("command".into(), json!(decl.command_line()));
    m.insert("file".into(), json!(file));
    m.insert("digest".into(), json!(digest.map(Digest::as_str)));
    m
}

/// The timeout as list and show print it.
pub fn timeout_text(decl: &Declaration) -> String {
    humantime::format_duration(decl.timeout)
        .to_string()
        .replace(' ', "")
}

/// The `show` document: the summary plus the contract, the entrypoint and the dependencies.
pub fn show(
    decl: &Declaration,
    digest: Option<&Digest>,
    root: &Path,
    dependencies: &[EndpointReport],
) -> Map<String, Value> {
    let mut m = summary(decl, digest, root);
    m.insert(
        "contract".into(),
        json!({ "input": decl.input.to_json(), "output": decl.output.to_json() }),
    );
    let env: Map<String, Value> = decl
        .env
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    m.insert(
        "entrypoint".into(),
        json!({ "command": decl.command, "args": decl.args, "env": env }),
    );
    m.insert("dependencies".into(), json!(dependencies));
    m
}

/// The tool an agent is offered for `decl`: named by the runnable's name, described by its
/// description, its identity and its effect, with the input schema exactly as `show` prints it.
pub fn tool_spec(decl: &Declaration) -> harness::model::ToolSpec {
    let about = if decl.description.is_empty() {
        format!("Runs {}.", decl.identity)
    } else {
        decl.description.clone()
    };
    harness::model::ToolSpec {
        name: decl.identity.name.clone(),
        description: format!(
            "{about} (runnable {}, effect {}, timeout {})",
            decl.identity,
            decl.effect.as_str(),
            timeout_text(decl)
        ),
        parameters: decl.input.to_json(),
    }
}
