//! The web view at `/ui` in a real browser: Debian's Chromium, headless, driven over WebDriver
//! by its `chromedriver`. A person signs in with a lead's token, sees a worker the lead spawns
//! appear live, watches its task go queued → injected → replied, reads its screen, and stops it
//! from the page; the cookie stays out of the page's reach and opens nothing without the key
//! only the page holds. Screenshots are saved under the target dir's `tmp/webview/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
use fantoccini::{Client, ClientBuilder, Locator};
use fleet_testkit::client::Protocol;
use fleet_testkit::fleet::Fleet;
use fleet_testkit::wait::until;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium under its own chromedriver, both gone when this is dropped.
struct Browser {
    driver: tokio::process::Child,
    client: Option<Client>,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // Its own process group, so Chromium (its child) goes with it.
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let status = format!("http://127.0.0.1:{port}/status");
        until(
            "chromedriver to be ready",
            Duration::from_secs(20),
            || async {
                let answer = reqwest::get(&status)
                    .await
                    .ok()?
                    .json::<Value>()
                    .await
                    .ok()?;
                (answer["value"]["ready"] == true).then_some(())
            },
        )
        .await?;
        let profile = tempfile::tempdir()?;
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    // Chromium's own sandbox cannot start as root (CI runs as root).
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                    // Offline, its start page would wait on DNS for seconds: only loopback
                    // resolves.
                    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            anyhow::bail!("capabilities are an object");
        };
        // chromedriver speaks plain HTTP on loopback: no TLS.
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await?;
        Ok(Self {
            driver,
            client: Some(client),
            _profile: profile,
        })
    }

    fn page(&self) -> anyhow::Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the browser is closed"))
    }

    async fn close(mut self) -> anyhow::Result<()> {
        if let Some(client) = self.client.take() {
            client.close().await?;
        }
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self
            .driver
            .id()
            .and_then(|pid| rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)))
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Where the screenshots go.
fn artifacts() -> anyhow::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webview");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn screenshot(page: &Client, name: &str) -> anyhow::Result<()> {
    let png = page.screenshot().await?;
    anyhow::ensure!(png.starts_with(b"\x89PNG"), "not a PNG");
    let path = artifacts()?.join(format!("{name}.png"));
    std::fs::write(&path, png)?;
    eprintln!("screenshot: {}", path.display());
    Ok(())
}

/// The page's text of every element `css` finds, once `ok` holds for them.
async fn steps_until(
    page: &Client,
    what: &str,
    css: &str,
    ok: impl Fn(&[String]) -> bool,
) -> anyhow::Result<Vec<String>> {
    let last = std::sync::Mutex::new(Vec::new());
    let found = until(what, Duration::from_secs(30), || async {
        let mut texts = Vec::new();
        for element in page.find_all(Locator::Css(css)).await.ok()? {
            texts.push(element.text().await.ok()?);
        }
        let done = ok(&texts);
        if let Ok(mut last) = last.lock() {
            last.clone_from(&texts);
        }
        done.then_some(texts)
    })
    .await;
    found.map_err(|e| anyhow::anyhow!("{e}; the page showed {:?}", last.lock().map(|l| l.clone())))
}

/// Clicks what `css` finds, finding it again if the page redrew it in between.
async fn click(page: &Client, css: &str) -> anyhow::Result<()> {
    until(
        &format!("a click on {css}"),
        Duration::from_secs(30),
        || async {
            let element = page.find(Locator::Css(css)).await.ok()?;
            element.click().await.ok()
        },
    )
    .await
}

/// Waits for `css` to match; if it never does, the error holds what the page showed (and a
/// screenshot of it is saved).
async fn visible(page: &Client, css: &str) -> anyhow::Result<()> {
    let found = page
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await;
    if let Err(e) = found {
        let _ = screenshot(page, "failed").await;
        let shown = page
            .find(Locator::Css("body"))
            .await?
            .text()
            .await
            .unwrap_or_default();
        anyhow::bail!("'{css}' never showed ({e}); the page showed:\n{shown}");
    }
    Ok(())
}

/// Picks the option `label` of the select `css`, as a person does.
async fn pick(page: &Client, css: &str, label: &str) -> anyhow::Result<()> {
    page.find(Locator::Css(css))
        .await?
        .select_by_label(label)
        .await?;
    Ok(())
}

/// The browser the page is tested in, which `./test.sh` installs: without it the test fails
/// (a page nobody looked at is not a page that works).
fn browser_is_installed() -> anyhow::Result<()> {
    anyhow::ensure!(
        Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists(),
        "{CHROMIUM} or {CHROMEDRIVER} is missing, so the page cannot be tested (./test.sh installs them: apt-get install chromium chromium-driver)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_signs_in_watches_a_worker_and_its_task_live_and_stops_it_from_the_page()
-> anyhow::Result<()> {
    browser_is_installed()?;
    // Besides the scripted agent, a bubblewrap sandbox whose profile declares a role.
    let workdir = tempfile::tempdir()?;
    let profiles = format!(
        "{}{}role = \"backend\"\n",
        fleet_testkit::fleet::sim_profile("sim", &[])?,
        fleet_testkit::fleet::bwrap_profile("boxed", workdir.path())?
    );
    let fleet = Fleet::start("", &profiles).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let token = fleet.token("lead")?;
    let browser = Browser::start().await?;
    let page = browser.page()?;
    page.goto(&format!("{}/ui", fleet.base())).await?;
    visible(page, "#signin:not([hidden]) #token").await?;

    // A token that is not a lead's: back to the form, saying so.
    page.find(Locator::Css("#token"))
        .await?
        .send_keys("fleet_not-a-token")
        .await?;
    page.find(Locator::Css("#signin-button"))
        .await?
        .click()
        .await?;
    visible(page, "#signin-error:not([hidden])").await?;
    // The lead's token, pasted once.
    page.find(Locator::Css("#token"))
        .await?
        .send_keys(&token)
        .await?;
    page.find(Locator::Css("#signin-button"))
        .await?
        .click()
        .await?;
    visible(page, "#live[data-live='true']").await?;
    let who = page.find(Locator::Css("#who")).await?.text().await?;
    assert_eq!(who, "lead @ testhost");
    // The session cookie is out of the page's scripts' reach.
    let cookies = page.execute("return document.cookie", vec![]).await?;
    assert_eq!(cookies, json!(""), "an HttpOnly cookie");
    let cookie = page.get_named_cookie("fleetd_session").await?;
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");

    // The lead spawns a worker: it appears on the page without a reload.
    lead.spawn("sim", "w1").await?;
    visible(page, "#entities tr[data-name='w1'][data-status='idle']").await?;
    screenshot(page, "1-worker-spawned").await?;

    // A sandboxed one shows what it runs in and what its profile is for; w1 and the lead,
    // neither.
    lead.spawn("boxed", "b1").await?;
    let spawned_as = "#entities tr td.spawned-as";
    let shown = steps_until(page, "b1 in its sandbox", spawned_as, |cells| {
        cells.len() == 3 && cells.iter().any(|c| c == "bwrap · backend")
    })
    .await?;
    let b1 = page
        .find(Locator::Css("#entities tr[data-name='b1'] td.spawned-as"))
        .await?
        .text()
        .await?;
    assert_eq!(b1, "bwrap · backend", "{shown:?}");
    for name in ["w1", "lead"] {
        let cell = page
            .find(Locator::Css(&format!(
                "#entities tr[data-name='{name}'] td.spawned-as"
            )))
            .await?
            .text()
            .await?;
        assert_eq!(cell, "-", "{name}: {shown:?}");
    }
    let header = page
        .find(Locator::Css("#entities thead"))
        .await?
        .text()
        .await?;
    assert!(header.contains("Sandbox · role"), "{header}");
    screenshot(page, "1b-sandboxed-worker").await?;

    // A task that takes a while, its text hostile markup: the page shows it in flight, then
    // answered, and never as markup.
    let sender = fleet.lead("lead", Protocol::Stateless).await?;
    let sending = tokio::spawn(async move {
        sender
            .ok(
                "fleet_send",
                json!({"to": "w1", "message": "/slow 3000 <img id=pwned src=x>", "wait_s": 30}),
            )
            .await
    });
    visible(page, "#entities tr[data-name='w1'][data-status='busy']").await?;
    screenshot(page, "2-task-in-flight").await?;
    let sent = sending.await??;
    assert_eq!(sent["status"], "replied", "{sent}");
    let task = sent["msg_id"].as_str().unwrap_or_default().to_string();
    let trail = format!("#messages tr[data-msg-id='{task}'] td.trail span");
    let states = steps_until(
        page,
        "the task's states up to its reply",
        &trail,
        |states| states.last().is_some_and(|s| s == "replied"),
    )
    .await?;
    assert_eq!(
        super::from_taken(&states),
        ["injecting", "injected", "replied"]
    );
    let reply_row = "#messages tr[data-kind='REPLY'][data-to='lead'] td.trail span";
    let reply_states = steps_until(page, "the reply taken", reply_row, |states| {
        states.last().is_some_and(|s| s == "consumed")
    })
    .await?;
    assert!(reply_states.contains(&"consumed".to_string()));
    assert!(
        page.find(Locator::Css("#pwned")).await.is_err(),
        "a task's text never becomes markup"
    );

    // Its screen, read-only: what the program shows, the hostile text as text.
    click(page, "#entities tr[data-name='w1'] button.show-screen").await?;
    let screen = until("w1's screen", Duration::from_secs(30), || async {
        let text = page
            .find(Locator::Css("#screen-text"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.contains("[replied]").then_some(text)
    })
    .await?;
    assert!(screen.contains("<img id=pwned src=x>"), "{screen}");
    assert!(page.find(Locator::Css("#pwned")).await.is_err());
    screenshot(page, "3-task-replied-and-screen").await?;

    // The session cookie opens nothing without the key the page got at sign-in: a program on
    // another loopback port that the browser sends the cookie to gets nowhere with it, and
    // neither does a request from the page that leaves the key out.
    let cookie = format!("fleetd_session={}", cookie.value());
    let key = page
        .execute(
            "return sessionStorage.getItem('fleetd-session-key')",
            vec![],
        )
        .await?;
    let key = key.as_str().unwrap_or_default().to_string();
    assert!(key.starts_with("fleet_"), "{key}");
    let http = reqwest::Client::new();
    let with = |path: &str, key: Option<&str>| {
        let mut request = http
            .get(format!("{}{path}", fleet.base()))
            .header("cookie", &cookie);
        if let Some(key) = key {
            request = request.header("x-fleet-session-key", key);
        }
        request.send()
    };
    assert_eq!(with("/api/v1/roster", Some(&key)).await?.status(), 200);
    for path in ["/api/v1/roster", "/ui/me", "/api/v1/screen?name=w1"] {
        assert_eq!(with(path, None).await?.status(), 401, "{path}");
        assert_eq!(with(path, Some(&cookie)).await?.status(), 401, "{path}");
    }
    let forged = page
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/api/v1/stop', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                    body: JSON.stringify({to: 'w1'})})
               .then(r => done(r.status));",
            vec![],
        )
        .await?;
    assert_eq!(forged, json!(401));
    let listed = lead.ok("fleet_list", json!({})).await?;
    assert!(listed.to_string().contains("\"w1\""), "w1 still runs");

    // A task that fails stands out, with its reason.
    lead.spawn("sim", "w2").await?;
    let crashed = lead
        .ok(
            "fleet_send",
            json!({"to": "w2", "message": "/crash", "wait_s": 30}),
        )
        .await?;
    let failed = crashed["msg_id"].as_str().unwrap_or_default().to_string();
    let reason = steps_until(
        page,
        "the failed task highlighted with its reason",
        &format!("#messages tr.failed[data-msg-id='{failed}'] td:last-child"),
        |cells| cells.iter().any(|c| c.contains("ended before replying")),
    )
    .await?;
    assert_eq!(reason.len(), 1, "{reason:?}");
    let trail = format!("#messages tr[data-msg-id='{failed}'] td.trail span");
    let states = steps_until(page, "the failed task's states", &trail, |s| {
        s.last().is_some_and(|s| s == "failed")
    })
    .await?;
    assert_eq!(
        super::from_taken(&states),
        ["injecting", "injected", "failed"]
    );
    screenshot(page, "4-failure-highlighted").await?;

    // Stopped from the page: one click arms the button, the second stops. The first is a press
    // that a redraw of the table falls between (the feed redraws it on every event, and on a
    // timer): the button pressed is still the button released, so the click takes.
    let stop = "#entities tr[data-name='w1'] button.stop";
    let armed = "#entities tr[data-name='w1'] button.stop.armed";
    let button = page.find(Locator::Css(stop)).await?;
    page.perform_actions(
        MouseActions::new("mouse".into())
            .then(PointerAction::MoveToElement {
                element: button,
                duration: None,
                x: 0.0,
                y: 0.0,
            })
            .then(PointerAction::Down {
                button: MOUSE_BUTTON_LEFT,
            }),
    )
    .await?;
    let redrawn = page
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const first = () => document.querySelector(\"#entities tr[data-name='w1'] td\");
             const before = first();
             refresh();
             const look = () => (first() !== before ? done(true) : setTimeout(look, 10));
             look();",
            vec![],
        )
        .await?;
    assert_eq!(redrawn, json!(true));
    page.perform_actions(MouseActions::new("mouse".into()).then(PointerAction::Up {
        button: MOUSE_BUTTON_LEFT,
    }))
    .await?;
    visible(page, armed).await?;
    let label = page.find(Locator::Css(armed)).await?.text().await?;
    assert_eq!(label, "Confirm stop");
    click(page, stop).await?;
    until("w1 gone from the page", Duration::from_secs(30), || async {
        page.find(Locator::Css("#entities tr[data-name='w1']"))
            .await
            .is_err()
            .then_some(())
    })
    .await?;
    let listed = lead.ok("fleet_list", json!({})).await?;
    assert!(!listed.to_string().contains("\"w1\""), "{listed}");
    let feed = steps_until(page, "the feed telling w1 went", "#feed li", |lines| {
        lines.iter().any(|l| l.ends_with("worker w1 gone"))
    })
    .await?;
    assert!(
        feed.iter()
            .any(|l| l.contains("message SEND lead → w1 injected")),
        "{feed:#?}"
    );
    screenshot(page, "5-worker-stopped").await?;

    // Signed out: back to the form, and the session opens nothing any more, key or not.
    click(page, "#signout").await?;
    visible(page, "#signin:not([hidden])").await?;
    assert_eq!(with("/api/v1/roster", Some(&key)).await?.status(), 401);
    browser.close().await?;
    Ok(())
}

/// Signs `page` in at `base` with `token`, and waits for the live page.
async fn sign_in(page: &Client, base: &str, token: &str) -> anyhow::Result<()> {
    page.goto(&format!("{base}/ui")).await?;
    visible(page, "#signin:not([hidden]) #token").await?;
    page.find(Locator::Css("#token"))
        .await?
        .send_keys(token)
        .await?;
    page.find(Locator::Css("#signin-button"))
        .await?
        .click()
        .await?;
    visible(page, "#live[data-live='true']").await
}

/// With a busy fleet (a page of messages longer than the window), a worker's screen opens where
/// the eye is: in the window, under the workers, not below the whole message list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screen_opens_in_view_however_many_messages_there_are() -> anyhow::Result<()> {
    browser_is_installed()?;
    let fleet = Fleet::start("", &fleet_testkit::fleet::sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    lead.spawn("sim", "w1").await?;
    for i in 0..30 {
        lead.send("w1", &format!("task {i}"), 0).await?;
    }
    let browser = Browser::start().await?;
    let page = browser.page()?;
    sign_in(page, &fleet.base(), &fleet.token("lead")?).await?;
    steps_until(page, "the messages listed", "#messages tbody tr", |rows| {
        rows.len() >= 30
    })
    .await?;
    let tall = page
        .execute(
            "return document.getElementById('messages').getBoundingClientRect().bottom > window.innerHeight",
            vec![],
        )
        .await?;
    assert_eq!(
        tall,
        json!(true),
        "the messages fit the window: the test shows nothing"
    );
    click(page, "#entities tr[data-name='w1'] button.show-screen").await?;
    visible(page, "#screen:not([hidden])").await?;
    let placed = page
        .execute(
            "const r = document.getElementById('screen').getBoundingClientRect();
             const m = document.getElementById('messages').getBoundingClientRect();
             return {top: r.top, bottom: r.bottom, height: window.innerHeight, above_messages: r.bottom <= m.top};",
            vec![],
        )
        .await?;
    let (top, height) = (placed["top"].as_f64(), placed["height"].as_f64());
    assert!(
        top.zip(height)
            .is_some_and(|(top, height)| top >= 0.0 && top < height),
        "the screen opened out of sight: {placed}"
    );
    assert_eq!(placed["above_messages"], json!(true), "{placed}");
    screenshot(page, "busy-fleet-screen").await?;
    browser.close().await?;
    Ok(())
}

/// Issue 30 in the browser: alice's task text, her worker's reply and screen, and a stalled
/// worker's screen tail never show on the page of another lead (bob) or of a read-only operator
/// (prom), though both see her workers, their owner and their states; only alice's page offers
/// her workers' screens and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_lead_and_a_read_only_operator_read_nothing_of_a_leads_work_on_the_page()
-> anyhow::Result<()> {
    browser_is_installed()?;
    let sim = fleet_testkit::fleet::sim_profile;
    let fleet = Fleet::start(
        "",
        &format!(
            "[leads.alice]\n[leads.bob]\n\n[operators.prom]\nread_only = true\n\n{}{}stall_after_s = 1\non_stall = \"recycle\"\n",
            sim("sim", &[])?,
            sim("slow", &[])?
        ),
    )
    .await?;
    let alice = fleet.lead("alice", Protocol::Stateless).await?;
    alice.spawn("sim", "w1").await?;
    alice.spawn("slow", "ws").await?;
    let sent = alice.send("w1", "remember SECRET-TASK-1", 20).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    let stalled = alice.send("ws", "/never SECRET-STALL-2", 20).await?;
    assert_eq!(stalled["status"], "failed", "{stalled}");
    let reason = stalled["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("SECRET-STALL-2"),
        "its owner reads it: {stalled}"
    );
    let secrets = ["SECRET-TASK-1", "SECRET-STALL-2"];

    let browser = Browser::start().await?;
    let page = browser.page()?;
    // Alice's own page offers her workers' screens and stops.
    sign_in(page, &fleet.base(), &fleet.token("alice")?).await?;
    visible(page, "#entities tr[data-name='w1'] button.show-screen").await?;
    click(page, "#signout").await?;
    visible(page, "#signin:not([hidden])").await?;
    for (who, token, messages) in [
        ("bob", fleet.token("bob")?, None),
        (
            "prom",
            fleet.token("prom")?,
            Some("#messages tr[data-kind='FAILED']"),
        ),
    ] {
        sign_in(page, &fleet.base(), &token).await?;
        visible(page, "#entities tr[data-name='w1']").await?;
        visible(page, "#entities tr[data-name='ws']").await?;
        // The operator lists every message's state and reason: the stall's failure among them.
        if let Some(css) = messages {
            visible(page, css).await?;
        }
        let row = page
            .find(Locator::Css("#entities tr[data-name='w1']"))
            .await?
            .text()
            .await?;
        assert!(row.contains("alice"), "{who} sees w1's owner: {row}");
        for css in ["button.show-screen", "button.stop"] {
            assert!(
                page.find_all(Locator::Css(&format!("#entities tr[data-name='w1'] {css}")))
                    .await?
                    .is_empty(),
                "{who}'s page offers {css} on alice's worker"
            );
        }
        screenshot(page, &format!("tenancy-{who}")).await?;
        let shown = page.source().await?;
        for secret in secrets {
            assert!(!shown.contains(secret), "{who}'s page shows {secret}");
        }
        click(page, "#signout").await?;
        visible(page, "#signin:not([hidden])").await?;
    }
    browser.close().await?;
    Ok(())
}

/// Issue 36: the page of a busy fleet (16 workers, over 300 messages) lists its messages a page
/// at a time and filters them by whom they involve, state and kind, as a person picks them; the
/// filters stay in the address, so a reload keeps them. The screenshots of it are the docs'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_fleets_messages_page_and_filter_on_the_page() -> anyhow::Result<()> {
    browser_is_installed()?;
    let fleet = Fleet::start("", &fleet_testkit::fleet::sim_profile("sim", &[])?).await?;
    let lead = fleet.lead("lead", Protocol::Stateless).await?;
    let workers: Vec<String> = (1..=16).map(|i| format!("w{i:02}")).collect();
    for name in &workers {
        lead.spawn("sim", name).await?;
    }
    for round in 0..10 {
        for name in &workers {
            lead.send(name, &format!("task {round} for {name}"), 0)
                .await?;
        }
    }
    let token = fleet.token("lead")?;
    let listed = |query: &'static str| {
        let (url, token) = (
            format!("{}/api/v1/messages?{query}", fleet.base()),
            token.clone(),
        );
        async move {
            let client = reqwest::Client::new();
            let page: Value = client
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            page["total"].as_u64()
        }
    };
    until("every task answered", Duration::from_secs(60), || async {
        (listed("kind=REPLY").await? == 160).then_some(())
    })
    .await?;
    // One task typed, which its worker never answers: it fails when the worker is stopped.
    let sent = lead.send("w16", "/never answered", 0).await?;
    let task = sent["msg_id"].as_str().unwrap_or_default().to_string();
    until("the last task typed", Duration::from_secs(30), || async {
        (listed("state=injected&with=w16").await? == 11).then_some(())
    })
    .await?;
    lead.ok("fleet_stop", json!({"to": "w16"})).await?;
    let browser = Browser::start().await?;
    let page = browser.page()?;
    sign_in(page, &fleet.base(), &fleet.token("lead")?).await?;
    // 160 tasks, their 160 replies, the unanswered one and its failure notice.
    let range = |texts: &[String], says: &str| texts.first().is_some_and(|t| t == says);
    steps_until(page, "all the messages counted", "#page-range", |t| {
        range(t, "1–50 of 322")
    })
    .await?;
    // Read in one go: the page draws its rows afresh whenever the feed tells of a change (the
    // stopped worker's last ones may still be coming), so rows found one call may be gone the
    // next.
    let ids = || async {
        let ids = page
            .execute(
                "return [...document.querySelectorAll('#messages tbody tr')].map((r) => r.dataset.msgId || '')",
                vec![],
            )
            .await?;
        anyhow::Ok(serde_json::from_value::<Vec<String>>(ids)?)
    };
    let first = ids().await?;
    assert_eq!(first.len(), 50);
    click(page, "#page-older").await?;
    steps_until(page, "the second page", "#page-range", |t| {
        range(t, "51–100 of 322")
    })
    .await?;
    let second = ids().await?;
    assert_eq!(second.len(), 50);
    assert!(
        second.iter().all(|id| !first.contains(id)),
        "a page repeats the one before"
    );
    // A task and its reply arrive while the second page is read: it shows the same messages,
    // now two further down.
    let sent = lead.send("w01", "one more", 20).await?;
    assert_eq!(sent["status"], "replied", "{sent}");
    steps_until(page, "the page two further down", "#page-range", |t| {
        range(t, "53–102 of 324")
    })
    .await?;
    assert_eq!(ids().await?, second, "the page read stays as it was");
    click(page, "#page-newer").await?;
    steps_until(page, "back to the first page", "#page-range", |t| {
        range(t, "1–50 of 324")
    })
    .await?;
    let newest = ids().await?;
    assert_eq!(newest[2..], first[..48], "the first page, two further down");

    // By whom: w03's ten tasks and their ten replies.
    pick(page, "#filter-with", "w03").await?;
    steps_until(page, "w03's messages", "#page-range", |t| {
        range(t, "1–20 of 20")
    })
    .await?;
    for row in page.find_all(Locator::Css("#messages tbody tr")).await? {
        let (from, to) = (row.attr("data-from").await?, row.attr("data-to").await?);
        assert!(
            from.as_deref() == Some("w03") || to.as_deref() == Some("w03"),
            "{from:?} → {to:?} listed with w03"
        );
    }
    page.execute(
        "document.getElementById('filters').scrollIntoView()",
        vec![],
    )
    .await?;
    screenshot(page, "busy-fleet-filtered").await?;
    // And of a kind: its replies only.
    pick(page, "#filter-kind", "REPLY").await?;
    let kinds = steps_until(
        page,
        "w03's replies",
        "#messages tbody tr td:nth-child(2)",
        |t| t.len() == 10,
    )
    .await?;
    assert!(kinds.iter().all(|k| k == "REPLY"), "{kinds:?}");
    // A reload keeps the filters, from the address.
    let address = page.current_url().await?;
    assert!(
        address
            .fragment()
            .is_some_and(|f| f.contains("with=w03") && f.contains("kind=REPLY")),
        "{address}"
    );
    page.refresh().await?;
    steps_until(page, "the filters kept over a reload", "#page-range", |t| {
        range(t, "1–10 of 10")
    })
    .await?;
    // By state, from anyone: the one task that failed, and nothing else.
    pick(page, "#filter-with", "anyone").await?;
    pick(page, "#filter-kind", "any").await?;
    pick(page, "#filter-state", "failed").await?;
    steps_until(page, "the failed task alone", "#page-range", |t| {
        range(t, "1–1 of 1")
    })
    .await?;
    assert_eq!(ids().await?, [task]);
    pick(page, "#filter-state", "any").await?;
    steps_until(page, "every message again", "#page-range", |t| {
        range(t, "1–50 of 324")
    })
    .await?;
    // The docs' picture: the whole page, the fleet and a page of its messages.
    let tall = page
        .execute("return document.documentElement.scrollHeight", vec![])
        .await?
        .as_u64()
        .and_then(|h| u32::try_from(h).ok())
        .unwrap_or(2000);
    page.set_window_size(1280, tall + 120).await?;
    screenshot(page, "busy-fleet").await?;
    browser.close().await?;
    Ok(())
}
