//! The one place where domain errors become MCP tool results: every failure a model can act on
//! is a tool error (`isError: true`) whose structured content is `{code, message}` with a
//! stable code.

use fleet_core::FleetError;
use rmcp::model::CallToolResult;
use serde::Serialize;
use serde_json::json;

/// A successful result: the value as structured content, with its JSON as the text a model
/// reads.
pub fn ok<T: Serialize>(value: &T) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(value) => CallToolResult::structured(value),
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
}
