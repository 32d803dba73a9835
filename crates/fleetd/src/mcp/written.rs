//! A direct call's answer: the JSON rmcp writes for it (its JSON-RPC response, `tools/call`'s
//! result), written without the JSON tree rmcp's result type holds its structured content in.
//! The value is written once, as the text a model reads, and that same text is the structured
//! content, so its keys keep the value's order where rmcp's tree sorts them. (A roster of a
//! thousand entries was written into a tree, the tree into the answer and the text besides; a
//! send's answer and a poll's messages the same, on every call.)

use fleet_core::FleetError;
use rmcp::model::{RequestId, ResultType, ServerJsonRpcMessage, ServerResult};
use serde::Serialize;

use super::errors;

/// The JSON-RPC answer to the call `id` whose tool ended with `outcome`, as rmcp would write it
/// (a failure exactly as rmcp writes [`errors::failed`]); an error only if not even the failure
/// could be written.
pub fn written<T: Serialize>(
    id: &RequestId,
    outcome: Result<T, FleetError>,
) -> serde_json::Result<Vec<u8>> {
    let failure = match outcome.map(|value| serde_json::to_string(&value)) {
        Ok(Ok(text)) => return success(id, &text),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot encode the result");
            FleetError::internal(format!("cannot encode the result: {e}"))
        }
        Err(err) => err,
    };
    serde_json::to_vec(&ServerJsonRpcMessage::response(
        ServerResult::CallToolResult(errors::failed(&failure)),
        id.clone(),
    ))
}

/// A success whose one text block is the JSON `text`, which is also its structured content:
/// rmcp's `JsonRpcResponse` of a `CallToolResult`, its fields in rmcp's order.
fn success(id: &RequestId, text: &str) -> serde_json::Result<Vec<u8>> {
    // The text twice, once escaped: each quote and backslash of it gains one.
    let escapes = text.bytes().filter(|b| matches!(b, b'"' | b'\\')).count();
    let mut out = Vec::with_capacity(2 * text.len() + escapes + 192);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut out, id)?;
    out.extend_from_slice(br#","result":{"resultType":"#);
    serde_json::to_writer(&mut out, &ResultType::COMPLETE)?;
    out.extend_from_slice(br#","content":[{"type":"text","text":"#);
    serde_json::to_writer(&mut out, text)?;
    out.extend_from_slice(br#"}],"structuredContent":"#);
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(br#","isError":false}}"#);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use fleet_core::dialog::Choice;
    use fleet_core::{ErrorCode, Gid, MsgId};
    use rmcp::model::NumberOrString;
    use serde_json::Value;

    use super::*;
    use crate::gateway::{DialogView, HostView, ListResult, RosterEntry, SendResult};

    /// What rmcp writes for `result`, answering `id`.
    fn rmcp_writes(id: &RequestId, result: rmcp::model::CallToolResult) -> Value {
        let mut result = ServerResult::CallToolResult(result);
        result.fill_missing_cache_hints();
        serde_json::to_value(ServerJsonRpcMessage::response(result, id.clone())).unwrap()
    }

    /// Checks that the answer to `id` with `value` is the JSON rmcp writes for it, its
    /// structured content written as its text is.
    fn reads_as_rmcps<T: Serialize>(id: &RequestId, value: &T) {
        let ours = String::from_utf8(written(id, Ok(value)).unwrap()).unwrap();
        let read: Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(read, rmcp_writes(id, errors::ok(value)), "{ours}");
        let text = serde_json::to_string(value).unwrap();
        assert_eq!(read["result"]["content"][0]["text"], text.as_str());
        assert!(
            ours.contains(&format!(r#""structuredContent":{text},"#)),
            "{ours}"
        );
    }

    const ODD: &str = "w \"quoted\"\n\u{1b}[2J é 🦀 \\ \u{0} \u{2028}";

    #[test]
    fn a_roster_is_the_json_rmcp_writes_for_it() {
        let mut you = RosterEntry::example("lead", "h1", "idle", &[]);
        you.last_seen_ms = Some(i64::MAX);
        let mut odd = RosterEntry::example(ODD, "h2", "busy", &["a", ODD]);
        odd.pane = Some("%7".into());
        odd.open_calls = Some(usize::MAX);
        let list = ListResult {
            you,
            coord_id: Some(ODD.into()),
            entities: vec![odd, RosterEntry::example("w2", "h1", "idle", &[])],
            hosts: vec![HostView {
                host: "h1".into(),
                status: "up".into(),
                profiles: vec!["claude".into()],
                families: [("claude".into(), "anthropic".into())].into(),
                last_seen_ms: None,
            }],
        };
        for id in [
            RequestId::Number(7),
            RequestId::Number(-1),
            NumberOrString::String(ODD.into()),
        ] {
            reads_as_rmcps(&id, &list);
        }
    }

    #[test]
    fn a_sends_answers_are_the_json_rmcp_writes_for_them_tagged_and_flattened_alike() {
        let blocked = SendResult::Blocked {
            msg_id: Some(MsgId::mint()),
            dialog: DialogView {
                turn_id: "t-1".into(),
                from: Gid::mint(),
                from_name: ODD.into(),
                host: "h".into(),
                prompt: ODD.into(),
                choices: vec![Choice {
                    choice: "1".into(),
                    label: "Yes".into(),
                }],
                in_task: None,
                seen_ms: 5,
            },
            note: "answer it".into(),
        };
        let failed = SendResult::Failed {
            msg_id: MsgId::mint(),
            reason: ODD.into(),
        };
        for value in [blocked, failed] {
            reads_as_rmcps(&RequestId::Number(3), &value);
        }
    }

    #[test]
    fn a_failure_is_what_rmcp_writes_for_it() {
        let id = RequestId::Number(3);
        let err = FleetError::new(ErrorCode::UnknownRecipient, "no 'w\"9'");
        let ours: Value =
            serde_json::from_slice(&written::<()>(&id, Err(err.clone())).unwrap()).unwrap();
        assert_eq!(ours, rmcp_writes(&id, errors::failed(&err)));
        assert_eq!(ours["result"]["isError"], true);
    }

    #[test]
    fn a_value_that_cannot_be_written_is_an_internal_failure() {
        // A map whose keys are not strings has no JSON.
        let value: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let id = RequestId::Number(1);
        let ours: Value = serde_json::from_slice(&written(&id, Ok(&value)).unwrap()).unwrap();
        let why = serde_json::to_string(&value).unwrap_err();
        let err = FleetError::internal(format!("cannot encode the result: {why}"));
        assert_eq!(ours, rmcp_writes(&id, errors::failed(&err)));
    }
}
