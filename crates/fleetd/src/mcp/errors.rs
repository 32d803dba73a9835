//! The one place where domain errors become MCP tool results: every failure a model can act on
//! is a tool error (`isError: true`) whose structured content is `{code, message}` with a
//! stable code.

use fleet_core::FleetError;
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::json;

/// A successful result: the value as structured content, with its JSON as the text a model
/// reads. The text is written from `value` itself, not from the structured tree (a roster of
/// thousands is written once per form, not walked twice).
pub fn ok<T: Serialize>(value: &T) -> CallToolResult {
    match serde_json::to_value(value).and_then(|tree| Ok((serde_json::to_string(value)?, tree))) {
        Ok((text, tree)) => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(tree);
            result
        }
        Err(e) => failed(&FleetError::internal(format!(
            "cannot encode the result: {e}"
        ))),
    }
}

/// A tool error carrying the error's code and sentence.
pub fn failed(err: &FleetError) -> CallToolResult {
    CallToolResult::structured_error(json!({
        "code": err.code.as_str(),
        "message": err.message,
    }))
}

/// How rmcp begins the tool error it makes of arguments the tool's parameters would not parse.
const UNPARSED: &str = "failed to deserialize parameters:";

/// `result` as it goes back to the caller of `tool` (input schema `schema`): rmcp's own tool
/// error for arguments that would not parse (plain text) becomes the documented `{code,
/// message}` shape, `invalid_params`, naming the tool's parameters; anything else is left as
/// it is.
pub fn unparsed(
    result: CallToolResult,
    tool: &str,
    schema: &rmcp::model::JsonObject,
) -> CallToolResult {
    let reason = (result.is_error == Some(true) && result.structured_content.is_none())
        .then(|| {
            result
                .content
                .first()?
                .as_text()?
                .text
                .strip_prefix(UNPARSED)
        })
        .flatten();
    match reason {
        Some(reason) => failed(&FleetError::new(
            fleet_core::ErrorCode::InvalidParams,
            super::arguments::unparsed(tool, schema, reason),
        )),
        None => result,
    }
}

/// Turns a domain result into a tool result.
pub fn result<T: Serialize>(outcome: Result<T, FleetError>) -> CallToolResult {
    match outcome {
        Ok(value) => ok(&value),
        Err(err) => failed(&err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::ErrorCode;

    #[test]
    fn errors_carry_code_and_sentence() {
        let result = failed(&FleetError::new(ErrorCode::UnknownRecipient, "no 'x'"));
        assert_eq!(result.is_error, Some(true));
        let content = result.structured_content.unwrap();
        assert_eq!(content["code"], "unknown_recipient");
        assert_eq!(content["message"], "no 'x'");
    }

    #[test]
    fn successes_are_structured() {
        let result = ok(&json!({"msg_id": "m"}));
        assert_eq!(result.is_error, Some(false));
        assert_eq!(result.structured_content.unwrap()["msg_id"], "m");
    }

    #[test]
    fn a_successes_text_is_the_json_of_its_structured_content() {
        #[derive(Serialize)]
        struct Entry {
            zed: Option<u32>,
            name: &'static str,
            groups: Vec<&'static str>,
        }
        let value = vec![
            Entry {
                zed: None,
                name: "w\"1\n",
                groups: vec!["a"],
            },
            Entry {
                zed: Some(7),
                name: "w2",
                groups: Vec::new(),
            },
        ];
        let result = ok(&value);
        let text = result.content[0].as_text().unwrap().text.clone();
        let read: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(Some(read), result.structured_content);
        assert_eq!(result.structured_content.unwrap()[0]["name"], "w\"1\n");
    }
}
