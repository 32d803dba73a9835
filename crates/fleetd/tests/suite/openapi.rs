//! The operator API against its own OpenAPI document: the document is valid OpenAPI 3.1 (the
//! `openapi-spec-validator` package's word), and what every route answers, as asked and when
//! it refuses, is what the document says (checked with the `jsonschema` package); every route
//! the document lists is seen answering.

use fleet_testkit::fleet::Fleet;
use serde_json::{Value, json};

use super::fleet_with_w1_and_spy;

/// One call and what it answered, as the checker reads it.
struct Caller<'a> {
    fleet: &'a Fleet,
    token: String,
    samples: Vec<Value>,
}

impl Caller<'_> {
    /// Calls `method path` (`template` is its documented path) with `body`, and keeps it.
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let client = reqwest::Client::new();
        let url = format!("{}{path}", self.fleet.base());
        let request = match &body {
            Some(body) => client.post(&url).json(body),
            None => client.get(&url),
        };
        let response = request.bearer_auth(&self.token).send().await?;
        let status = response.status().as_u16();
        let answer: Value = response.json().await?;
        let mut sample =
            json!({"method": method, "path": template, "status": status, "body": answer});
        if let Some(body) = body {
            sample["request"] = body;
        }
        self.samples.push(sample);
        Ok(answer)
    }

    /// Keeps a call whose answer is not JSON (its status only).
    fn keep(&mut self, method: &str, template: &str, status: u16) {
        self.samples
            .push(json!({"method": method, "path": template, "status": status}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_what_its_openapi_document_says() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, _lead) = fleet_with_w1_and_spy(&dir).await?;
    // The document needs no token.
    let document: Value = reqwest::get(format!("{}/api/v1/openapi.json", fleet.base()))
        .await?
        .error_for_status()?
        .json()
        .await?;
    let mut api = Caller {
        token: fleet.token("lead")?,
        fleet: &fleet,
        samples: vec![json!({"method": "get", "path": "/api/v1/openapi.json", "status": 200})],
    };

    // The feed, open before anything happens: its first event is checked too.
    let mut events = reqwest::Client::new()
        .get(format!("{}/api/v1/events?after=0", fleet.base()))
        .bearer_auth(&api.token)
        .send()
        .await?;
    anyhow::ensure!(events.status() == 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let Some(chunk) = events.chunk().await? else {
            anyhow::bail!("the feed ended");
        };
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .unwrap_or_default();
    api.samples.push(
        json!({"method": "get", "path": "/api/v1/events", "status": 200,
                            "event": serde_json::from_str::<Value>(data.trim())?}),
    );

    let sent = api
        .call(
            "post",
            "/api/v1/send",
            "/api/v1/send",
            Some(json!({"to": "w1", "message": "hello", "wait_s": 20})),
        )
        .await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    let task = sent["msg_id"].as_str().unwrap_or_default().to_string();
    api.call(
        "post",
        "/api/v1/send",
        "/api/v1/send",
        Some(json!({"to": "w1", "message": "/never", "wait_s": 0})),
    )
    .await?;
    api.call("get", "/api/v1/roster", "/api/v1/roster", None)
        .await?;
    api.call("get", "/api/v1/hosts", "/api/v1/hosts", None)
        .await?;
    for query in ["", "?state=injected&text=true", "?state=lost", "?to=nobody"] {
        api.call(
            "get",
            "/api/v1/messages",
            &format!("/api/v1/messages{query}"),
            None,
        )
        .await?;
    }
    for id in [task.as_str(), "0190f0a0-0000-7000-8000-000000000000", "x"] {
        api.call(
            "get",
            "/api/v1/messages/{msg_id}",
            &format!("/api/v1/messages/{id}"),
            None,
        )
        .await?;
    }
    for name in ["w1", "lead", "nobody"] {
        api.call(
            "get",
            "/api/v1/screen",
            &format!("/api/v1/screen?name={name}"),
            None,
        )
        .await?;
    }
    for body in [
        json!({"to": "nobody", "message": "x"}),
        json!({"to": "w1", "message": "x", "from": "me"}),
    ] {
        api.call("post", "/api/v1/send", "/api/v1/send", Some(body))
            .await?;
    }
    for body in [
        json!({"to": "lead"}),
        json!({"to": "nobody"}),
        json!({"to": "w1"}),
    ] {
        api.call("post", "/api/v1/stop", "/api/v1/stop", Some(body))
            .await?;
    }
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", fleet.base()))
        .bearer_auth(&api.token)
        .send()
        .await?;
    api.keep("get", "/metrics", metrics.status().as_u16());
    // Refused before anything else: no token, and a foreign page's origin.
    api.token = "fleet_not-a-token".into();
    api.call("get", "/api/v1/roster", "/api/v1/roster", None)
        .await?;
    let foreign = reqwest::Client::new()
        .get(format!("{}/api/v1/hosts", fleet.base()))
        .header("origin", "https://evil.example")
        .send()
        .await?;
    let status = foreign.status().as_u16();
    api.samples.push(
        json!({"method": "get", "path": "/api/v1/hosts", "status": status,
                            "body": foreign.json::<Value>().await?}),
    );
    let statuses: Vec<u64> = api
        .samples
        .iter()
        .filter_map(|s| s["status"].as_u64())
        .collect();
    for refused in [400, 401, 403, 404] {
        assert!(
            statuses.contains(&refused),
            "a {refused} is among the calls checked"
        );
    }

    let input = json!({"document": document, "samples": api.samples}).to_string();
    let out = super::run_python("check_openapi.py", &input)?;
    assert!(
        out.status.success(),
        "the API and its document disagree (is openapi-spec-validator installed? ./test.sh installs it):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
