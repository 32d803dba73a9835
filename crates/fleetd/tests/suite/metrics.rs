//! `/metrics` as a Prometheus scraper reads it: with a lead's token, in the OpenMetrics text
//! format (parsed by the Prometheus Python client's own parser, installed by `./test.sh`),
//! counting what happened and never carrying a message's text.

use fleet_testkit::fleet::Fleet;
use serde_json::{Value, json};

use super::{as_worker, fleet_with_w1_and_spy, worker_token};

/// `text` parsed by the Prometheus client's OpenMetrics parser: its samples.
fn parse(text: &str) -> anyhow::Result<Vec<Value>> {
    let out = super::run_python("parse_metrics.py", text)?;
    anyhow::ensure!(
        out.status.success(),
        "the OpenMetrics parser refused the metrics (is prometheus-client installed? ./test.sh installs it):\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The value of the sample `name` whose labels include `labels`.
pub(super) fn value(samples: &[Value], name: &str, labels: &Value) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s["name"] == name
                && labels
                    .as_object()
                    .is_some_and(|want| want.iter().all(|(k, v)| &s["labels"][k] == v))
        })
        .and_then(|s| s["value"].as_f64())
}

/// The samples of `fleet`'s metrics, scraped with lead `lead`'s token and parsed.
pub(super) async fn scraped(fleet: &Fleet, lead: &str) -> anyhow::Result<Vec<Value>> {
    let (status, text) = scrape(fleet, Some(&fleet.token(lead)?)).await?;
    anyhow::ensure!(status == 200, "GET /metrics: {status} {text}");
    parse(&text)
}

/// `GET /metrics` with `token`: its status and body.
async fn scrape(fleet: &Fleet, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let mut request = reqwest::Client::new().get(format!("{}/metrics", fleet.base()));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response.text().await?;
    if status == 200 {
        anyhow::ensure!(
            content_type.starts_with("application/openmetrics-text"),
            "content type {content_type}"
        );
    }
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scraper_reads_counts_of_what_happened_and_never_a_messages_text() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, lead) = fleet_with_w1_and_spy(&dir).await?;
    let secret = "metrics-must-not-show-this-7f3a";
    let sent = lead.send("w1", secret, 20).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    // A message held for the lead: a worker's late answer, waiting for its poll.
    let spy = as_worker(&fleet, &lead, &dir, "spy1").await?;
    spy.ok(
        "fleet_send",
        json!({"to": "lead", "message": secret, "wait_s": 0}),
    )
    .await?;

    let lead_token = fleet.token("lead")?;
    let (status, text) = scrape(&fleet, Some(&lead_token)).await?;
    assert_eq!(status, 200, "{text}");
    assert!(
        !text.contains(secret),
        "a message's text in the metrics:\n{text}"
    );
    let samples = parse(&text)?;
    let at = |name: &str, labels: Value| value(&samples, name, &labels);
    assert_eq!(
        at(
            "fleetd_build_info",
            json!({"version": env!("CARGO_PKG_VERSION")})
        ),
        Some(1.0),
        "{text}"
    );
    // The task: accepted, queued, typed in at the first Enter, and answered.
    assert_eq!(
        at(
            "fleetd_messages_accepted_total",
            json!({"kind": "SEND", "placement": "queue"})
        ),
        Some(1.0),
        "{text}"
    );
    // The worker's message to the lead: held for its pull; the reply, held for the send.
    assert_eq!(
        at(
            "fleetd_messages_accepted_total",
            json!({"kind": "SEND", "placement": "hold"})
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        at(
            "fleetd_messages_accepted_total",
            json!({"kind": "REPLY", "placement": "hold"})
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        at("fleetd_injects_total", json!({"outcome": "submitted"})),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        at("fleetd_inject_duration_seconds_count", json!({})),
        Some(1.0)
    );
    assert!(at("fleetd_inject_duration_seconds_sum", json!({})).is_some_and(|s| s > 0.0));
    assert_eq!(
        at(
            "fleetd_messages",
            json!({"kind": "SEND", "state": "injected"})
        ),
        Some(1.0),
        "{text}"
    );
    // Two live sessions, both idle; the lead has one message waiting.
    assert_eq!(
        at("fleetd_sessions", json!({"status": "idle"})),
        Some(2.0),
        "{text}"
    );
    assert_eq!(at("fleetd_sessions", json!({"status": "busy"})), Some(0.0));
    assert_eq!(
        at(
            "fleetd_waiting_messages",
            json!({"recipient": "lead", "state": "held"})
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(at("fleetd_hosts_up", json!({})), Some(1.0));

    // Only a lead's token reads them: none, a worker's, or a made-up one is refused.
    let worker_token = worker_token(&lead, &dir, "spy2").await?;
    let (status, _) = scrape(&fleet, None).await?;
    assert_eq!(status, 401);
    for token in ["not-a-token", worker_token.as_str()] {
        let (status, body) = scrape(&fleet, Some(token)).await?;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("lead"), "{body}");
    }
    Ok(())
}
