use std::time::Duration;

use futures::StreamExt;
use harness::model::{
    ChatMessage, FinishReason, Model, ModelError, ModelEvent, ModelRequest, ScriptedModel, ToolCall,
};
use serde_json::json;

fn user(text: &str) -> ChatMessage {
    ChatMessage::User { text: text.into() }
}

fn tool_result(name: &str, content: &str) -> ChatMessage {
    ChatMessage::Tool {
        call_id: "call-1".into(),
        name: name.into(),
        content: content.into(),
    }
}

fn request(messages: Vec<ChatMessage>) -> ModelRequest {
    ModelRequest {
        messages,
        tools: Vec::new(),
    }
}

async fn run(
    model: &ScriptedModel,
    messages: Vec<ChatMessage>,
) -> Vec<Result<ModelEvent, ModelError>> {
    model
        .stream(request(messages))
        .await
        .expect("scripted stream starts")
        .collect()
        .await
}

fn deltas(events: &[Result<ModelEvent, ModelError>]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(ModelEvent::TextDelta(t)) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn plain_text_is_echoed_in_word_deltas_that_concatenate_exactly() {
    let text = "  hello   big\tworld \n";
    let events = run(&ScriptedModel::new(), vec![user(text)]).await;
    let parts = deltas(&events);
    assert_eq!(
        parts,
        vec!["You ", "said:   ", "hello   ", "big\t", "world \n"]
    );
    assert_eq!(parts.concat(), format!("You said: {text}"));
    assert_eq!(
        events.last(),
        Some(&Ok(ModelEvent::Finished(FinishReason::Stop)))
    );
    assert_eq!(events.len(), parts.len() + 1);
}

#[tokio::test]
async fn no_user_message_replies_hello_and_stops() {
    let events = run(
        &ScriptedModel::new(),
        vec![ChatMessage::System {
            text: "/tool x {}".into(),
        }],
    )
    .await;
    assert_eq!(deltas(&events).concat(), "Hello.");
    assert_eq!(
        events.last(),
        Some(&Ok(ModelEvent::Finished(FinishReason::Stop)))
    );
}

#[tokio::test]
async fn only_the_last_user_message_decides_the_step() {
    let events = run(
        &ScriptedModel::new(),
        vec![user("/fail no"), user("second")],
    )
    .await;
    assert_eq!(deltas(&events).concat(), "You said: second");
}

#[tokio::test]
async fn tool_command_emits_one_call_with_parsed_arguments_and_finishes_with_tool_calls() {
    let events = run(
        &ScriptedModel::new(),
        vec![user(r#"/tool read_file {"path": "a b.txt", "n": [1, 2]}"#)],
    )
    .await;
    assert_eq!(
        events,
        vec![
            Ok(ModelEvent::ToolCall(ToolCall::new(
                "call-1",
                "read_file",
                json!({"path": "a b.txt", "n": [1, 2]})
            ))),
            Ok(ModelEvent::Finished(FinishReason::ToolCalls)),
        ]
    );
}

#[tokio::test]
async fn tool_command_with_invalid_json_yields_a_protocol_error() {
    let events = run(
        &ScriptedModel::new(),
        vec![user("/tool read_file {not json")],
    )
    .await;
    assert_eq!(events.len(), 1);
    assert!(
        matches!(&events[0], Err(ModelError::Protocol(m)) if m.contains("not valid JSON")),
        "{events:?}"
    );
}

#[tokio::test]
async fn tool_command_without_arguments_passes_an_empty_object() {
    let events = run(&ScriptedModel::new(), vec![user("/tool now")]).await;
    assert_eq!(
        events[0],
        Ok(ModelEvent::ToolCall(ToolCall::new(
            "call-1",
            "now",
            json!({})
        )))
    );
}

#[tokio::test]
async fn ask_command_calls_ask_user_with_the_question() {
    let events = run(&ScriptedModel::new(), vec![user("/ask What is your name?")]).await;
    assert_eq!(
        events,
        vec![
            Ok(ModelEvent::ToolCall(ToolCall::new(
                "call-1",
                "ask_user",
                json!({"question": "What is your name?"})
            ))),
            Ok(ModelEvent::Finished(FinishReason::ToolCalls)),
        ]
    );
}

#[tokio::test]
async fn fail_command_streams_working_then_yields_the_scripted_error() {
    let events = run(&ScriptedModel::new(), vec![user("/fail disk on fire")]).await;
    assert_eq!(
        events,
        vec![
            Ok(ModelEvent::TextDelta("Working".into())),
            Ok(ModelEvent::TextDelta("...".into())),
            Err(ModelError::Scripted("disk on fire".into())),
        ]
    );
}

#[tokio::test]
async fn a_tool_result_after_the_user_message_is_reported_and_the_step_stops() {
    let events = run(
        &ScriptedModel::new(),
        vec![
            user("/tool clock {}"),
            ChatMessage::Assistant {
                text: String::new(),
                tool_calls: vec![],
            },
            tool_result("clock", "12:00"),
        ],
    )
    .await;
    assert_eq!(deltas(&events).concat(), "Tool clock returned: 12:00");
    assert_eq!(
        events.last(),
        Some(&Ok(ModelEvent::Finished(FinishReason::Stop)))
    );
}

#[tokio::test]
async fn with_several_tool_results_the_reply_is_about_the_last_one() {
    let events = run(
        &ScriptedModel::new(),
        vec![
            tool_result("early", "ignored"),
            user("/tool a {}"),
            tool_result("first", "one"),
            tool_result("second", "two words"),
        ],
    )
    .await;
    assert_eq!(deltas(&events).concat(), "Tool second returned: two words");
}

#[tokio::test]
async fn a_tool_result_before_the_last_user_message_is_ignored() {
    let events = run(
        &ScriptedModel::new(),
        vec![user("/tool a {}"), tool_result("a", "x"), user("thanks")],
    )
    .await;
    assert_eq!(deltas(&events).concat(), "You said: thanks");
}

#[tokio::test]
async fn slow_command_streams_words_with_the_given_delay_between_deltas() {
    tokio::time::pause();
    let model = ScriptedModel::new();
    let start = tokio::time::Instant::now();
    let mut stream = model
        .stream(request(vec![user("/slow 250 one two  three")]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        seen.push((start.elapsed(), event));
    }
    let times: Vec<Duration> = seen.iter().map(|(t, _)| *t).collect();
    // The timer rounds each deadline up to the next millisecond tick.
    let near =
        |t: Duration, ms: u64| t >= Duration::from_millis(ms) && t < Duration::from_millis(ms + 5);
    assert_eq!(times.len(), 4, "{times:?}");
    assert!(near(times[0], 0) && near(times[1], 250), "{times:?}");
    assert!(near(times[2], 500) && near(times[3], 500), "{times:?}");
    assert_eq!(
        times[2], times[3],
        "Finished follows the last delta at once"
    );
    let events: Vec<_> = seen.into_iter().map(|(_, e)| e).collect();
    assert_eq!(deltas(&events), vec!["one ", "two  ", "three"]);
    assert_eq!(
        events.last(),
        Some(&Ok(ModelEvent::Finished(FinishReason::Stop)))
    );
}

#[tokio::test]
async fn slow_command_with_a_bad_delay_is_a_protocol_error() {
    let events = run(&ScriptedModel::new(), vec![user("/slow soon hi")]).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Protocol(_))]),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_builder_delay_is_slept_between_deltas() {
    let model = ScriptedModel::new().with_delta_delay(Duration::from_millis(40));
    let start = tokio::time::Instant::now();
    let events = run(&model, vec![user("a b")]).await;
    assert_eq!(deltas(&events).concat(), "You said: a b");
    // Four deltas, three gaps.
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(120) && elapsed < Duration::from_millis(130),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn the_same_request_always_gives_the_same_events() {
    let model = ScriptedModel::new();
    let conversations = vec![
        vec![user("hello there")],
        vec![user("/tool t {\"a\":1}")],
        vec![user("/ask why?")],
        vec![user("/fail x")],
        vec![user("/slow 0 a b")],
        vec![user("/tool t {}"), tool_result("t", "ok")],
        vec![],
    ];
    for messages in conversations {
        let first = run(&model, messages.clone()).await;
        let second = run(&model, messages.clone()).await;
        let other_instance = run(&ScriptedModel::new(), messages).await;
        assert_eq!(first, second);
        assert_eq!(first, other_instance);
    }
}

#[tokio::test]
async fn a_word_that_only_starts_like_a_command_is_echoed() {
    let events = run(&ScriptedModel::new(), vec![user("/toolbox open")]).await;
    assert_eq!(deltas(&events).concat(), "You said: /toolbox open");
}
