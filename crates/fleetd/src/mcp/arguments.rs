//! A tool call's arguments held against its tool's input schema before the tool parses them,
//! so that a call a model got wrong comes back as the documented `invalid_params` error with a
//! sentence it can act on: the parameter that does not exist, the one left out, or the one of
//! the wrong type, and in each case the parameters the tool has. Pure: the schema and the
//! arguments in, the sentence out.

use rmcp::model::JsonObject;
use serde_json::Value;

/// The most characters of a caller's parameter name a sentence repeats.
const SHOWN_NAME: usize = 64;

/// The most unknown parameters a sentence names (the rest are counted).
const SHOWN_UNKNOWN: usize = 5;

/// The most characters of the parser's own sentence repeated (see [`unparsed`]).
const SHOWN_REASON: usize = 200;

/// What is wrong with `args` for `tool`, whose input schema is `schema`: a parameter it does
/// not have, a required one left out, or a value whose JSON type the schema does not allow.
/// `None` when none of these is wrong (the tool's own parsing checks the rest, see
/// [`unparsed`]).
pub fn misfit(tool: &str, schema: &JsonObject, args: Option<&JsonObject>) -> Option<String> {
    let empty = JsonObject::new();
    let args = args.unwrap_or(&empty);
    let properties = schema.get("properties").and_then(Value::as_object);
    let known = |name: &str| properties.is_some_and(|p| p.contains_key(name));
    let mut unknown: Vec<String> = args
        .keys()
        .filter(|name| !known(name))
        .map(|name| format!("'{}'", shown(name)))
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        let more = unknown.len().saturating_sub(SHOWN_UNKNOWN);
        unknown.truncate(SHOWN_UNKNOWN);
        let (noun, mut them) = if unknown.len() == 1 {
            ("parameter", unknown.concat())
        } else {
            ("parameters", unknown.join(", "))
        };
        if more > 0 {
            them.push_str(&format!(" and {more} more"));
        }
        return Some(format!(
            "{tool} has no {noun} {them}; {}",
            parameters(schema)
        ));
    }
    let missing: Vec<&str> = required(schema)
        .into_iter()
        .filter(|name| !args.contains_key(*name))
        .collect();
    if let Some(first) = missing.first() {
        return Some(format!(
            "{tool} needs '{first}', which the call left out; {}",
            parameters(schema)
        ));
    }
    args.iter().find_map(|(name, value)| {
        let wanted = properties?.get(name)?.get("type")?;
        let allowed = types(wanted);
        (!allowed.is_empty() && !allowed.iter().any(|t| is_a(value, t))).then(|| {
            format!(
                "{tool}'s '{name}' must be {}, not {}; {}",
                allowed.join(" or "),
                kind(value),
                parameters(schema)
            )
        })
    })
}

/// The sentence for arguments the tool's own parsing refused (a value out of range, say),
/// from the parser's `reason`: naming the tool and its parameters. Where the parser names a
/// value the caller sent (`invalid type`, `invalid value`), only its kind is repeated; any
/// other sentence of the parser's is repeated short, its control characters shown as `?`.
pub fn unparsed(tool: &str, schema: &JsonObject, reason: &str) -> String {
    let reason = reason.trim();
    let told = ["invalid type: ", "invalid value: "]
        .into_iter()
        .find_map(|lead| {
            let rest = reason.strip_prefix(lead)?;
            let got = rest.split([' ', ',']).next().unwrap_or_default();
            // What was expected comes from the parameter's type, never from the caller: the
            // last ", expected" is the parser's own.
            let expected = rest.rsplit_once(", expected ").map(|(_, e)| e)?;
            Some(format!("{}{got} where {expected} was expected", lead))
        })
        .unwrap_or_else(|| {
            reason
                .chars()
                .take(SHOWN_REASON)
                .map(|c| if c.is_control() { '?' } else { c })
                .collect()
        });
    format!(
        "{tool} cannot take its arguments ({}); {}",
        told.trim_end_matches(' '),
        parameters(schema)
    )
}

/// "its parameters are a, b, c (required: a)", or "it takes no parameters".
fn parameters(schema: &JsonObject) -> String {
    let names: Vec<&str> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        return "it takes no parameters".into();
    }
    let required = required(schema);
    let mut said = format!("its parameters are {}", names.join(", "));
    if !required.is_empty() {
        said.push_str(&format!(" (required: {})", required.join(", ")));
    }
    said
}

/// The schema's required parameters.
fn required(schema: &JsonObject) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The JSON types a property's `type` allows (one name or a list of them).
fn types(wanted: &Value) -> Vec<&str> {
    match wanted {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Whether `value` is of JSON schema type `name` (an unknown type name allows anything).
fn is_a(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        _ => true,
    }
}

/// The JSON kind of `value`, as a sentence names it.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A caller's parameter name as a sentence repeats it: short, and only printable ASCII.
fn shown(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(SHOWN_NAME)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if name.chars().count() > SHOWN_NAME {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    fn send_schema() -> JsonObject {
        object(json!({
            "type": "object",
            "properties": {
                "to": {"type": ["string", "null"]},
                "message": {"type": "string"},
                "wait_s": {"type": ["integer", "null"], "format": "uint64", "minimum": 0},
                "groups": {"type": ["array", "null"], "items": {"type": "string"}},
                "choice": {"$ref": "#/definitions/Choice"},
            },
            "required": ["message"],
        }))
    }

    #[test]
    fn an_unknown_parameter_is_named_with_the_ones_that_exist() {
        let why = misfit(
            "fleet_send",
            &send_schema(),
            Some(&object(json!({"to": "w1", "text": "hi"}))),
        )
        .unwrap();
        assert_eq!(
            why,
            "fleet_send has no parameter 'text'; its parameters are choice, groups, message, to, wait_s (required: message)"
        );
    }

    #[test]
    fn several_unknown_parameters_are_all_named_in_order() {
        let why = misfit(
            "fleet_send",
            &send_schema(),
            Some(&object(json!({"zz": 1, "aa": 2, "message": "m"}))),
        )
        .unwrap();
        assert!(
            why.starts_with("fleet_send has no parameters 'aa', 'zz'; "),
            "{why}"
        );
    }

    #[test]
    fn many_unknown_parameters_are_named_five_and_counted() {
        let args: JsonObject = (0..1000).map(|i| (format!("k{i:04}"), json!(1))).collect();
        let why = misfit("fleet_send", &send_schema(), Some(&args)).unwrap();
        assert!(
            why.starts_with("fleet_send has no parameters 'k0000', 'k0001', 'k0002', 'k0003', 'k0004' and 995 more; "),
            "{why}"
        );
        assert!(why.len() < 300, "{}", why.len());
    }

    #[test]
    fn a_required_parameter_left_out_is_named() {
        let why = misfit(
            "fleet_send",
            &send_schema(),
            Some(&object(json!({"to": "w1"}))),
        )
        .unwrap();
        assert!(why.starts_with("fleet_send needs 'message', which the call left out; its parameters are choice, groups, message"), "{why}");
        // No arguments at all is the same as an empty object.
        assert_eq!(misfit("fleet_send", &send_schema(), None), Some(why));
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_parameter_and_both_types() {
        let cases = [
            (
                json!({"message": 5}),
                "fleet_send's 'message' must be string, not an integer",
            ),
            (
                json!({"message": "m", "wait_s": "5"}),
                "'wait_s' must be integer or null, not a string",
            ),
            (
                json!({"message": "m", "wait_s": 1.5}),
                "'wait_s' must be integer or null, not a number",
            ),
            (
                json!({"message": "m", "groups": "g"}),
                "'groups' must be array or null, not a string",
            ),
            (
                json!({"message": null}),
                "'message' must be string, not null",
            ),
        ];
        for (args, needle) in cases {
            let why = misfit("fleet_send", &send_schema(), Some(&object(args.clone()))).unwrap();
            assert!(why.contains(needle), "{args}: {why}");
        }
    }

    #[test]
    fn arguments_that_fit_pass_and_a_property_without_a_type_is_left_to_the_tool() {
        let fits = [
            json!({"message": "m"}),
            json!({"message": "m", "to": null, "wait_s": 0, "groups": ["a"]}),
            json!({"message": "m", "choice": {"anything": true}}),
        ];
        for args in fits {
            assert_eq!(
                misfit("fleet_send", &send_schema(), Some(&object(args.clone()))),
                None,
                "{args}"
            );
        }
    }

    #[test]
    fn a_tool_without_parameters_says_so() {
        let schema = object(json!({"type": "object", "properties": {}}));
        let why = misfit("fleet_x", &schema, Some(&object(json!({"a": 1})))).unwrap();
        assert_eq!(why, "fleet_x has no parameter 'a'; it takes no parameters");
        assert_eq!(misfit("fleet_x", &schema, None), None);
    }

    #[test]
    fn a_hostile_parameter_name_is_repeated_short_and_printable() {
        let name = format!("a\nb\u{1b}[31m{}", "x".repeat(500));
        let why = misfit(
            "fleet_send",
            &send_schema(),
            Some(&object(json!({name: 1, "message": "m"}))),
        )
        .unwrap();
        assert!(!why.contains('\n') && !why.contains('\u{1b}'), "{why}");
        assert!(why.contains("'a?b?[31mxxx") && why.contains("…'"), "{why}");
        assert!(why.len() < 300, "{}", why.len());
    }

    #[test]
    fn the_parsers_refusal_keeps_its_types_and_drops_the_callers_value() {
        let why = unparsed(
            "fleet_send",
            &send_schema(),
            "invalid value: string \"secret, expected a trap\", expected a name of letters",
        );
        assert_eq!(
            why,
            "fleet_send cannot take its arguments (invalid value: string where a name of letters was expected); its parameters are choice, groups, message, to, wait_s (required: message)"
        );
        assert!(!why.contains("secret"));
        let odd = unparsed("fleet_send", &send_schema(), "unknown variant `a\nb\u{1b}`");
        assert!(odd.contains("unknown variant `a?b?`"), "{odd}");
        let other = unparsed("fleet_send", &send_schema(), &"a custom reason ".repeat(50));
        assert!(
            other.starts_with("fleet_send cannot take its arguments (a custom reason"),
            "{other}"
        );
        assert!(other.len() < 400, "{}", other.len());
    }
}
