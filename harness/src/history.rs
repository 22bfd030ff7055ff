//! The conversation a model is sent, derived from a session's turns (each turn's part is a
//! [`TurnTranscript`], kept by the state's fold). Owns the rules that keep it acceptable to strict chat APIs and chat templates whatever the journal holds:
//!
//! - every tool call of an assistant message is answered by a tool message before anything
//!   else is said; a call the journal holds no result for gets one saying why there is none;
//! - a tool message answers a call of the assistant message just before it (any other is left
//!   out: it could only be a duplicate);
//! - user and assistant alternate: a turn that ended without the model's reply (it failed, or
//!   was interrupted) is closed by a short assistant note saying how it ended, so the next
//!   user message never follows a user message or a tool result directly.
//!
//! What it adds exists only in the request, is derived from the journal alone (a restored
//! session sends the same conversation) and also repairs journals written before these rules.
//! It never reads or writes the journal.

use crate::model::{ChatMessage, ToolCall};

/// How a turn ended, as far as the conversation needs to know.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum TurnEnd {
    Done,
    Failed { code: String },
    Interrupted { reason: String },
}

/// One turn's part of the conversation.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct TurnTranscript {
    pub turn_id: String,
    pub user: String,
    /// The committed steps and tool results, in journal order.
    pub messages: Vec<ChatMessage>,
    /// `None` while the turn is in flight.
    pub end: Option<TurnEnd>,
}

/// The conversation for the next model step: the system prompt, every turn made well-formed,
/// then `pending` (the text of an input whose turn is running but not journaled yet).
pub(crate) fn conversation<'a>(
    system: Option<&str>,
    turns: impl IntoIterator<Item = &'a TurnTranscript, IntoIter: ExactSizeIterator>,
    pending: Option<&str>,
) -> Vec<ChatMessage> {
    let turns = turns.into_iter();
    let mut out = Vec::new();
    if let Some(s) = system {
        out.push(ChatMessage::System { text: s.to_owned() });
    }
    let last = turns.len().saturating_sub(1);
    for (i, turn) in turns.enumerate() {
        // Only the last turn can be in flight; an earlier one without an end never finished.
        let closed = turn.end.is_some() || i < last;
        push_turn(&mut out, turn, closed);
    }
    if let Some(text) = pending {
        out.push(ChatMessage::User {
            text: text.to_owned(),
        });
    }
    out
}

fn push_turn(out: &mut Vec<ChatMessage>, turn: &TurnTranscript, closed: bool) {
    out.push(ChatMessage::User {
        text: turn.user.clone(),
    });
    // The calls of the latest assistant message still waiting for a result.
    let mut waiting: Vec<ToolCall> = Vec::new();
    let mut replied = false;
    for message in &turn.messages {
        match message {
            ChatMessage::Assistant { tool_calls, .. } => {
                answer_waiting(out, &mut waiting, turn.end.as_ref());
                out.push(message.clone());
                waiting = tool_calls.clone();
                replied = tool_calls.is_empty();
            }
            ChatMessage::Tool { call_id, .. } => {
                if let Some(at) = waiting.iter().position(|c| &c.id == call_id) {
                    waiting.remove(at);
                    out.push(message.clone());
                    replied = false;
                }
            }
            // A turn's transcript holds steps and results only.
            ChatMessage::System { .. } | ChatMessage::User { .. } => {}
        }
    }
    answer_waiting(out, &mut waiting, turn.end.as_ref());
    if closed && !replied {
        out.push(ChatMessage::Assistant {
            text: ending_note(turn.end.as_ref()),
            tool_calls: Vec::new(),
        });
    }
}

/// Gives every waiting call a result that says why it has none.
fn answer_waiting(out: &mut Vec<ChatMessage>, waiting: &mut Vec<ToolCall>, end: Option<&TurnEnd>) {
    for call in waiting.drain(..) {
        out.push(ChatMessage::Tool {
            call_id: call.id,
            name: call.name,
            content: format!("No result was recorded for this call: {}.", why(end)),
        });
    }
}

/// Why a turn has no result or no reply, in a few words.
fn why(end: Option<&TurnEnd>) -> String {
    match end {
        Some(TurnEnd::Interrupted { reason }) if reason == "interrupt" => {
            "the user interrupted the turn".into()
        }
        Some(TurnEnd::Interrupted { reason }) if reason == "restore" => {
            "the session restarted and did not finish the turn".into()
        }
        Some(TurnEnd::Interrupted { reason }) => format!("the turn was stopped ({reason})"),
        Some(TurnEnd::Failed { code }) => format!("the turn failed ({code} error)"),
        Some(TurnEnd::Done) | None => "the turn did not finish".into(),
    }
}

/// The assistant note that closes a turn without a reply.
fn ending_note(end: Option<&TurnEnd>) -> String {
    format!("[No reply: {}.]", why(end))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "f", json!({}))
    }

    fn step(calls: &[&str]) -> ChatMessage {
        ChatMessage::Assistant {
            text: String::new(),
            tool_calls: calls.iter().map(|id| call(id)).collect(),
        }
    }

    fn reply(text: &str) -> ChatMessage {
        ChatMessage::Assistant {
            text: text.into(),
            tool_calls: Vec::new(),
        }
    }

    fn result(id: &str) -> ChatMessage {
        ChatMessage::Tool {
            call_id: id.into(),
            name: "f".into(),
            content: "ok".into(),
        }
    }

    fn turn(user: &str, messages: Vec<ChatMessage>, end: Option<TurnEnd>) -> TurnTranscript {
        TurnTranscript {
            turn_id: format!("t-{user}"),
            user: user.into(),
            messages,
            end,
        }
    }

    /// The roles in order, with the call ids answered, as one line.
    fn shape(messages: &[ChatMessage]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m {
                ChatMessage::System { .. } => "system".to_string(),
                ChatMessage::User { .. } => "user".to_string(),
                ChatMessage::Assistant { tool_calls, .. } if tool_calls.is_empty() => {
                    "assistant".to_string()
                }
                ChatMessage::Assistant { tool_calls, .. } => format!(
                    "assistant({})",
                    tool_calls
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                ChatMessage::Tool { call_id, .. } => format!("tool({call_id})"),
            })
            .collect()
    }

    fn interrupted() -> Option<TurnEnd> {
        Some(TurnEnd::Interrupted {
            reason: "interrupt".into(),
        })
    }

    #[test]
    fn a_finished_turn_is_sent_as_it_was() {
        let turns = [turn(
            "a",
            vec![step(&["c1"]), result("c1"), reply("done")],
            Some(TurnEnd::Done),
        )];
        let out = conversation(Some("sys"), &turns, Some("b"));
        assert_eq!(
            shape(&out),
            [
                "system",
                "user",
                "assistant(c1)",
                "tool(c1)",
                "assistant",
                "user"
            ]
        );
    }

    #[test]
    fn calls_left_without_results_by_an_interrupt_are_answered_then_the_turn_is_closed() {
        let turns = [turn(
            "a",
            vec![step(&["c1", "c2", "c3"]), result("c2")],
            interrupted(),
        )];
        let out = conversation(None, &turns, Some("b"));
        assert_eq!(
            shape(&out),
            [
                "user",
                "assistant(c1,c2,c3)",
                "tool(c2)",
                "tool(c1)",
                "tool(c3)",
                "assistant",
                "user"
            ]
        );
        let ChatMessage::Tool { content, .. } = &out[3] else {
            panic!("{out:?}")
        };
        assert!(content.contains("interrupted"), "{content}");
    }

    #[test]
    fn a_failed_turn_without_a_reply_gets_a_note_so_two_user_messages_never_meet() {
        let turns = [
            turn(
                "a",
                vec![],
                Some(TurnEnd::Failed {
                    code: "provider".into(),
                }),
            ),
            turn("b", vec![reply("hi")], Some(TurnEnd::Done)),
        ];
        let out = conversation(None, &turns, None);
        assert_eq!(shape(&out), ["user", "assistant", "user", "assistant"]);
        let ChatMessage::Assistant { text, .. } = &out[1] else {
            panic!()
        };
        assert!(text.contains("provider"), "{text}");
    }

    #[test]
    fn a_result_for_no_waiting_call_is_left_out() {
        let turns = [turn(
            "a",
            vec![
                step(&["c1"]),
                result("c1"),
                result("c1"),
                result("zz"),
                reply("x"),
            ],
            Some(TurnEnd::Done),
        )];
        let out = conversation(None, &turns, None);
        assert_eq!(
            shape(&out),
            ["user", "assistant(c1)", "tool(c1)", "assistant"]
        );
    }

    #[test]
    fn an_unanswered_step_followed_by_another_step_is_answered_in_between() {
        let turns = [turn(
            "a",
            vec![step(&["c1"]), step(&["c2"]), result("c2"), reply("x")],
            Some(TurnEnd::Done),
        )];
        let out = conversation(None, &turns, None);
        assert_eq!(
            shape(&out),
            [
                "user",
                "assistant(c1)",
                "tool(c1)",
                "assistant(c2)",
                "tool(c2)",
                "assistant"
            ]
        );
    }

    #[test]
    fn the_turn_in_flight_is_not_closed() {
        let turns = [
            turn("a", vec![], interrupted()),
            turn("b", vec![step(&["c1"]), result("c1")], None),
        ];
        let out = conversation(None, &turns, None);
        assert_eq!(
            shape(&out),
            ["user", "assistant", "user", "assistant(c1)", "tool(c1)"]
        );
    }

    #[test]
    fn an_earlier_turn_that_never_ended_is_closed() {
        let turns = [
            turn("a", vec![step(&["c1"])], None),
            turn("b", vec![], None),
        ];
        let out = conversation(None, &turns, None);
        assert_eq!(
            shape(&out),
            ["user", "assistant(c1)", "tool(c1)", "assistant", "user"]
        );
    }
}
