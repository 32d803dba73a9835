//! A direct call's answer, written as rmcp writes it (its JSON-RPC response, `tools/call`'s
//! result) but without the JSON tree rmcp's result type holds its structured content in: the
//! value is written once, as the text a model reads, and that same text is the structured
//! content. (A roster of a thousand entries was written into a tree, the tree copied into the
//! answer and the text written besides; a send's answer and a poll's messages the same, on every
//! call.)

use fleet_core::FleetError;
use rmcp::model::{JsonRpcVersion2_0, RequestId, ResultType, ServerJsonRpcMessage, ServerResult};
use serde::Serialize;
use serde_json::value::RawValue;

use super::errors;

/// The JSON-RPC answer to the call `id` whose tool ended with `outcome`, as rmcp would write it
/// (a failure exactly as rmcp writes [`errors::failed`]); an error only if not even the failure
/// could be written.
pub fn written<T: Serialize>(
    id: &RequestId,
    outcome: Result<T, FleetError>,
) -> serde_json::Result<String> {
    let failure = match outcome.map(|value| serde_json::to_string(&value)) {
        Ok(Ok(text)) => return success(id, text),
        Ok(Err(e)) => FleetError::internal(format!("cannot encode the result: {e}")),
        Err(err) => err,
    };
    serde_json::to_string(&ServerJsonRpcMessage::response(
        ServerResult::CallToolResult(errors::failed(&failure)),
        id.clone(),
    ))
}

/// A success whose structured content is the JSON `text`, which is also its one text block.
fn success(id: &RequestId, text: String) -> serde_json::Result<String> {
    let structured = RawValue::from_string(text)?;
    serde_json::to_string(&Response {
        jsonrpc: JsonRpcVersion2_0,
        id,
        result: Success {
            result_type: ResultType::COMPLETE,
            content: [Text {
                kind: "text",
                text: structured.get(),
            }],
            structured_content: &structured,
            is_error: false,
        },
    })
}

/// rmcp's `JsonRpcResponse`, its result borrowed.
#[derive(Serialize)]
struct Response<'a> {
    jsonrpc: JsonRpcVersion2_0,
    id: &'a RequestId,
    result: Success<'a>,
}

/// rmcp's `CallToolResult` of a success, its structured content written already.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Success<'a> {
    result_type: ResultType,
    content: [Text<'a>; 1],
    structured_content: &'a RawValue,
    is_error: bool,
}

/// rmcp's text content block.
#[derive(Serialize)]
struct Text<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[cfg(test)]
mod tests {
    use fleet_core::ErrorCode;
    use rmcp::model::NumberOrString;
    use serde_json::{Value, json};

    use super::*;

    /// What rmcp writes for `result`, answering `id`.
    fn rmcp_writes(id: &RequestId, result: rmcp::model::CallToolResult) -> Value {
        let mut result = ServerResult::CallToolResult(result);
        result.fill_missing_cache_hints();
        serde_json::to_value(ServerJsonRpcMessage::response(result, id.clone())).unwrap()
    }

    #[derive(Serialize)]
    struct Entry {
        gid: &'static str,
        name: String,
        note: Option<&'static str>,
        groups: Vec<&'static str>,
        count: u64,
    }

    #[test]
    fn a_success_is_what_rmcp_writes_for_it() {
        let entries: Vec<Entry> = (0..3)
            .map(|n| Entry {
                gid: "g-1",
                name: format!("w{n} \"quoted\"\n\u{1b}[2J é 🦀 \\"),
                note: (n == 1).then_some("x"),
                groups: vec!["a", "b"],
                count: u64::MAX - n,
            })
            .collect();
        for id in [
            RequestId::Number(7),
            NumberOrString::String("call-\"1\"".into()),
        ] {
            let value = json!({"entities": &entries, "hosts": [], "me": {"gid": "g"}});
            let ours: Value = serde_json::from_str(&written(&id, Ok(&value)).unwrap()).unwrap();
            assert_eq!(ours, rmcp_writes(&id, errors::ok(&value)));
            let text = ours["result"]["content"][0]["text"].as_str().unwrap();
            assert_eq!(text, serde_json::to_string(&value).unwrap());
        }
    }

    #[test]
    fn a_failure_is_what_rmcp_writes_for_it() {
        let id = RequestId::Number(3);
        let err = FleetError::new(ErrorCode::UnknownRecipient, "no 'w\"9'");
        let ours: Value =
            serde_json::from_str(&written::<()>(&id, Err(err.clone())).unwrap()).unwrap();
        assert_eq!(ours, rmcp_writes(&id, errors::failed(&err)));
        assert_eq!(ours["result"]["isError"], true);
        assert_eq!(
            ours["result"]["structuredContent"]["code"],
            "unknown_recipient"
        );
    }

    #[test]
    fn a_value_that_cannot_be_written_is_an_internal_failure() {
        // A map whose keys are not strings has no JSON.
        let value: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let ours: Value =
            serde_json::from_str(&written(&RequestId::Number(1), Ok(value)).unwrap()).unwrap();
        assert_eq!(ours["result"]["isError"], true);
        assert_eq!(ours["result"]["structuredContent"]["code"], "internal");
    }
}
