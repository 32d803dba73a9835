//! What `fleetd mcp-config NAME` prints: the MCP client config a lead gives Claude Code. Pure:
//! the command reads the config and the token file and prints what this module writes.
//!
//! By default nothing printed holds the token. The config sends `Authorization: Bearer
//! ${FLEET_TOKEN}`, which Claude Code expands from its environment when it connects (in a
//! `.mcp.json`, a `--mcp-config` file and what `claude mcp add` stores alike; checked on Claude
//! Code 2.1.332), and a shell line sets `FLEET_TOKEN` from the token file. So the token stays in
//! its file: not in a config file that gets shared or committed, not in the shell history, not
//! in a process list. `--literal` writes the token itself, for a client that expands nothing.

use serde_json::{Value, json};

/// The header a lead sets to its `$TMUX_PANE`, for nudges.
pub const PANE_HEADER: &str = "x-fleet-pane";
/// The header a lead sets to its `$TMUX`, naming its tmux server.
pub const TMUX_HEADER: &str = "x-fleet-tmux";
/// The environment variable the config reads the token from.
pub const TOKEN_VAR: &str = "FLEET_TOKEN";
/// The MCP server's name in the client (its tools: `mcp__fleet__…`).
const SERVER: &str = "fleet";
/// What a lead's pane and tmux server are, as the client expands them (empty outside tmux):
/// fleetd nudges the lead there.
const PANE_VALUE: &str = "${TMUX_PANE:-}";
/// See [`PANE_VALUE`].
const TMUX_VALUE: &str = "${TMUX:-}";
/// Said on stderr when the token is printed.
pub const LITERAL_WARNING: &str = "fleetd: this config holds the token itself; whoever reads the file, your shell history or the process list can act as this lead (without --literal it reads the token from FLEET_TOKEN)";

/// Where the config takes the token from.
#[derive(Clone, Copy)]
pub enum Token<'a> {
    /// From `$FLEET_TOKEN`, which the printed line sets from this file (an absolute path).
    FromFile(&'a str),
    /// The token itself (`--literal`).
    Literal(&'a str),
}

impl Token<'_> {
    /// The `Authorization` header's value.
    fn authorization(&self) -> String {
        match self {
            Token::FromFile(_) => format!("Bearer ${{{TOKEN_VAR}}}"),
            Token::Literal(token) => format!("Bearer {token}"),
        }
    }
}

/// The headers, as the config names them.
fn headers(token: Token) -> Vec<(String, String)> {
    let mut all = vec![("Authorization".into(), token.authorization())];
    all.extend(pane_headers());
    all
}

/// The headers naming the lead's pane and tmux server, which the client expands.
fn pane_headers() -> [(String, String); 2] {
    [
        (title(PANE_HEADER), PANE_VALUE.into()),
        (title(TMUX_HEADER), TMUX_VALUE.into()),
    ]
}

/// The JSON config for `.mcp.json` or `claude --mcp-config FILE`.
pub fn json(url: &str, token: Token) -> Value {
    let headers: serde_json::Map<String, Value> = headers(token)
        .into_iter()
        .map(|(name, value)| (name, Value::String(value)))
        .collect();
    json!({"mcpServers": {SERVER: {"type": "http", "url": url, "headers": headers}}})
}

/// Everything `mcp-config` prints without `--json`: the JSON, the line that sets `FLEET_TOKEN`
/// from the token file (unless literal), and the same config as a `claude mcp add` line.
pub fn text(url: &str, token: Token) -> String {
    let mut out = format!("{:#}\n\n", json(url, token));
    if let Token::FromFile(file) = token {
        out.push_str(&format!(
            "# Claude Code reads the token from {TOKEN_VAR}: set it, in the shell that starts\n\
             # claude, from the token file (the token stays out of config files, shell history\n\
             # and process lists):\n\
             export {TOKEN_VAR}=\"$(cat {})\"\n\n",
            shell_quote(file)
        ));
    }
    let mut add = format!(
        "claude mcp add --transport http {SERVER} {}",
        shell_quote(url)
    );
    for (name, value) in headers(token) {
        add.push_str(" --header ");
        add.push_str(&shell_quote(&format!("{name}: {value}")));
    }
    out.push_str(&format!("# or, with the Claude Code CLI:\n{add}\n"));
    out
}

/// The server entry `fleetd init` registers with Claude Code (`claude mcp add-json`): the
/// token comes from `helper`, a shell command Claude Code runs at each connection (`fleetd
/// mcp-headers NAME …`), so a rotated token needs no edit and is in no file of Claude Code's;
/// the pane headers as [`json`] has them.
pub fn registered(url: &str, helper: &str) -> Value {
    let headers: serde_json::Map<String, Value> = pane_headers()
        .into_iter()
        .map(|(name, value)| (name, Value::String(value)))
        .collect();
    json!({"type": "http", "url": url, "headersHelper": helper, "headers": headers})
}

/// The shell command of [`registered`]: `exe mcp-headers NAME --config CONFIG --state-dir STATE`,
/// each word quoted (Claude Code runs it through a shell, in its own directory and environment,
/// so every path is absolute and named).
pub fn helper_command(exe: &str, name: &str, config: &str, state: &str) -> String {
    [
        exe,
        "mcp-headers",
        name,
        "--config",
        config,
        "--state-dir",
        state,
    ]
    .map(shell_quote)
    .join(" ")
}

/// What `fleetd mcp-headers` prints: the headers as one JSON object.
pub fn helper_output(token: &str) -> String {
    json!({"Authorization": format!("Bearer {token}")}).to_string()
}

/// The MCP server's name in the client.
pub const SERVER_NAME: &str = SERVER;

/// Why a bearer token that is still a `${…}` placeholder fails, and what to do: the client was
/// started without the variable, so it sent the placeholder itself.
pub fn unexpanded(bearer: &str) -> Option<String> {
    bearer.starts_with("${").then(|| {
        format!(
            "the bearer token is an unexpanded ${{…}}: the MCP client started without {TOKEN_VAR} set; set it with the export line `fleetd mcp-config NAME` prints, then start the client again"
        )
    })
}

/// `word` as one word of a POSIX shell command line, taken literally (no `$` expansion, no
/// globbing): as it is when it is plain, else in single quotes.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:@%+=,-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `x-fleet-pane` → `X-Fleet-Pane`
fn title(header: &str) -> String {
    header
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://127.0.0.1:8765/mcp";
    const TOKEN: &str = "fleet_0123abcd";

    #[test]
    fn by_default_nothing_printed_holds_the_token() {
        let file = "/home/me/.local/state/fleetd/leads/alice.token";
        let value = json(URL, Token::FromFile(file));
        let headers = &value["mcpServers"]["fleet"]["headers"];
        assert_eq!(headers["Authorization"], "Bearer ${FLEET_TOKEN}");
        assert_eq!(headers["X-Fleet-Pane"], "${TMUX_PANE:-}");
        assert_eq!(headers["X-Fleet-Tmux"], "${TMUX:-}");
        assert_eq!(value["mcpServers"]["fleet"]["url"], URL);
        let text = text(URL, Token::FromFile(file));
        assert!(
            text.contains(&format!("export FLEET_TOKEN=\"$(cat {file})\"\n")),
            "{text}"
        );
        assert!(
            text.contains(
                "claude mcp add --transport http fleet http://127.0.0.1:8765/mcp --header 'Authorization: Bearer ${FLEET_TOKEN}' --header 'X-Fleet-Pane: ${TMUX_PANE:-}' --header 'X-Fleet-Tmux: ${TMUX:-}'\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn literal_writes_the_token_and_no_export_line() {
        let value = json(URL, Token::Literal(TOKEN));
        assert_eq!(
            value["mcpServers"]["fleet"]["headers"]["Authorization"],
            format!("Bearer {TOKEN}")
        );
        let text = text(URL, Token::Literal(TOKEN));
        assert!(text.contains(&format!("--header 'Authorization: Bearer {TOKEN}'")));
        assert!(!text.contains("export"), "{text}");
    }

    #[test]
    fn a_placeholder_sent_as_the_token_is_explained() {
        let why = unexpanded("${FLEET_TOKEN}").unwrap();
        assert!(why.contains("without FLEET_TOKEN set"), "{why}");
        assert_eq!(unexpanded(TOKEN), None);
    }

    #[test]
    fn the_registered_server_takes_its_token_from_the_helper_and_its_pane_from_the_client() {
        let helper = helper_command(
            "/opt/my tools/fleetd",
            "alice",
            "/home/me/.config/fleetd/fleetd.toml",
            "/home/me/.local/state/fleetd",
        );
        assert_eq!(
            helper,
            "'/opt/my tools/fleetd' mcp-headers alice --config /home/me/.config/fleetd/fleetd.toml --state-dir /home/me/.local/state/fleetd"
        );
        let entry = registered(URL, &helper);
        assert_eq!(entry["type"], "http");
        assert_eq!(entry["url"], URL);
        assert_eq!(entry["headersHelper"], helper);
        assert_eq!(entry["headers"]["X-Fleet-Pane"], "${TMUX_PANE:-}");
        assert_eq!(entry["headers"]["X-Fleet-Tmux"], "${TMUX:-}");
        assert!(entry["headers"].get("Authorization").is_none(), "{entry}");
        let printed: Value = serde_json::from_str(&helper_output(TOKEN)).unwrap();
        assert_eq!(printed, json!({"Authorization": format!("Bearer {TOKEN}")}));
    }

    #[test]
    fn shell_words_are_taken_literally() {
        assert_eq!(shell_quote("/plain/path-1.token"), "/plain/path-1.token");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("x;rm -rf ~"), "'x;rm -rf ~'");
    }
}
