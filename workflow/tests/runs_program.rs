//! Program validation: every problem at once, each with its step, position and stable code.

mod runs_support;

use runs_support::World;
use serde_json::json;
use workflow::program::{codes, parse, render};

fn problems(source: &str) -> Vec<(String, Option<String>, usize)> {
    let world = World::new();
    match parse(source, world.as_ref()) {
        Ok(_) => Vec::new(),
        Err(list) => list.into_iter().map(|p| (p.code, p.step, p.line)).collect(),
    }
}

fn codes_of(source: &str) -> Vec<String> {
    problems(source).into_iter().map(|(c, _, _)| c).collect()
}

#[test]
fn three_independent_problems_are_reported_together_with_step_and_line() {
    let source = "\
steps:
  - name: count
    invoke: nosuch@1.0.0
  - name: count
    sleep: 1s
  - name: nap
    sleep: soon
";
    let found = problems(source);
    assert_eq!(
        found,
        vec![
            (
                codes::UNKNOWN_RUNNABLE.to_owned(),
                Some("count".to_owned()),
                3
            ),
            (
                codes::DUPLICATE_STEP.to_owned(),
                Some("count".to_owned()),
                4
            ),
            (codes::DURATION.to_owned(), Some("nap".to_owned()), 7),
        ]
    );
}

#[test]
fn a_bare_name_with_two_versions_is_refused_listing_both() {
    let world = World::new();
    let err = parse(
        "steps:\n  - name: c\n    invoke: word-count\n",
        world.as_ref(),
    )
    .unwrap_err();
    assert_eq!(err.len(), 1);
    assert_eq!(err[0].code, codes::AMBIGUOUS_RUNNABLE);
    assert!(
        err[0].message.contains("shop/word-count@1.0.0"),
        "{}",
        err[0].message
    );
    assert!(
        err[0].message.contains("shop/word-count@2.0.0"),
        "{}",
        err[0].message
    );
}

#[test]
fn the_program_shape_problems_each_have_a_code() {
    assert_eq!(codes_of("steps: [\n"), [codes::SYNTAX]);
    assert_eq!(codes_of("steps: []\n"), [codes::NO_STEPS]);
    assert_eq!(
        codes_of("stepz: []\n"),
        [codes::UNKNOWN_KEY, codes::MISSING_KEY]
    );
    assert_eq!(codes_of("steps:\n  - sleep: 1s\n"), [codes::MISSING_KEY]);
    assert_eq!(codes_of("steps:\n  - name: a\n"), [codes::STEP_KIND]);
    assert_eq!(
        codes_of("steps:\n  - name: a\n    sleep: 1s\n    ask: q\n    answer: {type: string}\n"),
        [codes::STEP_KIND]
    );
    assert_eq!(
        codes_of("steps:\n  - name: a\n    sleep: 1s\n    colour: red\n"),
        [codes::UNKNOWN_KEY]
    );
    assert_eq!(
        codes_of("steps:\n  - name: A b\n    sleep: 1s\n"),
        [codes::STEP_NAME]
    );
}

#[test]
fn a_template_may_read_only_earlier_steps() {
    let source = "\
steps:
  - name: first
    invoke: read@1.0.0
    input: {a: \"${steps.second.x}\", b: \"${steps.nosuch}\", c: \"${steps.first}\", d: \"${nothing}\"}
  - name: second
    invoke: read@1.0.0
    input: {a: \"${steps.first.x}\", b: \"${input.y}\"}
";
    assert_eq!(
        codes_of(source),
        [
            codes::TEMPLATE,
            codes::TEMPLATE,
            codes::TEMPLATE,
            codes::TEMPLATE
        ]
    );
}

#[test]
fn an_answer_schema_outside_the_profile_is_a_problem() {
    let source = "steps:\n  - name: q\n    ask: which?\n    answer: {oneOf: [{type: string}]}\n";
    let found = codes_of(source);
    assert!(!found.is_empty());
    assert!(found.iter().all(|c| c == codes::ANSWER_SCHEMA), "{found:?}");
    assert_eq!(
        codes_of("steps:\n  - name: q\n    ask: which?\n"),
        [codes::MISSING_KEY]
    );
}

#[test]
fn a_sleep_must_be_a_non_negative_duration() {
    assert_eq!(
        codes_of("steps:\n  - name: a\n    sleep: soon\n"),
        [codes::DURATION]
    );
    assert_eq!(
        codes_of("steps:\n  - name: a\n    sleep: -5s\n"),
        [codes::DURATION]
    );
    assert_eq!(
        codes_of("steps:\n  - name: a\n    sleep: [1]\n"),
        [codes::DURATION]
    );
    assert!(codes_of("steps:\n  - name: a\n    sleep: 0s\n").is_empty());
}

#[test]
fn an_agent_step_needs_a_known_agent_and_a_prompt() {
    assert_eq!(
        codes_of("steps:\n  - name: a\n    agent: nosuch\n    prompt: hi\n"),
        [codes::UNKNOWN_AGENT]
    );
    assert_eq!(
        codes_of("steps:\n  - name: a\n    agent: echo\n"),
        [codes::MISSING_KEY]
    );
}

#[test]
fn supervise_is_parsed_strictly_and_refused_where_a_rerun_means_nothing() {
    let source = "\
steps:
  - name: a
    invoke: read@1.0.0
    supervise: {restarts: \"2\"}
  - name: b
    invoke: read@1.0.0
    supervise: {restarts: -1}
  - name: c
    invoke: read@1.0.0
    supervise: {restarts: 1, windw: 1m}
  - name: d
    ask: ok?
    answer: {type: boolean}
    supervise: {restarts: 1}
";
    assert_eq!(
        codes_of(source),
        [
            codes::SUPERVISE,
            codes::SUPERVISE,
            codes::SUPERVISE,
            codes::SUPERVISE_UNSUPPORTED
        ]
    );
}

#[test]
fn a_problem_carries_no_source_text() {
    let filler = "x".repeat(10_000);
    let source = format!("# {filler}\nsteps:\n  - name: a\n    sleep: soon\n");
    let world = World::new();
    let err = parse(&source, world.as_ref()).unwrap_err();
    let json = serde_json::to_string(&err).unwrap();
    assert!(json.len() < 400, "{json}");
}

#[test]
fn a_template_takes_whole_values_and_splices_text() {
    let mut outputs = std::collections::HashMap::new();
    outputs.insert("count".to_owned(), json!({"words": 3, "list": ["a", "b"]}));
    let input = json!({"name": "bob"});
    let t = json!({"n": "${steps.count.words}", "s": "hi ${input.name}, ${steps.count.words} words", "first": "${steps.count.list.0}"});
    assert_eq!(
        render(&t, &input, &outputs).unwrap(),
        json!({"n": 3, "s": "hi bob, 3 words", "first": "a"})
    );
    assert!(render(&json!("${steps.count.nope}"), &input, &outputs).is_err());
}
