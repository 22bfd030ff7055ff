//! The workspace format and the dependency model: every manifest refusal names the file,
//! the service and the reason; stage graphs, phases, restriction, external, completion and
//! reference semantics.

mod common;

use common::TempWorkspace;
use flow::{
    DependencyGraph, DependencyKind, EdgeOrigin, GraphError, ManifestError, Phase, Stage, Workspace,
};

fn refusal(files: &[(&str, &str)]) -> (TempWorkspace, ManifestError) {
    let ws = TempWorkspace::new(files);
    let err = Workspace::load(ws.root()).expect_err("the workspace must be refused");
    (ws, err)
}

fn assert_refused(
    err: &ManifestError,
    ws: &TempWorkspace,
    file: &str,
    service: Option<&str>,
    code: &str,
    says: &str,
) {
    assert_eq!(err.code(), code, "{err}");
    assert_eq!(err.file, ws.path(file), "{err}");
    assert_eq!(err.service.as_deref(), service, "{err}");
    let text = err.to_string();
    assert!(text.contains(says), "`{text}` does not say `{says}`");
    assert!(text.contains(file), "`{text}` does not name the file");
    if let Some(s) = service {
        assert!(
            text.contains(&format!("service `{s}`")),
            "`{text}` does not name the service"
        );
    }
}

#[test]
fn an_unknown_key_in_flow_yaml_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "name: x\nservise: []\nservices:\n  - name: a\n    command: true\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        None,
        "flow.manifest.unknown_key",
        "unknown key `servise`",
    );
}

#[test]
fn an_unknown_api_restart_policy_or_dependency_kind_is_refused_listing_every_accepted_text() {
    let cases = [
        (
            "    endpoints:\n      - {name: web, api: udp}\n",
            "`udp` on endpoint `web` is not one of tcp, http, grpc",
        ),
        (
            "    restart: {policy: sometimes}\n",
            "`sometimes` is not one of no, on-failure, always",
        ),
        (
            "    restart: {policy: 3}\n",
            "`restart.policy`: must be one of no, on-failure, always",
        ),
        (
            "    dependencies:\n      - {name: b, kind: legacy}\n",
            "`legacy` on the dependency on `b` is not one of build, schema, runtime, completion, external (or absent for legacy)",
        ),
    ];
    for (block, says) in cases {
        let (ws, err) = refusal(&[(
            "flow.yaml",
            &format!(
                "services:\n  - name: a\n    command: true\n{block}  - name: b\n    command: true\n"
            ),
        )]);
        assert_refused(
            &err,
            &ws,
            "flow.yaml",
            Some("a"),
            "flow.manifest.invalid_value",
            says,
        );
    }
}

#[test]
fn an_unknown_key_in_a_service_manifest_file_is_refused_naming_that_file() {
    let (ws, err) = refusal(&[
        ("flow.yaml", "services:\n  - name: api\n"),
        ("services/api/service.yaml", "command: true\ncomand: oops\n"),
    ]);
    assert_refused(
        &err,
        &ws,
        "services/api/service.yaml",
        Some("api"),
        "flow.manifest.unknown_key",
        "unknown key `comand`",
    );
}

#[test]
fn an_unknown_key_in_an_endpoint_or_restart_block_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    endpoints:\n      - {name: http, api: http, helth: /h}\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.unknown_key",
        "unknown key `helth` in endpoints entry #1",
    );
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    restart: {policy: always, retries: 3}\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.unknown_key",
        "unknown key `retries` in restart",
    );
}

#[test]
fn a_service_declared_twice_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n  - name: a\n    command: false\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.duplicate_service",
        "entries #1 and #2",
    );
}

#[test]
fn a_service_declared_inline_and_in_its_own_file_is_refused() {
    let (ws, err) = refusal(&[
        ("flow.yaml", "services:\n  - name: a\n    command: true\n"),
        ("services/a/service.yaml", "command: true\n"),
    ]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.duplicate_service",
        "inline in flow.yaml and in",
    );
}

#[test]
fn a_duplicate_yaml_key_is_refused_as_a_syntax_error() {
    let (ws, err) = refusal(&[
        ("flow.yaml", "services:\n  - name: a\n"),
        ("services/a/service.yaml", "command: true\ncommand: false\n"),
    ]);
    assert_refused(
        &err,
        &ws,
        "services/a/service.yaml",
        Some("a"),
        "flow.manifest.syntax",
        "duplicate",
    );
}

#[test]
fn a_missing_service_manifest_file_is_refused_naming_the_expected_path() {
    let (ws, err) = refusal(&[("flow.yaml", "services:\n  - name: ghost\n")]);
    assert_refused(
        &err,
        &ws,
        "services/ghost/service.yaml",
        Some("ghost"),
        "flow.manifest.unreadable",
        "cannot read",
    );
}

#[test]
fn a_dangling_dependency_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    dependencies:\n      - {name: nowhere, kind: runtime}\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.dangling_dependency",
        "`nowhere`",
    );
}

#[test]
fn an_external_dependency_may_name_something_outside_the_workspace() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    dependencies:\n      - {name: stripe, kind: external}\n",
    )]);
    Workspace::load(ws.root()).unwrap();
}

#[test]
fn a_completion_edge_naming_endpoints_is_refused() {
    let (ws, err) = refusal(&[
        ("flow.yaml", "services:\n  - name: migrate\n  - name: api\n"),
        (
            "services/migrate/service.yaml",
            "command: true\nendpoints:\n  - {name: admin, api: tcp}\n",
        ),
        (
            "services/api/service.yaml",
            "command: true\ndependencies:\n  - name: migrate\n    kind: completion\n    endpoints: [admin]\n",
        ),
    ]);
    assert_refused(
        &err,
        &ws,
        "services/api/service.yaml",
        Some("api"),
        "flow.manifest.completion_with_endpoints",
        "may not name endpoints",
    );
}

#[test]
fn a_runtime_edge_onto_a_producer_without_endpoints_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: job\n    command: true\n  - name: api\n    command: true\n    dependencies:\n      - {name: job, kind: runtime}\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("api"),
        "flow.manifest.runtime_without_endpoints",
        "would wait forever",
    );
}

#[test]
fn a_legacy_edge_onto_a_producer_without_endpoints_stays_valid() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: job\n    command: true\n  - name: api\n    command: true\n    dependencies:\n      - {name: job}\n",
    )]);
    Workspace::load(ws.root()).unwrap();
}

#[test]
fn a_dependency_naming_an_undeclared_endpoint_is_refused_for_every_kind() {
    for kind in ["runtime", "build", "schema", "external"] {
        let (ws, err) = refusal(&[(
            "flow.yaml",
            &format!(
                "services:\n  - name: db\n    command: true\n    endpoints: [{{name: pg, api: tcp}}]\n  - name: api\n    command: true\n    dependencies:\n      - {{name: db, kind: {kind}, endpoints: [postgres]}}\n"
            ),
        )]);
        assert_refused(
            &err,
            &ws,
            "flow.yaml",
            Some("api"),
            "flow.manifest.undeclared_endpoint",
            "endpoint `postgres` of `db`",
        );
    }
}

#[test]
fn an_endpoint_reference_to_an_undeclared_endpoint_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: db\n    command: true\n    endpoints: [{name: pg, api: tcp}]\n  - name: api\n    command: true\n    env:\n      DB: \"postgres://${endpoint:db/postgres}/app\"\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("api"),
        "flow.manifest.undeclared_endpoint",
        "endpoint `postgres` of `db`",
    );
}

#[test]
fn a_malformed_endpoint_reference_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: api\n    command: true\n    env:\n      DB: \"${endpoint:db}\"\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("api"),
        "flow.manifest.malformed_reference",
        "${endpoint:db}",
    );
}

#[test]
fn an_unknown_kind_api_or_policy_is_refused_with_the_allowed_values() {
    let cases = [
        (
            "dependencies:\n      - {name: b, kind: sometimes}",
            "not one of build, schema, runtime, completion, external",
        ),
        (
            "endpoints: [{name: e, api: websocket}]",
            "not one of tcp, http, grpc",
        ),
        (
            "restart: {policy: sometimes}",
            "not one of no, on-failure, always",
        ),
        (
            "restart: {policy: on-failure, window: soon}",
            "not a duration",
        ),
        (
            "endpoints: [{name: e, api: tcp, health: /h}]",
            "a path for http and a service name for grpc",
        ),
        (
            "endpoints: [{name: e, api: grpc, health: /shop.Orders}]",
            "not a gRPC service name",
        ),
        (
            "endpoints: [{name: e, api: http, health: h}]",
            "must be an absolute path",
        ),
        (
            "endpoints: [{name: e, api: tcp, port: 70000}]",
            "not a port",
        ),
    ];
    for (block, says) in cases {
        let (ws, err) = refusal(&[(
            "flow.yaml",
            &format!(
                "services:\n  - name: b\n    command: true\n  - name: a\n    command: true\n    {block}\n"
            ),
        )]);
        assert_refused(
            &err,
            &ws,
            "flow.yaml",
            Some("a"),
            "flow.manifest.invalid_value",
            says,
        );
    }
}

#[test]
fn a_fixed_port_used_twice_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    endpoints: [{name: e, api: tcp, port: 4100}]\n  - name: b\n    command: true\n    endpoints: [{name: f, api: tcp, port: 4100}]\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("b"),
        "flow.manifest.duplicate_port",
        "port 4100 is fixed by both `a/e` and `b/f`",
    );
}

#[test]
fn a_producer_waited_on_both_as_a_job_and_as_a_service_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: m\n    command: true\n    endpoints: [{name: e, api: tcp}]\n  - name: a\n    command: true\n    dependencies: [{name: m, kind: completion}]\n  - name: b\n    command: true\n    dependencies: [{name: m, kind: runtime}]\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("b"),
        "flow.manifest.job_and_service",
        "cannot be both",
    );
}

#[test]
fn a_job_with_restart_policy_always_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: m\n    command: true\n    restart: {policy: always}\n  - name: a\n    command: true\n    dependencies: [{name: m, kind: completion}]\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("m"),
        "flow.manifest.always_restarted_job",
        "forever",
    );
}

#[test]
fn a_self_dependency_is_refused() {
    let (ws, err) = refusal(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    endpoints: [{name: e, api: tcp}]\n    dependencies: [{name: a, kind: runtime}]\n",
    )]);
    assert_refused(
        &err,
        &ws,
        "flow.yaml",
        Some("a"),
        "flow.manifest.self_dependency",
        "depends on itself",
    );
}

/// The legitimate two-stage relationship: the API talks to the database at run time, and
/// the database reads the API's contract at build time.
fn two_stage_workspace() -> TempWorkspace {
    TempWorkspace::new(&[
        (
            "flow.yaml",
            "services:\n  - name: api\n  - name: database\n",
        ),
        (
            "services/api/service.yaml",
            "command: true\ndependencies:\n  - name: database\n    kind: runtime\n    endpoints:\n      - name: postgres\nendpoints:\n  - {name: grpc, api: grpc}\n",
        ),
        (
            "services/database/service.yaml",
            "command: true\ndependencies:\n  - name: api\n    kind: schema\n    endpoints: [grpc]\nendpoints:\n  - {name: postgres, api: tcp}\n",
        ),
    ])
}

#[test]
fn a_cycle_across_the_two_stages_is_legitimate_and_each_stage_orders_it_its_own_way() {
    let ws = two_stage_workspace();
    let graph = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap();
    assert_eq!(
        graph.stage(Stage::Run).order().unwrap(),
        vec!["database", "api"]
    );
    assert_eq!(
        graph.stage(Stage::Build).order().unwrap(),
        vec!["api", "database"]
    );
}

#[test]
fn a_same_stage_cycle_fails_naming_the_stage_and_the_path() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    endpoints: [{name: e, api: tcp}]\n    dependencies: [{name: b, kind: runtime}]\n  - name: b\n    command: true\n    endpoints: [{name: e, api: tcp}]\n    dependencies: [{name: a, kind: runtime}]\n",
    )]);
    let err = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap_err();
    assert_eq!(err.code(), "flow.graph.cycle");
    assert_eq!(
        err.to_string(),
        "run dependencies have a cycle: a -> b -> a"
    );
}

#[test]
fn a_legacy_edge_joins_both_stages_so_it_closes_a_build_cycle() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: a\n    command: true\n    dependencies: [{name: b}]\n  - name: b\n    command: true\n    dependencies: [{name: a, kind: build}]\n",
    )]);
    let err = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "build dependencies have a cycle: a -> b -> a"
    );
}

#[test]
fn phases_decompose_into_ordered_stages_and_unknown_names_are_errors() {
    let ws = two_stage_workspace();
    let graph = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap();
    let stages = |p: Phase| {
        graph
            .order_for(p)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect::<Vec<_>>()
    };
    assert_eq!(stages(Phase::Build), vec![Stage::Build]);
    assert_eq!(stages(Phase::Run), vec![Stage::Run]);
    assert_eq!(stages(Phase::Test), vec![Stage::Build, Stage::Run]);
    assert_eq!(stages(Phase::Deploy), vec![Stage::Build, Stage::Run]);
    let test = graph.order_for_name("test").unwrap();
    assert_eq!(
        test[0].1,
        vec![vec!["api".to_string()], vec!["database".to_string()]]
    );
    assert_eq!(
        test[1].1,
        vec![vec!["database".to_string()], vec!["api".to_string()]]
    );
    assert_eq!(
        graph.order_for_name("lint").unwrap_err(),
        GraphError::UnknownPhase("lint".into())
    );
    assert_eq!(
        graph.for_stage("runtime").unwrap_err(),
        GraphError::UnknownStage("runtime".into())
    );
    assert_eq!(graph.for_stage("build").unwrap().stage(), Stage::Build);
}

fn worker_workspace() -> TempWorkspace {
    TempWorkspace::new(&[(
        "flow.yaml",
        "services:
  - name: migration
    command: true
  - name: api
    command: true
    endpoints: [{name: grpc, api: grpc}]
  - name: unrelated
    command: true
  - name: worker
    command: true
    dependencies:
      - {name: migration, kind: completion}
      - {name: api, kind: build, endpoints: [grpc]}
      - {name: stripe, kind: external}
",
    )])
}

#[test]
fn restriction_to_a_target_keeps_edge_kinds_and_forgets_removed_services() {
    let ws = worker_workspace();
    let graph = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap();
    let only = graph.restrict_to("worker").unwrap();
    let run = only.stage(Stage::Run);
    assert_eq!(
        run.nodes(),
        &["migration".to_string(), "worker".to_string()]
    );
    assert_eq!(run.edges().len(), 1);
    assert_eq!(run.edges()[0].kind, DependencyKind::Completion);
    let build = only.stage(Stage::Build);
    assert_eq!(build.nodes(), &["api".to_string(), "worker".to_string()]);
    assert_eq!(build.edges()[0].kind, DependencyKind::Build);
    assert!(!run.contains("unrelated") && !run.contains("api"));
    assert_eq!(
        run.restrict_to(&["api"]).unwrap_err(),
        GraphError::UnknownService("api".into()),
        "a removed service cannot be resolved through the restricted graph"
    );
    assert_eq!(
        graph.restrict_to("nobody").unwrap_err(),
        GraphError::UnknownService("nobody".into())
    );
}

#[test]
fn an_external_edge_is_in_no_stage_and_never_pulls_its_producer_in() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: cache\n    command: true\n    endpoints: [{name: e, api: tcp}]\n  - name: app\n    command: true\n    dependencies: [{name: cache, kind: external}]\n",
    )]);
    let graph = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap();
    assert!(graph.stage(Stage::Run).edges().is_empty());
    assert!(graph.stage(Stage::Build).edges().is_empty());
    assert_eq!(graph.external_edges().len(), 1);
    // The producer is still a service of the workspace and runs when the whole flow runs…
    assert_eq!(
        graph.stage(Stage::Run).layers().unwrap(),
        vec![vec!["cache".to_string(), "app".into()]]
    );
    // …but the consumer alone does not pull it in.
    assert_eq!(
        graph.restrict_to("app").unwrap().stage(Stage::Run).nodes(),
        &["app".to_string()]
    );
}

#[test]
fn an_endpoint_reference_adds_a_runtime_edge_and_supersedes_an_external_declaration() {
    let ws = TempWorkspace::new(&[(
        "flow.yaml",
        "services:\n  - name: cache\n    command: true\n    endpoints: [{name: e, api: tcp}]\n  - name: app\n    command: true\n    dependencies: [{name: cache, kind: external}]\n    env:\n      CACHE: \"redis://${endpoint:cache/e}\"\n",
    )]);
    let graph = DependencyGraph::from_workspace(&Workspace::load(ws.root()).unwrap()).unwrap();
    let run = graph.stage(Stage::Run);
    assert_eq!(run.edges().len(), 1);
    let edge = &run.edges()[0];
    assert_eq!(
        (edge.consumer.as_str(), edge.producer.as_str()),
        ("app", "cache")
    );
    assert_eq!(edge.kind, DependencyKind::Runtime);
    assert_eq!(edge.endpoints, vec!["e".to_string()]);
    assert_eq!(
        edge.origin,
        EdgeOrigin::Reference {
            key: "CACHE".into()
        }
    );
    assert_eq!(graph.superseded().len(), 1);
    assert_eq!(
        run.layers().unwrap(),
        vec![vec!["cache".to_string()], vec!["app".into()]]
    );
    assert_eq!(
        graph
            .restrict_to("app")
            .unwrap()
            .stage(Stage::Run)
            .nodes()
            .len(),
        2
    );
}

#[test]
fn kinds_say_which_stages_they_constrain_and_what_they_consume_and_reach() {
    use DependencyKind::*;
    let table = [
        (Legacy, &[Stage::Build, Stage::Run][..], true, true),
        (Build, &[Stage::Build][..], true, false),
        (Schema, &[Stage::Build][..], true, false),
        (Runtime, &[Stage::Run][..], true, true),
        (Completion, &[Stage::Run][..], false, false),
        (External, &[][..], false, false),
    ];
    for (kind, stages, consumes, reaches) in table {
        assert_eq!(kind.stages(), stages, "{kind}");
        assert_eq!(kind.consumes_endpoints(), consumes, "{kind}");
        assert_eq!(kind.reaches_endpoints(), reaches, "{kind}");
    }
}
