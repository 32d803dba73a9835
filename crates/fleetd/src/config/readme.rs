//! Every ```toml block of the README and of the pages under `docs/` parses as fleetd's config,
//! the way `fleetd serve` loads a file ([`Config::parse`]: the schema with unknown keys refused,
//! then the checks of `validate`), so an example a user copies is one fleetd takes. The README
//! stays a short page (at most [`README_LINES`] lines), and every link between the pages leads
//! to a file and a heading that exist.
//!
//! A block that opens on bare keys, with no table header before them (the bubblewrap `runtime`
//! recipe), is a fragment of the table the page shows before it: its keys are set over the
//! last table that the previous block declares, and that whole block is parsed.

use std::path::{Path, PathBuf};

use super::Config;

/// The most lines the README may have: what fleetd is, how to start, and where to read on.
const README_LINES: usize = 300;

/// The repository's root, where the README is.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and every page under `docs/`: each path from the root, and its text.
fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    names.extend(pages);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(root().join(&name)).unwrap();
            (name, text)
        })
        .collect()
}

/// A fenced ```toml block: the README line of its fence, and its text (its indentation, when
/// it sits in a list item, taken off).
struct Block {
    line: usize,
    text: String,
}

/// The ```toml blocks of `markdown`.
fn toml_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((at, line)) = lines.next() {
        let indent = line.len() - line.trim_start().len();
        if line.trim() != "```toml" {
            continue;
        }
        let text: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim() != "```")
            .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
            .collect();
        blocks.push(Block {
            line: at + 1,
            text: text.join("\n") + "\n",
        });
    }
    blocks
}

/// Whether `text` sets keys before any table header (a fragment of a table).
fn is_fragment(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .is_some_and(|l| !l.starts_with('['))
}

/// `fragment`'s keys set over the last table `whole` declares (`[a]`: that table; `[[a]]`: the
/// last entry of that array), as TOML text.
fn merged(whole: &str, fragment: &str) -> Result<String, String> {
    let header = whole
        .lines()
        .rev()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .find(|l| l.starts_with('['))
        .ok_or("the block before it declares no table")?;
    let path = header.trim_matches(['[', ']']);
    let mut document: toml::Table = toml::from_str(whole).map_err(|e| e.to_string())?;
    let mut table = &mut document;
    for key in path.split('.').map(str::trim) {
        table = match table.get_mut(key) {
            Some(toml::Value::Table(inner)) => inner,
            Some(toml::Value::Array(entries)) => match entries.last_mut() {
                Some(toml::Value::Table(inner)) => inner,
                _ => return Err(format!("[[{path}]] has no table entry")),
            },
            _ => return Err(format!("no table [{path}]")),
        };
    }
    let keys: toml::Table = toml::from_str(fragment).map_err(|e| e.to_string())?;
    table.extend(keys);
    toml::to_string(&document).map_err(|e| e.to_string())
}

/// What is wrong with the ```toml blocks of `markdown` (the document `name`): one line per block
/// that does not load, naming the document and the line of its fence.
fn failures(name: &str, markdown: &str) -> Vec<String> {
    let blocks = toml_blocks(markdown);
    let mut failures = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let text = if is_fragment(&block.text) {
            let Some(before) = i.checked_sub(1).and_then(|j| blocks.get(j)) else {
                failures.push(format!(
                    "{name} line {}: a fragment with no block before it",
                    block.line
                ));
                continue;
            };
            match merged(&before.text, &block.text) {
                Ok(text) => text,
                Err(e) => {
                    failures.push(format!(
                        "{name} line {}: cannot set its keys over the block at line {}: {e}",
                        block.line, before.line
                    ));
                    continue;
                }
            }
        } else {
            block.text.clone()
        };
        if let Err(e) = Config::parse(Path::new(name), &text) {
            failures.push(format!(
                "{name} line {}: the block does not load (its own lines count from the fence): {e}",
                block.line
            ));
        }
    }
    failures
}

#[test]
fn every_toml_block_in_the_readme_and_the_docs_is_a_config_fleetd_loads() {
    let documents = documents();
    let found: usize = documents
        .iter()
        .map(|(_, text)| toml_blocks(text).len())
        .sum();
    assert!(found >= 4, "found only {found} ```toml blocks");
    let failures: Vec<String> = documents
        .iter()
        .flat_map(|(name, text)| failures(name, text))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A heading's anchor, as GitHub makes it: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The links of `markdown` to other pages of this repository (not to the web), outside code
/// blocks: each target path (relative to the page) and anchor.
fn local_links(markdown: &str) -> Vec<(String, Option<String>)> {
    let mut links = Vec::new();
    let mut code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
        }
        if code {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path.to_string(), Some(fragment.to_string())),
                None => (target.to_string(), None),
            };
            links.push((path, fragment));
        }
    }
    links
}

#[test]
fn the_readme_is_short_and_every_link_between_the_pages_leads_somewhere() {
    let documents = documents();
    let readme = &documents[0].1;
    let lines = readme.lines().count();
    assert!(
        lines <= README_LINES,
        "the README has {lines} lines (at most {README_LINES}): move the rest into docs/"
    );
    assert!(
        documents.len() >= 8,
        "{:?}",
        documents.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let mut broken = Vec::new();
    let mut count = 0;
    for (name, text) in &documents {
        let dir = Path::new(name).parent().unwrap_or(Path::new(""));
        for (path, fragment) in local_links(text) {
            count += 1;
            let target = if path.is_empty() {
                PathBuf::from(name)
            } else {
                dir.join(&path)
            };
            if !root().join(&target).exists() {
                broken.push(format!("{name}: no file {}", target.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let page = std::fs::read_to_string(root().join(&target)).unwrap_or_default();
                let found = page
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .map(|l| anchor(l.trim_start_matches('#')))
                    .any(|a| a == fragment);
                if !found {
                    broken.push(format!(
                        "{name}: no heading #{fragment} in {}",
                        target.display()
                    ));
                }
            }
        }
    }
    assert!(count >= 20, "only {count} links between the pages");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn anchors_and_links_are_read_as_github_reads_them() {
    assert_eq!(
        anchor(" Dialogs: a worker that waits for a key"),
        "dialogs-a-worker-that-waits-for-a-key"
    );
    assert_eq!(anchor("Delivery, as promised"), "delivery-as-promised");
    let links = local_links(
        "see [a](docs/x.md#b-c), [web](https://e.x/y), [here](#top)\n```\n[no](z.md)\n```\n",
    );
    assert_eq!(
        links,
        [
            ("docs/x.md".to_string(), Some("b-c".to_string())),
            (String::new(), Some("top".to_string()))
        ]
    );
}

#[test]
fn a_block_that_does_not_load_is_named_by_its_line() {
    let markdown = "# x\n\n```toml\n[gateway]\nlisten = \"127.0.0.1:1\"\n```\n\n  ```toml\n  bogus = 1\n  ```\n\n```toml\n[mux]\nkind = \"screen\"\n```\n";
    let blocks = toml_blocks(markdown);
    assert_eq!(
        blocks.iter().map(|b| b.line).collect::<Vec<_>>(),
        vec![3, 8, 12]
    );
    // The indented fragment is set over [gateway], where it is an unknown key.
    assert_eq!(blocks[1].text, "bogus = 1\n");
    let failures = failures("README.md", markdown);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures[0].starts_with("README.md line 8: ")
            && failures[0].contains("unknown field `bogus`"),
        "{failures:?}"
    );
    assert!(
        failures[1].starts_with("README.md line 12: ") && failures[1].contains("screen"),
        "{failures:?}"
    );
}

#[test]
fn the_broker_permissions_the_readme_shows_are_the_ones_fleetd_needs() {
    // The same patterns the broker-login test applies with rabbitmqctl.
    let p = fleet_amqp::gateway_permissions("build-box");
    let federation = std::fs::read_to_string(root().join("docs/federation.md")).unwrap();
    for pattern in [&p.configure, &p.write, &p.read, &p.roster_write] {
        assert!(
            federation.contains(&format!("'{pattern}'")),
            "docs/federation.md's rabbitmqctl lines lack '{pattern}'"
        );
    }
}
