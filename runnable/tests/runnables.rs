//! Runnables end to end through the library: declarations and their every problem, the
//! strict catalog and its resolver, schema checks, packages and digests, invocation of real
//! handler processes in every outcome class, dependencies on a flow, and the tool adapter.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runnable::declaration::DECLARATION_FILE;
use runnable::package::{self, Destination};
use runnable::{
    InvokeOptions, InvokeRequest, OutcomeClass, Release, RunnableError, RunnableTool, Runner,
    invoke,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

// ---- fixtures -------------------------------------------------------------------------------

struct Ws {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Ws {
    fn new() -> Ws {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("shop");
        std::fs::create_dir_all(root.join("runnables")).expect("runnables folder");
        Ws { _tmp: tmp, root }
    }

    fn folder(&self, folder: &str) -> PathBuf {
        self.root.join("runnables").join(folder)
    }

    /// Writes a runnable folder: the declaration text and files `(name, text, executable)`.
    fn add(&self, folder: &str, yaml: &str, files: &[(&str, &str, bool)]) -> PathBuf {
        let dir = self.folder(folder);
        std::fs::create_dir_all(&dir).expect("folder");
        std::fs::write(dir.join(DECLARATION_FILE), yaml).expect("declaration");
        for (name, text, exec) in files {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("file");
            let mode = if *exec { 0o755 } else { 0o644 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        dir
    }

    /// A runnable whose handler is the shell script `script` (run as `./run.sh`).
    fn shell(&self, name: &str, version: &str, effect: &str, timeout: &str, script: &str) {
        self.add(
            &format!("{name}-{version}"),
            &decl(name, version, effect, timeout, "command: ./run.sh\n"),
            &[("run.sh", &format!("#!/bin/sh\n{script}"), true)],
        );
    }

    fn runner(&self) -> Runner {
        Runner::open(&self.root)
            .expect("workspace opens")
            .with_options(InvokeOptions {
                kill_grace: Duration::from_millis(500),
                ..InvokeOptions::default()
            })
            .expect("options")
    }

    fn marker(&self) -> PathBuf {
        self._tmp.path().join("marker")
    }

    fn marker_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.marker())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// A declaration with a `{n: integer}` input and `{n: integer}` output.
fn decl(name: &str, version: &str, effect: &str, timeout: &str, command: &str) -> String {
    format!(
        "name: {name}\nversion: {version}\ndescription: test runnable\n\
         input:\n  type: object\n  properties:\n    n: {{type: integer}}\n  required: [n]\n\
         output:\n  type: object\n  properties:\n    n: {{type: integer}}\n  required: [n]\n\
         {command}timeout: {timeout}\neffect: {effect}\n"
    )
}

fn problems(err: RunnableError) -> Vec<runnable::DeclarationProblem> {
    match err {
        RunnableError::Declaration { problems } => problems,
        other => panic!("expected declaration problems, got {other}"),
    }
}

fn load_problems(ws: &Ws) -> Vec<runnable::DeclarationProblem> {
    problems(
        ws.runner()
            .catalog()
            .expect_err("the catalog must not load"),
    )
}

fn has(problems: &[runnable::DeclarationProblem], code: &str, text: &str) -> bool {
    problems
        .iter()
        .any(|p| p.code == code && (p.message.contains(text) || p.path.contains(text)))
}

async fn run(
    ws: &Ws,
    reference: &str,
    input: Value,
) -> Result<runnable::Invocation, RunnableError> {
    ws.runner()
        .invoke(
            reference,
            InvokeRequest {
                input,
                ..InvokeRequest::default()
            },
            &CancellationToken::new(),
        )
        .await
}

fn hash_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(hash_tree(&p));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

// ---- declarations -------------------------------------------------------------------------

#[test]
fn every_problem_of_a_declaration_is_reported_at_once_with_line_and_code() {
    let ws = Ws::new();
    ws.add(
        "broken",
        "name: broken\nversion: 1.0.0\ntimeoutt: 5s\n\
         input:\n  type: object\n  oneOf: []\n  properties:\n    q: {type: string, format: email}\n  required: [ghost]\n\
         output: {type: array}\n\
         timeout: 0s\neffect: safe\n",
        &[],
    );
    let p = load_problems(&ws);
    assert!(has(&p, "declaration.unknown_key", "timeoutt"), "{p:#?}");
    assert!(has(&p, "declaration.schema_keyword", "oneOf"), "{p:#?}");
    assert!(has(&p, "declaration.schema_keyword", "format"), "{p:#?}");
    assert!(has(&p, "declaration.schema_structure", "ghost"), "{p:#?}");
    assert!(has(&p, "declaration.schema_structure", "items"), "{p:#?}");
    assert!(
        has(&p, "declaration.invalid_value", "longer than zero"),
        "{p:#?}"
    );
    assert!(
        has(
            &p,
            "declaration.invalid_value",
            "read_only, idempotent, effectful"
        ),
        "{p:#?}"
    );
    assert!(has(&p, "declaration.missing_key", "command"), "{p:#?}");
    let oneof = p.iter().find(|x| x.message.contains("oneOf")).unwrap();
    assert_eq!((oneof.line, oneof.path.as_str()), (6, "input"));
    let timeoutt = p.iter().find(|x| x.path == "timeoutt").unwrap();
    assert_eq!(timeoutt.line, 3);
    assert!(
        p.iter()
            .all(|x| x.file.ends_with("runnables/broken/runnable.yaml"))
    );
}

#[test]
fn each_missing_required_member_is_refused_by_name() {
    let full = decl("x", "1.0.0", "read_only", "5s", "command: sh\n");
    for member in [
        "name", "version", "input", "output", "command", "timeout", "effect",
    ] {
        let ws = Ws::new();
        let text: String = remove_member(&full, member);
        ws.add("x", &text, &[]);
        let p = load_problems(&ws);
        assert!(
            has(&p, "declaration.missing_key", member),
            "{member}: {p:#?}"
        );
    }
}

fn remove_member(yaml: &str, member: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in yaml.lines() {
        if line.starts_with(&format!("{member}:")) {
            skipping = true;
            continue;
        }
        if skipping && line.starts_with(' ') {
            continue;
        }
        skipping = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[test]
fn an_unknown_key_in_a_dependency_entry_is_refused_with_its_path() {
    let ws = Ws::new();
    let text = decl("x", "1", "read_only", "5s", "command: sh\n")
        + "dependencies:\n  - service: db\n    endpoints: [pg]\n    kind: runtime\n";
    ws.add("x", &text, &[]);
    let p = load_problems(&ws);
    assert!(
        has(&p, "declaration.unknown_key", "dependencies[0].kind"),
        "{p:#?}"
    );
}

#[test]
fn unquoted_versions_and_names_keep_the_text_written() {
    let ws = Ws::new();
    ws.add(
        "a",
        &decl("no", "1.1", "read_only", "5s", "command: sh\n"),
        &[],
    );
    ws.add(
        "b",
        &decl("no", "1.10", "read_only", "5s", "command: sh\n"),
        &[],
    );
    let catalog = ws.runner().catalog().expect("loads");
    let ids: Vec<String> = catalog
        .runnables
        .iter()
        .map(|d| d.identity.to_string())
        .collect();
    assert_eq!(ids, ["shop/no@1.1", "shop/no@1.10"]);
}

#[test]
fn names_and_versions_with_separators_are_refused() {
    for (name, version) in [("a@b", "1"), ("ok", "\"1/2\""), ("has space", "1")] {
        let ws = Ws::new();
        ws.add(
            "x",
            &decl(name, version, "read_only", "5s", "command: sh\n"),
            &[],
        );
        let p = load_problems(&ws);
        assert!(
            p.iter().any(|x| x.code == "declaration.invalid_value"
                && (x.path == "name" || x.path == "version")),
            "{name} {version}: {p:#?}"
        );
    }
}

#[test]
fn only_the_three_effect_spellings_are_accepted() {
    for bad in ["read-only", "READ_ONLY", "safe"] {
        let ws = Ws::new();
        ws.add("x", &decl("x", "1", bad, "5s", "command: sh\n"), &[]);
        let p = load_problems(&ws);
        assert!(
            has(
                &p,
                "declaration.invalid_value",
                "read_only, idempotent, effectful"
            ),
            "{bad}"
        );
    }
}

#[test]
fn a_timeout_must_be_a_positive_duration_and_is_listed_as_such() {
    for bad in ["0s", "-1s", "soon", "30"] {
        let ws = Ws::new();
        ws.add("x", &decl("x", "1", "read_only", bad, "command: sh\n"), &[]);
        let p = load_problems(&ws);
        assert!(p.iter().any(|x| x.path == "timeout"), "{bad}: {p:#?}");
    }
    let ws = Ws::new();
    ws.add(
        "x",
        &decl("x", "1", "read_only", "30s", "command: sh\n"),
        &[],
    );
    let catalog = ws.runner().catalog().expect("loads");
    let row = runnable::projection::summary(&catalog.runnables[0], None, &catalog.workspace.root);
    assert_eq!(row["timeout"], "30s");
}

#[test]
fn a_null_where_a_list_belongs_is_refused_and_an_empty_list_means_none() {
    let ws = Ws::new();
    ws.add(
        "x",
        &(decl("x", "1", "read_only", "5s", "command: sh\n") + "dependencies: ~\n"),
        &[],
    );
    let p = load_problems(&ws);
    assert!(has(&p, "declaration.wrong_type", "dependencies"), "{p:#?}");

    let ws = Ws::new();
    let text = "name: x\nversion: 1\ninput: {type: object, properties: {}, required: ~}\n\
                output: {type: object}\ncommand: sh\ntimeout: 1s\neffect: read_only\n";
    ws.add("x", text, &[]);
    assert!(has(
        &load_problems(&ws),
        "declaration.wrong_type",
        "required"
    ));

    let ws = Ws::new();
    ws.add(
        "x",
        &(decl("x", "1", "read_only", "5s", "command: sh\n")
            + "dependencies: []\nargs: []\nenv: {}\n"),
        &[],
    );
    assert!(
        ws.runner().catalog().expect("loads").runnables[0]
            .dependencies
            .is_empty()
    );
}

#[test]
fn dependencies_that_map_to_one_environment_variable_are_refused_naming_both() {
    let ws = Ws::new();
    ws.add(
        "x",
        &(decl("x", "1", "read_only", "5s", "command: sh\n")
            + "dependencies:\n  - {service: my-db, endpoints: [pg]}\n  - {service: my_db, endpoints: [pg]}\n"),
        &[],
    );
    let p = load_problems(&ws);
    let hit = p
        .iter()
        .find(|x| x.code == "declaration.env_collision")
        .expect("collision");
    assert!(hit.message.contains("FLOW_DEP_MY_DB_PG_ADDR"), "{hit}");
    assert!(
        hit.message.contains("my-db/pg") && hit.message.contains("my_db/pg"),
        "{hit}"
    );
}

#[test]
fn a_duplicate_yaml_key_is_a_syntax_problem_with_its_line() {
    let ws = Ws::new();
    ws.add("x", "name: x\nname: y\n", &[]);
    let p = load_problems(&ws);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!((p[0].code, p[0].line), ("declaration.syntax", 2));
}

#[test]
fn a_handler_path_that_leaves_the_folder_is_refused() {
    let ws = Ws::new();
    ws.add(
        "x",
        &decl("x", "1", "read_only", "5s", "command: ../../secret\n"),
        &[],
    );
    assert!(has(
        &load_problems(&ws),
        "declaration.path_escape",
        "leaves"
    ));
    let ws = Ws::new();
    ws.add(
        "x",
        &decl(
            "x",
            "1",
            "read_only",
            "5s",
            "command: sh\nargs: [../x.sh]\n",
        ),
        &[],
    );
    assert!(has(
        &load_problems(&ws),
        "declaration.path_escape",
        "args[0]"
    ));
}

// ---- the catalog --------------------------------------------------------------------------

#[test]
fn a_broken_declaration_fails_the_listing_instead_of_shortening_it() {
    let ws = Ws::new();
    ws.add(
        "a",
        &decl("a", "1", "read_only", "5s", "command: sh\n"),
        &[],
    );
    ws.add(
        "b",
        &decl("b", "1", "read_only", "5s", "command: sh\n"),
        &[],
    );
    ws.add("c", "name: c\nversion: [\n", &[]);
    let p = load_problems(&ws);
    assert_eq!(p.len(), 1);
    assert!(p[0].file.ends_with("runnables/c/runnable.yaml"));
    // A folder without a declaration is not silently skipped either.
    std::fs::remove_dir_all(ws.folder("c")).unwrap();
    std::fs::create_dir_all(ws.folder("empty")).unwrap();
    assert!(has(
        &load_problems(&ws),
        "declaration.unreadable",
        "has no runnable.yaml"
    ));
}

#[test]
fn a_workspace_with_no_runnables_lists_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("empty");
    std::fs::create_dir(&root).unwrap();
    let runner = Runner::open(&root).unwrap();
    assert!(runner.catalog().unwrap().runnables.is_empty());
}

#[tokio::test]
async fn a_handler_invoked_under_a_trace_receives_its_traceparent_in_env_and_request() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);
    let ws = Ws::new();
    let marker = ws.marker();
    let script = format!(
        "cat > {m}.req; echo \"$TRACEPARENT\" > {m}; echo '{{\"ok\":true,\"output\":{{\"n\":1}}}}'\n",
        m = marker.display()
    );
    ws.shell("traced", "1", "read_only", "5s", &script);
    let caller = trace_context::TraceContext::from_headers(
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        None,
    )
    .unwrap()
    .unwrap();
    let span = tracing::info_span!("caller");
    trace_context::span::continue_trace(&span, &caller);
    let done = run(&ws, "traced", json!({"n": 1}))
        .instrument(span)
        .await
        .unwrap();
    assert_eq!(done.outcome, OutcomeClass::Succeeded);
    let env = ws.marker_lines().join("");
    let got: trace_context::TraceParent = env.parse().expect("TRACEPARENT is a traceparent");
    // The handler's parent is the invocation's own span, in the caller's trace.
    assert_eq!(got.trace_id(), caller.parent.trace_id());
    assert_ne!(got.parent_id(), caller.parent.parent_id());
    let request: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}.req", marker.display())).unwrap(),
    )
    .unwrap();
    assert_eq!(request["traceparent"], json!(env));
}

#[tokio::test]
async fn two_versions_coexist_and_a_bare_name_is_ambiguous_everywhere() {
    let ws = Ws::new();
    let marker = ws.marker();
    let script = format!(
        "cat >/dev/null; echo ran >> {}; echo '{{\"ok\":true,\"output\":{{\"n\":1}}}}'\n",
        marker.display()
    );
    ws.shell("word-count", "1.0.0", "read_only", "5s", &script);
    ws.shell("word-count", "2.0.0", "read_only", "5s", &script);
    let runner = ws.runner();
    let catalog = runner.catalog().unwrap();
    let err = catalog.resolve("word-count").unwrap_err();
    assert_eq!(err.code(), "ambiguous");
    assert!(err.to_string().contains("shop/word-count@1.0.0"));
    assert!(err.to_string().contains("shop/word-count@2.0.0"));
    let err = run(&ws, "word-count", json!({"n": 1})).await.unwrap_err();
    assert_eq!(err.code(), "ambiguous");
    assert!(ws.marker_lines().is_empty(), "nothing ran");
    // Each release is reachable by version; an unknown version names the ones that exist.
    assert_eq!(
        catalog
            .resolve("word-count@2.0.0")
            .unwrap()
            .identity
            .version,
        "2.0.0"
    );
    assert_eq!(
        catalog
            .resolve("shop/word-count@1.0.0")
            .unwrap()
            .identity
            .version,
        "1.0.0"
    );
    let err = catalog.resolve("word-count@9.9.9").unwrap_err();
    assert_eq!(err.code(), "not_found");
    assert!(
        err.to_string().contains("1.0.0") && err.to_string().contains("2.0.0"),
        "{err}"
    );
    // One release needs no version.
    ws.shell("single", "1", "read_only", "5s", &script);
    let inv = run(&ws, "single", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded);
}

#[test]
fn one_identity_declared_twice_fails_naming_both_files() {
    let ws = Ws::new();
    ws.add(
        "one",
        &decl("x", "1", "read_only", "5s", "command: sh\n"),
        &[],
    );
    ws.add(
        "two",
        &decl("x", "1", "read_only", "5s", "command: sh\n"),
        &[],
    );
    let p = load_problems(&ws);
    let dup = p
        .iter()
        .find(|x| x.code == "declaration.duplicate")
        .expect("duplicate");
    assert!(
        dup.message.contains("runnables/one/") && dup.message.contains("runnables/two/"),
        "{dup}"
    );
}

#[test]
fn the_list_order_is_by_name_then_version_and_repeatable() {
    let ws = Ws::new();
    for (f, n, v) in [("a", "b", "1.10"), ("b", "b", "1.9"), ("c", "a", "2")] {
        ws.add(f, &decl(n, v, "read_only", "5s", "command: sh\n"), &[]);
    }
    let ids = |ws: &Ws| -> Vec<String> {
        ws.runner()
            .catalog()
            .unwrap()
            .runnables
            .iter()
            .map(|d| d.identity.to_string())
            .collect()
    };
    assert_eq!(ids(&ws), ["shop/a@2", "shop/b@1.9", "shop/b@1.10"]);
    assert_eq!(ids(&ws), ids(&ws));
}

// ---- schemas ------------------------------------------------------------------------------

fn schema_ws(input: &str) -> Ws {
    let ws = Ws::new();
    let text = format!(
        "name: s\nversion: 1\ninput:\n{input}\noutput: {{type: object, additionalProperties: true}}\n\
         command: ./run.sh\ntimeout: 5s\neffect: read_only\n"
    );
    let marker = ws.marker();
    ws.add(
        "s",
        &text,
        &[(
            "run.sh",
            &format!("#!/bin/sh\ncat >/dev/null\necho ran >> {}\necho '{{\"ok\":true,\"output\":{{}}}}'\n", marker.display()),
            true,
        )],
    );
    ws
}

async fn violations(ws: &Ws, input: Value) -> Vec<runnable::Violation> {
    match run(ws, "s", input).await {
        Err(RunnableError::InvalidInput { violations, .. }) => violations,
        Ok(inv) => {
            assert_eq!(inv.outcome, OutcomeClass::Succeeded);
            Vec::new()
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn every_input_violation_is_listed_with_its_path_and_rule_before_anything_starts() {
    let ws = schema_ws(
        "  type: object\n  properties:\n    items:\n      type: array\n      items:\n        type: object\n        properties:\n          qty: {type: integer, minimum: 1}\n        required: [qty]\n    name: {type: string, maxLength: 3}\n  required: [items, name]",
    );
    let v = violations(
        &ws,
        json!({"items": [{"qty": 1}, {"qty": 2}, {"qty": 0}, {}], "name": "long", "extra": true}),
    )
    .await;
    let got: Vec<(String, &str)> = v.iter().map(|x| (x.path.clone(), x.rule)).collect();
    assert!(got.contains(&("items[2].qty".into(), "minimum")), "{got:?}");
    assert!(got.contains(&("items[3]".into(), "required")), "{got:?}");
    assert!(got.contains(&("name".into(), "max_length")), "{got:?}");
    assert!(got.contains(&("extra".into(), "additional")), "{got:?}");
    assert!(ws.marker_lines().is_empty(), "the handler never started");
}

#[tokio::test]
async fn integers_take_whole_numbers_only_and_nothing_is_coerced() {
    let ws = schema_ws(
        "  type: object\n  properties:\n    n: {type: integer}\n    b: {type: boolean}\n    x: {type: number}",
    );
    for bad in [
        json!({"n": 1.5}),
        json!({"n": "1"}),
        json!({"n": 1.0}),
        json!({"b": "true"}),
        json!({"x": "2"}),
    ] {
        let v = violations(&ws, bad.clone()).await;
        assert_eq!(v.len(), 1, "{bad}: {v:?}");
        assert_eq!(v[0].rule, "type", "{bad}");
    }
    assert!(
        violations(&ws, json!({"n": 1, "b": true, "x": 2.5}))
            .await
            .is_empty()
    );
    assert!(
        violations(&ws, json!({"x": 2})).await.is_empty(),
        "an integer is a number"
    );
    assert!(ws.marker_lines().len() == 2);
}

#[tokio::test]
async fn required_and_nullable_are_independent() {
    let ws = schema_ws(
        "  type: object\n  properties:\n    rn: {type: string, nullable: true}\n    r: {type: string}\n    on: {type: string, nullable: true}\n    o: {type: string}\n  required: [rn, r]",
    );
    // Present values everywhere: accepted.
    assert!(
        violations(&ws, json!({"rn": "a", "r": "a", "on": "a", "o": "a"}))
            .await
            .is_empty()
    );
    // Absent optionals: accepted; absent required: refused.
    assert!(
        violations(&ws, json!({"rn": "a", "r": "a"}))
            .await
            .is_empty()
    );
    let v = violations(&ws, json!({"r": "a"})).await;
    assert_eq!((v[0].path.as_str(), v[0].rule), ("$", "required"));
    // null: accepted where nullable, refused elsewhere, required or not.
    assert!(
        violations(&ws, json!({"rn": null, "r": "a", "on": null}))
            .await
            .is_empty()
    );
    let v = violations(&ws, json!({"rn": "a", "r": null, "o": null})).await;
    let got: Vec<(&str, &str)> = v.iter().map(|x| (x.path.as_str(), x.rule)).collect();
    assert_eq!(got, [("r", "null"), ("o", "null")]);
}

#[tokio::test]
async fn an_undeclared_member_is_refused_in_input_and_output_alike() {
    let ws = Ws::new();
    ws.shell(
        "x",
        "1",
        "read_only",
        "5s",
        "cat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":1,\"extra\":2}}'\n",
    );
    let err = run(&ws, "x", json!({"n": 1, "extra": 2}))
        .await
        .unwrap_err();
    let RunnableError::InvalidInput { violations, .. } = err else {
        panic!()
    };
    assert_eq!(
        (violations[0].path.as_str(), violations[0].rule),
        ("extra", "additional")
    );
    let inv = run(&ws, "x", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::InvalidOutput);
    assert_eq!(
        (inv.violations[0].path.as_str(), inv.violations[0].rule),
        ("extra", "additional")
    );
}

// ---- packages -----------------------------------------------------------------------------

fn digest_of(root: &Path, folder: &str) -> String {
    let ws = Runner::open(root).unwrap();
    let catalog = ws.catalog().unwrap();
    let decl = catalog
        .runnables
        .iter()
        .find(|d| d.folder.ends_with(folder))
        .unwrap();
    package::Digest::of(&package::collect(&decl.folder).unwrap()).to_string()
}

#[test]
fn the_digest_depends_only_on_packaged_content() {
    let a = Ws::new();
    let b = Ws::new();
    let files: &[(&str, &str, bool)] = &[
        ("run.sh", "#!/bin/sh\necho hi\n", true),
        ("lib/data.txt", "x", false),
    ];
    std::fs::create_dir_all(a.folder("x").join("lib")).unwrap();
    std::fs::create_dir_all(b.folder("x").join("lib")).unwrap();
    a.add(
        "x",
        &decl("x", "1", "read_only", "5s", "command: ./run.sh\n"),
        files,
    );
    b.add(
        "x",
        &decl("x", "1", "read_only", "5s", "command: ./run.sh\n"),
        &[files[1], files[0]],
    );
    let first = digest_of(&a.root, "x");
    assert_eq!(
        first,
        digest_of(&b.root, "x"),
        "another checkout folder, another file order"
    );
    // Timestamps change nothing; hidden files are not packaged.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(a.folder("x").join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(a.folder("x").join(".editor-swap"), "junk").unwrap();
    assert_eq!(first, digest_of(&a.root, "x"));
    // The executable bit and a rename are content.
    std::fs::set_permissions(
        a.folder("x").join("lib/data.txt"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let exec = digest_of(&a.root, "x");
    assert_ne!(first, exec);
    std::fs::rename(
        a.folder("x").join("lib/data.txt"),
        a.folder("x").join("lib/other.txt"),
    )
    .unwrap();
    assert_ne!(exec, digest_of(&a.root, "x"));
    // A comment in the declaration is content too, and the packaged declaration is byte-equal.
    let built = b.runner().build("x").unwrap();
    let yaml = built
        .package
        .files
        .iter()
        .find(|f| f.path == DECLARATION_FILE)
        .unwrap();
    assert_eq!(
        yaml.bytes,
        std::fs::read(b.folder("x").join(DECLARATION_FILE)).unwrap()
    );
    let mut text = std::fs::read_to_string(b.folder("x").join(DECLARATION_FILE)).unwrap();
    text.push_str("# a comment\n");
    std::fs::write(b.folder("x").join(DECLARATION_FILE), text).unwrap();
    assert_ne!(built.package.digest.to_string(), digest_of(&b.root, "x"));
}

#[test]
fn building_again_is_idempotent_and_changed_content_is_a_conflict_that_changes_nothing() {
    let ws = Ws::new();
    ws.shell("x", "1", "read_only", "5s", "echo one\n");
    let runner = ws.runner();
    let first = runner.build("x").unwrap();
    assert!(first.written);
    let again = runner.build("x").unwrap();
    assert!(!again.written);
    assert_eq!(first.package.digest, again.package.digest);
    let before = hash_tree(&runner.workspace().releases_dir());

    std::fs::write(ws.folder("x-1").join("run.sh"), "#!/bin/sh\necho two\n").unwrap();
    let err = runner.build("x").unwrap_err();
    assert_eq!(err.code(), "conflict");
    assert!(
        err.to_string().contains(first.package.digest.as_str()),
        "{err}"
    );
    assert_eq!(
        before,
        hash_tree(&runner.workspace().releases_dir()),
        "nothing changed, no leftovers"
    );

    // Changing only the timeout (or the effect) is a conflict too.
    std::fs::write(ws.folder("x-1").join("run.sh"), "#!/bin/sh\necho one\n").unwrap();
    let yaml = ws.folder("x-1").join(DECLARATION_FILE);
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, text.replace("timeout: 5s", "timeout: 6s")).unwrap();
    assert_eq!(runner.build("x").unwrap_err().code(), "conflict");
    std::fs::write(
        &yaml,
        text.replace("effect: read_only", "effect: effectful"),
    )
    .unwrap();
    assert_eq!(runner.build("x").unwrap_err().code(), "conflict");
}

#[tokio::test]
async fn invoke_runs_the_recorded_release_and_refuses_a_changed_source_under_the_same_version() {
    let ws = Ws::new();
    ws.shell(
        "x",
        "1",
        "read_only",
        "5s",
        "cat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":1}}'\n",
    );
    let inv = run(&ws, "x", json!({"n": 0})).await.unwrap();
    assert_eq!(inv.output, Some(json!({"n": 1})));
    std::fs::write(
        ws.folder("x-1").join("run.sh"),
        "#!/bin/sh\ncat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":2}}'\n",
    )
    .unwrap();
    let err = run(&ws, "x", json!({"n": 0})).await.unwrap_err();
    assert_eq!(err.code(), "conflict");
}

#[tokio::test]
async fn a_tampered_package_is_refused_with_integrity_and_never_runs() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "x",
        "1",
        "read_only",
        "5s",
        &format!(
            "cat >/dev/null; echo ran >> {}; echo '{{\"ok\":true,\"output\":{{\"n\":1}}}}'\n",
            marker.display()
        ),
    );
    let runner = ws.runner();
    let built = runner.build("x").unwrap();
    let mut bytes = std::fs::read(&built.path).unwrap();
    let at = bytes.len() - 5; // inside the packaged handler
    bytes[at] ^= 0x01;
    std::fs::set_permissions(&built.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&built.path, &bytes).unwrap();
    let err = run(&ws, "x", json!({"n": 1})).await.unwrap_err();
    assert_eq!(err.code(), "integrity", "{err}");
    assert!(ws.marker_lines().is_empty(), "the handler never ran");
    // The same bytes offered as a published package are refused the same way.
    let state = ws._tmp.path().join("host-state");
    let err = Release::from_bytes(&bytes, None, &state, None).unwrap_err();
    assert_eq!(err.code(), "integrity");
}

#[tokio::test]
async fn a_cache_folder_that_was_edited_is_unpacked_again_before_it_runs() {
    let ws = Ws::new();
    ws.shell(
        "x",
        "1",
        "read_only",
        "5s",
        "cat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":1}}'\n",
    );
    let runner = ws.runner();
    let release = runner.release("x").unwrap();
    let script = release.dir().join("run.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"ok\":true,\"output\":{\"n\":666}}'\n",
    )
    .unwrap();
    let inv = invoke(
        &release,
        InvokeRequest {
            input: json!({"n": 1}),
            ..Default::default()
        },
        runner.options(),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        inv.output,
        Some(json!({"n": 1})),
        "the verified bytes ran, not the edited ones"
    );
}

#[test]
fn a_symlink_out_of_the_folder_is_refused_and_nothing_is_packaged() {
    let ws = Ws::new();
    ws.shell("x", "1", "read_only", "5s", "echo\n");
    let outside = ws._tmp.path().join("secret");
    std::fs::write(&outside, "key").unwrap();
    std::os::unix::fs::symlink(&outside, ws.folder("x-1").join("link")).unwrap();
    let runner = ws.runner();
    let err = runner.build("x").unwrap_err();
    assert_eq!(err.code(), "build");
    assert!(err.to_string().contains("outside"), "{err}");
    assert!(hash_tree(&runner.workspace().releases_dir()).is_empty());
}

#[test]
fn an_explicit_output_must_be_new_and_builds_are_byte_identical() {
    let ws = Ws::new();
    ws.shell("x", "1", "read_only", "5s", "echo\n");
    let runner = ws.runner();
    let one = ws._tmp.path().join("out-one");
    let two = ws._tmp.path().join("out-two");
    runner.build_to("x", &one).unwrap();
    runner.build_to("x", &two).unwrap();
    let strip = |v: Vec<(PathBuf, Vec<u8>)>, base: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        v.into_iter()
            .map(|(p, b)| (p.strip_prefix(base).unwrap().to_path_buf(), b))
            .collect()
    };
    assert_eq!(strip(hash_tree(&one), &one), strip(hash_tree(&two), &two));
    assert_eq!(runner.build_to("x", &one).unwrap_err().code(), "build");
    // Unreleased builds record nothing.
    assert!(hash_tree(&runner.workspace().releases_dir()).is_empty());
}

#[test]
fn sources_changed_during_a_build_are_refused_and_nothing_is_recorded() {
    let ws = Ws::new();
    ws.shell("x", "1", "read_only", "5s", "echo\n");
    let runner = ws.runner();
    let catalog = runner.catalog().unwrap();
    let decl = &catalog.runnables[0];
    let script = ws.folder("x-1").join("run.sh");
    let err = package::build_with_hook(
        decl,
        &Destination::Releases(runner.workspace().releases_dir()),
        &|| std::fs::write(&script, "#!/bin/sh\necho changed\n").unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "build");
    assert!(
        err.to_string().contains("changed during the build"),
        "{err}"
    );
    assert!(
        hash_tree(&runner.workspace().releases_dir()).is_empty(),
        "no package, no leftovers"
    );
}

// ---- invocation ---------------------------------------------------------------------------

const OK_DOC: &str = r#"echo '{"ok":true,"output":{"n":1}}'"#;

#[tokio::test]
async fn each_handler_behaviour_gets_its_outcome_class() {
    let ws = Ws::new();
    let cases: &[(&str, &str, OutcomeClass)] = &[
        (
            "succeeds",
            &format!("cat >/dev/null; {OK_DOC}\n"),
            OutcomeClass::Succeeded,
        ),
        (
            "fails",
            "cat >/dev/null; echo '{\"ok\":false,\"error\":{\"code\":\"out_of_stock\",\"message\":\"none left\"}}'; exit 2\n",
            OutcomeClass::Failed,
        ),
        (
            "bad-output",
            "cat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":\"one\"}}'\n",
            OutcomeClass::InvalidOutput,
        ),
        (
            "no-document",
            "cat >/dev/null; exit 0\n",
            OutcomeClass::InvalidOutput,
        ),
        (
            "two-documents",
            &format!("cat >/dev/null; {OK_DOC}; {OK_DOC}\n"),
            OutcomeClass::InvalidOutput,
        ),
        (
            "not-json",
            "cat >/dev/null; echo hello\n",
            OutcomeClass::InvalidOutput,
        ),
        ("exits-3", "cat >/dev/null; exit 3\n", OutcomeClass::Crashed),
        (
            "success-then-exit-1",
            &format!("cat >/dev/null; {OK_DOC}; exit 1\n"),
            OutcomeClass::Crashed,
        ),
        (
            "killed",
            "cat >/dev/null; kill -9 $$\n",
            OutcomeClass::Crashed,
        ),
        (
            "sleeps",
            "cat >/dev/null; sleep 30\n",
            OutcomeClass::TimedOut,
        ),
    ];
    for (name, script, _) in cases {
        ws.shell(name, "1", "read_only", "1s", script);
    }
    for (name, _, want) in cases {
        let inv = run(&ws, name, json!({"n": 1})).await.unwrap();
        assert_eq!(inv.outcome, *want, "{name}: {}", inv.detail);
        assert_eq!(
            inv.certain,
            matches!(want, OutcomeClass::Succeeded | OutcomeClass::Failed),
            "{name}"
        );
        if !inv.certain {
            assert!(inv.detail.contains("unknown"), "{name}: {}", inv.detail);
        }
        if *want == OutcomeClass::Failed {
            let e = inv.error.as_ref().unwrap();
            assert_eq!(
                (e.code.as_str(), e.message.as_str()),
                ("out_of_stock", "none left")
            );
        }
    }
}

#[tokio::test]
async fn a_cancelled_invocation_stops_the_group_and_says_the_effect_is_unknown() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "slow",
        "1",
        "read_only",
        "30s",
        &format!(
            "cat >/dev/null; echo $$ >> {}; sleep 30\n",
            marker.display()
        ),
    );
    let runner = ws.runner();
    let release = runner.release("slow").unwrap();
    let cancel = CancellationToken::new();
    let stopper = {
        let cancel = cancel.clone();
        let marker = marker.clone();
        tokio::spawn(async move {
            while !marker.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cancel.cancel();
        })
    };
    let inv = invoke(
        &release,
        InvokeRequest {
            input: json!({"n": 1}),
            ..Default::default()
        },
        runner.options(),
        &cancel,
    )
    .await
    .unwrap();
    stopper.await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Cancelled);
    assert!(!inv.certain);
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    assert!(
        group_members(pgid).is_empty(),
        "nothing of the group survives"
    );
}

/// The guard among a group's live members (its `$0` is `hostd-guard`).
fn guard_of(pgid: i32) -> Option<i32> {
    group_members(pgid).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                c.split(|b| *b == 0)
                    .any(|a| a == runnable::guard::GUARD_NAME.as_bytes())
            })
            .unwrap_or(false)
    })
}

/// Waits up to `bound` for a group to have no live member; false if it still has one.
async fn group_empties(pgid: i32, bound: Duration) -> bool {
    let until = std::time::Instant::now() + bound;
    while !group_members(pgid).is_empty() {
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test]
async fn a_handler_and_its_grandchild_end_when_their_invoker_drops_the_invocation() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "dropped",
        "1",
        "read_only",
        "60s",
        &format!(
            "cat >/dev/null; sleep 1000 & echo $$ >> {}; wait\n",
            marker.display()
        ),
    );
    let runner = ws.runner();
    let release = runner.release("dropped").unwrap();
    let task = {
        let options = runner.options().clone();
        tokio::spawn(async move {
            let _ = invoke(
                &release,
                InvokeRequest {
                    input: json!({"n": 1}),
                    ..Default::default()
                },
                &options,
                &CancellationToken::new(),
            )
            .await;
        })
    };
    while !marker.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    assert!(
        group_members(pgid).len() >= 2,
        "the handler and its grandchild run"
    );
    // Dropped mid-invoke: nobody supervises the handler any more.
    task.abort();
    let _ = task.await;
    assert!(
        group_empties(pgid, Duration::from_secs(2)).await,
        "the group outlived its invocation: {:?}",
        group_members(pgid)
    );
}

#[tokio::test]
async fn a_finished_invocation_leaves_no_guard_behind() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "quick",
        "1",
        "read_only",
        "5s",
        &format!(
            "cat >/dev/null; echo $$ >> {}\n{OK_DOC}\n",
            marker.display()
        ),
    );
    let inv = run(&ws, "quick", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded);
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    assert!(group_members(pgid).is_empty(), "{:?}", group_members(pgid));
}

/// Live (non-zombie) members of a process group, from /proc.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && fields[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn a_handler_ignoring_sigterm_ends_at_the_deadline_with_no_process_left_behind() {
    let ws = Ws::new();
    let marker = ws.marker();
    // Ignores SIGTERM, leaves a grandchild that ignores it too, and would print a success
    // document if it ever got there.
    ws.shell(
        "stubborn",
        "1",
        "read_only",
        "1s",
        &format!("trap '' TERM\ncat >/dev/null\necho $$ >> {}\n(trap '' TERM; sleep 1000) &\nsleep 3\n{OK_DOC}\n", marker.display()),
    );
    let started = std::time::Instant::now();
    let inv = run(&ws, "stubborn", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    assert!(
        group_members(pgid).is_empty(),
        "the group is empty: {:?}",
        group_members(pgid)
    );
}

#[tokio::test]
async fn a_success_written_during_the_grace_is_still_timed_out() {
    let ws = Ws::new();
    ws.shell(
        "late",
        "1",
        "read_only",
        "1s",
        &format!("trap '{OK_DOC}; exit 0' TERM\ncat >/dev/null\nsleep 5 & wait\n"),
    );
    let inv = run(&ws, "late", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::TimedOut);
}

#[tokio::test]
async fn a_grandchild_left_after_a_normal_exit_is_stopped_too() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "leaves",
        "1",
        "read_only",
        "5s",
        &format!(
            "cat >/dev/null; echo $$ >> {}; sleep 1000 >/dev/null 2>&1 &\n{OK_DOC}\n",
            marker.display()
        ),
    );
    let inv = run(&ws, "leaves", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded);
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    assert!(group_members(pgid).is_empty());
}

#[tokio::test]
async fn a_crashing_handler_is_started_exactly_once() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "crash",
        "1",
        "effectful",
        "5s",
        &format!("cat >/dev/null; echo ran >> {}; exit 7\n", marker.display()),
    );
    let inv = run(&ws, "crash", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Crashed);
    assert_eq!(inv.exit.code, Some(7));
    assert_eq!(ws.marker_lines(), ["ran"]);
}

#[tokio::test]
async fn the_request_reaches_stdin_and_stderr_goes_to_the_log() {
    let ws = Ws::new();
    let dump = ws._tmp.path().join("request.json");
    ws.shell(
        "dump",
        "1",
        "read_only",
        "5s",
        &format!(
            "cat > {}\necho 'a log line' >&2\nenv | grep ^HOSTD_ >&2\n{OK_DOC}\n",
            dump.display()
        ),
    );
    let runner = ws.runner();
    let inv = runner
        .invoke(
            "dump",
            InvokeRequest {
                input: json!({"n": 5}),
                intent_id: Some("order-42".into()),
                effect_id: None,
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded);
    let request: Value = serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    assert_eq!(request["protocol"], "hostd.runnable.request/1");
    assert_eq!(request["input"], json!({"n": 5}));
    assert_eq!(request["intent_id"], "order-42");
    assert_eq!(request["effect_id"], inv.effect_id.as_str());
    assert_eq!(request["runnable"], "shop/dump@1");
    assert_eq!(request["digest"], inv.digest.as_str());
    assert!(request["deadline"].as_str().unwrap().ends_with('Z'));
    let log = std::fs::read_to_string(&inv.log).unwrap();
    assert!(log.contains("a log line"), "{log}");
    assert!(
        log.contains("HOSTD_EFFECT_ID=") && log.contains("HOSTD_INTENT_ID=order-42"),
        "{log}"
    );

    // The same intent against the same release: the same effect id; another intent: another.
    let again = runner
        .invoke(
            "dump",
            InvokeRequest {
                input: json!({"n": 5}),
                intent_id: Some("order-42".into()),
                effect_id: None,
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(again.effect_id, inv.effect_id);
    let other = runner
        .invoke(
            "dump",
            InvokeRequest {
                input: json!({"n": 5}),
                intent_id: None,
                effect_id: None,
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_ne!(other.effect_id, inv.effect_id);
    assert!(other.intent_id.starts_with("int-"));
}

#[tokio::test]
async fn a_shell_and_a_python_handler_behave_identically() {
    let ws = Ws::new();
    ws.shell(
        "sh-echo",
        "1",
        "read_only",
        "5s",
        &format!("cat >/dev/null; {OK_DOC}\n"),
    );
    ws.add(
        "py",
        &decl("py-echo", "1", "read_only", "5s", "command: python3\nargs: [run.py]\n"),
        &[("run.py", "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'ok': True, 'output': {'n': 1}}))\n", false)],
    );
    let a = run(&ws, "sh-echo", json!({"n": 1})).await.unwrap();
    let b = run(&ws, "py-echo", json!({"n": 1})).await.unwrap();
    assert_eq!((a.outcome, &a.output), (b.outcome, &b.output));
    assert!(ws.runner().build("py-echo").is_ok());
}

#[tokio::test]
async fn a_handler_that_cannot_start_is_a_refusal_not_an_outcome() {
    let ws = Ws::new();
    ws.add(
        "x",
        &decl(
            "x",
            "1",
            "read_only",
            "5s",
            "command: no-such-program-here\n",
        ),
        &[],
    );
    let err = run(&ws, "x", json!({"n": 1})).await.unwrap_err();
    assert_eq!(err.code(), "spawn");
}

#[tokio::test]
async fn handlers_left_running_by_a_dead_invoker_are_stopped_from_their_records() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "long",
        "1",
        "read_only",
        "30s",
        &format!(
            "cat >/dev/null; echo $$ >> {}; sleep 30\n",
            marker.display()
        ),
    );
    let runner = ws.runner();
    let release = runner.release("long").unwrap();
    // An invocation whose invoker goes away without finishing (its task is aborted).
    let task = {
        let release = release.clone();
        let options = runner.options().clone();
        tokio::spawn(async move {
            let _ = invoke(
                &release,
                InvokeRequest {
                    input: json!({"n": 1}),
                    ..Default::default()
                },
                &options,
                &CancellationToken::new(),
            )
            .await;
        })
    };
    while !marker.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pgid: i32 = ws.marker_lines()[0].parse().unwrap();
    // As if this process had died before its guard started: the guard is gone first.
    let guard = guard_of(pgid).expect("the handler has a guard");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guard),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    task.abort();
    assert!(!group_members(pgid).is_empty());
    // Its invoker (this process) still lives: not an orphan, left alone.
    assert_eq!(runnable::stop_orphans(&release.running_dir()), 0);
    assert!(!group_members(pgid).is_empty());
    // Make the record name an invoker that no longer exists (as after a SIGKILL).
    let record = std::fs::read_dir(release.running_dir())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    doc["invoker"]["start_time"] = json!(1);
    std::fs::write(&record, serde_json::to_vec(&doc).unwrap()).unwrap();
    let stopped = runnable::stop_orphans(&release.running_dir());
    assert_eq!(stopped, 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !group_members(pgid).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the orphan group was not stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- dependencies -------------------------------------------------------------------------

fn flow_ws() -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.root.join("flow.yaml"),
        "name: shopflow\nservices:\n  - name: db\n    command: sleep\n    args: [1000]\n    endpoints:\n      - {name: pg, api: tcp, port: 15432}\n      - {name: web, api: http}\n",
    )
    .unwrap();
    ws
}

#[test]
fn show_reports_each_dependency_resolved_or_not_matching_endpoints_by_name() {
    let ws = flow_ws();
    ws.add(
        "x",
        &(decl("x", "1", "read_only", "5s", "command: sh\n")
            + "dependencies:\n  - {service: db, endpoints: [pg, http]}\n  - {service: cache, endpoints: [redis]}\n"),
        &[],
    );
    let catalog = ws.runner().catalog().unwrap();
    let report = runnable::deps::report(&catalog.runnables[0], Some(&catalog.workspace.root));
    let got: Vec<(String, bool)> = report
        .iter()
        .map(|r| (format!("{}/{}", r.service, r.endpoint), r.resolved))
        .collect();
    assert_eq!(
        got,
        [
            ("db/pg".into(), true),
            ("db/http".into(), false),
            ("cache/redis".into(), false)
        ]
    );
    assert!(
        report[1].reason.as_ref().unwrap().contains("web"),
        "{report:?}"
    );
    assert!(
        report[2]
            .reason
            .as_ref()
            .unwrap()
            .contains("no service `cache`"),
        "{report:?}"
    );
    assert_eq!(report[0].env, "FLOW_DEP_DB_PG_ADDR");
}

#[test]
fn show_never_probes_a_dependency_it_reports() {
    // A live listener at the declared port: any probe of the dependency would be seen here.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let ws = Ws::new();
    std::fs::write(
        ws.root.join("flow.yaml"),
        format!(
            "name: shopflow\nservices:\n  - name: db\n    command: sleep\n    args: [1000]\n    endpoints:\n      - {{name: pg, api: tcp, port: {port}}}\n"
        ),
    )
    .expect("flow.yaml");
    ws.add(
        "x",
        &(decl("x", "1", "read_only", "5s", "command: sh\n")
            + "dependencies:\n  - {service: db, endpoints: [pg]}\n"),
        &[],
    );
    let before = hash_tree(&ws.root);
    let catalog = ws.runner().catalog().expect("catalog");
    let report = runnable::deps::report(&catalog.runnables[0], Some(&catalog.workspace.root));
    assert_eq!(report.len(), 1);
    assert!(report[0].resolved, "{report:?}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("show connected to the dependency from {peer}"),
        Err(e) => panic!("accept: {e}"),
    }
    // Nothing written, no flow state recorded (`.hostd/flow/` would show in the tree).
    assert_eq!(hash_tree(&ws.root), before, "show wrote into the workspace");
}

#[tokio::test]
async fn a_broken_release_beside_a_good_one_fails_the_lookup_instead_of_resolving_around_it() {
    let ws = Ws::new();
    let marker = ws.marker();
    ws.shell(
        "wc",
        "1.0.0",
        "read_only",
        "5s",
        &format!(
            "cat >/dev/null; echo ran >> {}; {OK_DOC}\n",
            marker.display()
        ),
    );
    ws.add("wc-2.0.0", "name: wc\nversion: 2.0.0\ninput: [\n", &[]);
    let p = load_problems(&ws);
    assert!(
        p.iter()
            .any(|p| p.file.ends_with("runnables/wc-2.0.0/runnable.yaml")),
        "{p:?}"
    );
    let err = run(&ws, "wc", json!({"n": 1}))
        .await
        .expect_err("the lookup must not pick the one good release");
    assert_eq!(err.code(), "invalid", "{err}");
    let err = run(&ws, "wc@1.0.0", json!({"n": 1}))
        .await
        .expect_err("not even by its exact version");
    assert_eq!(err.code(), "invalid", "{err}");
    assert!(ws.marker_lines().is_empty(), "a handler ran");
}

#[tokio::test]
async fn invoke_injects_a_fixed_port_and_refuses_a_dynamic_one_while_the_flow_is_down() {
    let ws = flow_ws();
    let marker = ws.marker();
    let yaml = decl("fixed", "1", "read_only", "5s", "command: ./run.sh\n")
        + "dependencies:\n  - {service: db, endpoints: [pg]}\n";
    ws.add(
        "fixed",
        &yaml,
        &[(
            "run.sh",
            &format!(
                "#!/bin/sh\ncat >/dev/null\necho \"$FLOW_DEP_DB_PG_ADDR\" >> {}\n{OK_DOC}\n",
                marker.display()
            ),
            true,
        )],
    );
    let inv = run(&ws, "fixed", json!({"n": 1})).await.unwrap();
    assert_eq!(inv.outcome, OutcomeClass::Succeeded);
    assert_eq!(ws.marker_lines(), ["127.0.0.1:15432"]);

    let yaml = decl("dynamic", "1", "read_only", "5s", "command: ./run.sh\n")
        + "dependencies:\n  - {service: db, endpoints: [web]}\n";
    ws.add(
        "dynamic",
        &yaml,
        &[(
            "run.sh",
            &format!("#!/bin/sh\necho ran >> {}\n", marker.display()),
            true,
        )],
    );
    let err = run(&ws, "dynamic", json!({"n": 1})).await.unwrap_err();
    assert_eq!(err.code(), "unresolved_dependency");
    assert!(
        err.to_string().contains("hostd flow up") && err.to_string().contains("db"),
        "{err}"
    );
    assert_eq!(ws.marker_lines().len(), 1, "the handler never started");
}

// ---- tools --------------------------------------------------------------------------------

#[tokio::test]
async fn a_runnable_tool_offers_the_shows_input_schema_and_its_effect_decides_approval_and_replay()
{
    use harness::tool::{CallContext, Tool};
    let ws = Ws::new();
    let marker = ws.marker();
    for effect in ["read_only", "idempotent", "effectful"] {
        ws.shell(
            &format!("t-{effect}"),
            "1",
            effect,
            "5s",
            &format!(
                "cat >/dev/null; echo \"$HOSTD_EFFECT_ID\" >> {}; {OK_DOC}\n",
                marker.display()
            ),
        );
    }
    let runner = ws.runner();
    let options = std::sync::Arc::new(runner.options().clone());
    let catalog = runner.catalog().unwrap();
    for decl in &catalog.runnables {
        let tool = RunnableTool::new(runner.release_of(decl).unwrap(), options.clone()).unwrap();
        let show = runnable::projection::show(decl, None, &catalog.workspace.root, &[]);
        assert_eq!(tool.spec().parameters, show["contract"]["input"]);
        assert_eq!(tool.spec().name, decl.identity.name);
        let effectful = decl.effect.as_str() == "effectful";
        assert_eq!(tool.needs_approval(), effectful);
        assert_eq!(tool.replay_safe(), !effectful);
    }
    let tool = RunnableTool::new(runner.release("t-idempotent").unwrap(), options.clone()).unwrap();
    let ctx = CallContext {
        turn_id: "turn-1".into(),
        step: 1,
        call_id: "call-1".into(),
    };
    let first = tool.call_in(&ctx, json!({"n": 1})).await.unwrap();
    assert!(first.contains("succeeded"), "{first}");
    tool.call_in(&ctx, json!({"n": 1})).await.unwrap();
    let other = CallContext {
        step: 2,
        ..ctx.clone()
    };
    tool.call_in(&other, json!({"n": 1})).await.unwrap();
    let lines = ws.marker_lines();
    assert_eq!(
        lines[0], lines[1],
        "a re-run of one call carries the same effect id"
    );
    assert_ne!(lines[1], lines[2], "another call gets another");
    // Bad input reaches the model as a refusal that ran nothing.
    let refused = tool.call_in(&ctx, json!({"n": "x"})).await.unwrap_err();
    assert!(
        refused.0.contains("invalid_input") && refused.0.contains("\"ran\":false"),
        "{}",
        refused.0
    );
}

#[tokio::test]
async fn an_uncertain_tool_outcome_reaches_the_model_as_unknown() {
    use harness::tool::Tool;
    let ws = Ws::new();
    ws.shell("boom", "1", "read_only", "5s", "cat >/dev/null; exit 9\n");
    let runner = ws.runner();
    let tool = RunnableTool::new(
        runner.release("boom").unwrap(),
        std::sync::Arc::new(runner.options().clone()),
    )
    .unwrap();
    let err = tool.call(json!({"n": 1})).await.unwrap_err();
    assert!(
        err.0.contains("\"effect\":\"unknown\"") && err.0.contains("crashed"),
        "{}",
        err.0
    );
}
