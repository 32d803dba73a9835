//! Every ```toml block of the README parses as fleetd's config, the way `fleetd serve` loads a
//! file ([`Config::parse`]: the schema with unknown keys refused, then the checks of
//! `validate`), so an example a user copies is one fleetd takes.
//!
//! A block that opens on bare keys, with no table header before them (the bubblewrap `runtime`
//! recipe), is a fragment of the table the README shows before it: its keys are set over the
//! last table that the previous block declares, and that whole block is parsed.

use std::path::Path;

use super::Config;

/// The README, as the test binary was built with it.
const README: &str = include_str!("../../../../README.md");

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

/// What is wrong with `markdown`'s ```toml blocks: one line per block that does not load,
/// naming the README line of its fence.
fn failures(markdown: &str) -> Vec<String> {
    let blocks = toml_blocks(markdown);
    let mut failures = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let text = if is_fragment(&block.text) {
            let Some(before) = i.checked_sub(1).and_then(|j| blocks.get(j)) else {
                failures.push(format!(
                    "README.md line {}: a fragment with no block before it",
                    block.line
                ));
                continue;
            };
            match merged(&before.text, &block.text) {
                Ok(text) => text,
                Err(e) => {
                    failures.push(format!(
                        "README.md line {}: cannot set its keys over the block at line {}: {e}",
                        block.line, before.line
                    ));
                    continue;
                }
            }
        } else {
            block.text.clone()
        };
        if let Err(e) = Config::parse(Path::new("README.md"), &text) {
            failures.push(format!(
                "README.md line {}: the block does not load (its own lines count from the fence): {e}",
                block.line
            ));
        }
    }
    failures
}

#[test]
fn every_toml_block_in_the_readme_is_a_config_fleetd_loads() {
    let found = toml_blocks(README).len();
    assert!(found >= 4, "found only {found} ```toml blocks");
    let failures = failures(README);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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
    let failures = failures(markdown);
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
    for pattern in [&p.configure, &p.write, &p.read, &p.roster_write] {
        assert!(
            README.contains(&format!("'{pattern}'")),
            "the README's rabbitmqctl lines lack '{pattern}'"
        );
    }
}
