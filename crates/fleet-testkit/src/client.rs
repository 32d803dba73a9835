//! A real MCP client (rmcp, Streamable HTTP) talking to fleetd as a lead or a worker would.

use std::collections::HashMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// Which MCP protocol the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// The stateless 2026-07-28 protocol (`server/discover`, no sessions).
    Stateless,
    /// The older session protocol (`initialize`, `Mcp-Session-Id`), pinned to 2025-06-18.
    Session,
    /// The session protocol of 2025-11-25, whose broken streams resume (`Last-Event-ID`).
    Resumable,
}

/// A tool call that came back as a tool error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    /// The stable code.
    pub code: String,
    /// The sentence.
    pub message: String,
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

/// A connected MCP client.
pub struct Client {
    service: RunningService<RoleClient, ClientConfig>,
}

impl Client {
    /// Connects to `url` with `token`, sending `headers` on every request.
    pub async fn connect(
        url: &str,
        token: &str,
        protocol: Protocol,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut extra = HashMap::new();
        for (name, value) in headers {
            extra.insert(
                HeaderName::from_bytes(name.as_bytes())?,
                HeaderValue::from_str(value)?,
            );
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
            .auth_header(token.to_string())
            .custom_headers(extra);
        // rmcp's default HTTP client opens a connection per request; this one keeps them
        // alive, as an agent's HTTP stack does (fleetd sets TCP_NODELAY, so a kept connection
        // does not stall on delayed ACKs).
        let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let service = match protocol {
            Protocol::Stateless => {
                ClientConfig::default()
                    .serve_with_lifecycle(
                        transport,
                        ClientLifecycleMode::Discover {
                            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                        },
                    )
                    .await?
            }
            Protocol::Session => {
                ClientConfig::default()
                    .with_protocol_version(ProtocolVersion::V_2025_06_18)
                    .serve(transport)
                    .await?
            }
            Protocol::Resumable => {
                ClientConfig::default()
                    .with_protocol_version(ProtocolVersion::V_2025_11_25)
                    .serve(transport)
                    .await?
            }
        };
        Ok(Self { service })
    }

    /// The protocol version the server agreed to.
    pub fn protocol_version(&self) -> Option<String> {
        self.service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
    }

    /// Calls `tool` with `args`: the structured result, or the tool error.
    pub async fn call(&self, tool: &str, args: Value) -> anyhow::Result<Result<Value, ToolError>> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        let result = self.service.call_tool(params).await?;
        let structured = result.structured_content.unwrap_or(Value::Null);
        if result.is_error == Some(true) {
            let field = |name: &str| structured[name].as_str().unwrap_or_default().to_string();
            return Ok(Err(ToolError {
                code: field("code"),
                message: if structured.is_null() {
                    format!("{:?}", result.content)
                } else {
                    field("message")
                },
            }));
        }
        Ok(Ok(structured))
    }

    /// The tools the server lists: each name with its input schema.
    pub async fn tools(&self) -> anyhow::Result<Vec<(String, Value)>> {
        let tools = self.service.list_all_tools().await?;
        Ok(tools
            .into_iter()
            .map(|t| (t.name.to_string(), Value::Object((*t.input_schema).clone())))
            .collect())
    }

    /// Calls `tool` and fails the test if it is a tool error.
    pub async fn ok(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        self.call(tool, args)
            .await?
            .map_err(|e| anyhow::anyhow!("{tool} failed: {e}"))
    }

    /// Calls `tool`, giving up (and so cancelling the call) after `limit`.
    pub async fn call_within(
        &self,
        tool: &str,
        args: Value,
        limit: Duration,
    ) -> anyhow::Result<Option<Result<Value, ToolError>>> {
        match tokio::time::timeout(limit, self.call(tool, args)).await {
            Ok(result) => result.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// `fleet_spawn{profile, name}`; fails the test on a tool error.
    pub async fn spawn(&self, profile: &str, name: &str) -> anyhow::Result<Value> {
        self.ok("fleet_spawn", json!({"profile": profile, "name": name}))
            .await
    }

    /// `fleet_send{to, message, wait_s}`; fails the test on a tool error.
    pub async fn send(&self, to: &str, message: &str, wait_s: u64) -> anyhow::Result<Value> {
        self.ok(
            "fleet_send",
            json!({"to": to, "message": message, "wait_s": wait_s}),
        )
        .await
    }

    /// `fleet_poll{wait_s}`: the messages.
    pub async fn poll(&self, wait_s: u64) -> anyhow::Result<Vec<Value>> {
        let polled = self.ok("fleet_poll", json!({"wait_s": wait_s})).await?;
        Ok(polled["messages"].as_array().cloned().unwrap_or_default())
    }

    /// The names `fleet_list` shows, in its order.
    pub async fn names(&self) -> anyhow::Result<Vec<String>> {
        let list = self.ok("fleet_list", json!({})).await?;
        Ok(list["entities"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The `fleet_list` entry of `name`.
    pub async fn entry(&self, name: &str) -> anyhow::Result<Value> {
        let list = self.ok("fleet_list", json!({})).await?;
        list["entities"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == name).cloned())
            .ok_or_else(|| anyhow::anyhow!("{name} is not listed: {list}"))
    }

    /// The `fleet_list` entry of `name`, once its host is heard: listed with a status other
    /// than `unknown` (its pane host cannot tell) or `unreachable` (its host is not heard).
    pub async fn heard_entry(&self, name: &str) -> anyhow::Result<Value> {
        let entry = self.entry(name).await?;
        let status = entry["status"].as_str().unwrap_or_default();
        anyhow::ensure!(
            !["unknown", "unreachable"].contains(&status),
            "{name} is {status}"
        );
        Ok(entry)
    }

    /// Closes the connection.
    pub async fn close(self) -> anyhow::Result<()> {
        self.service.cancel().await?;
        Ok(())
    }
}
