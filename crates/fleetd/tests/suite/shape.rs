//! The shape of the code, as the next developer meets it: no function of the shipped crates
//! over 80 lines, and no source file of the gateway over 500 (tests aside). Read from the
//! sources with `syn`, so a function is measured from its `fn` to its closing brace.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 80;
/// The longest a gateway source file may be, in lines (its unit tests aside).
const MAX_GATEWAY_FILE_LINES: usize = 500;
/// The crates that ship (the testkit is test support: its benches and stand-ins are not).
const SHIPPED: [&str; 5] = [
    "fleetd",
    "fleet-core",
    "fleet-store",
    "fleet-amqp",
    "fleet-mux",
];

/// The workspace's `crates/` directory.
fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Whether `path` holds only tests (a module the crate includes under `cfg(test)`).
fn test_only(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    matches!(name, "tests.rs" | "testing.rs") || name.ends_with("_tests.rs")
}

/// Every Rust source under `dir` but test-only files, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !test_only(&path) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Whether `attrs` hold `#[cfg(test)]`, `#[test]` or an async runtime's test attribute.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        path.is_ident("test")
            || path.segments.last().is_some_and(|s| s.ident == "test")
            || (path.is_ident("cfg")
                && attr
                    .parse_args::<syn::Ident>()
                    .is_ok_and(|arg| arg == "test"))
    })
}

/// The functions of one file over [`MAX_FN_LINES`]: each as `path:line name (n lines)`.
struct LongFns<'a> {
    path: &'a Path,
    found: Vec<String>,
}

impl LongFns<'_> {
    fn measure(&mut self, name: &syn::Ident, from: proc_macro2::Span, block: &syn::Block) {
        let (start, end) = (from.start().line, block.brace_token.span.close().end().line);
        let lines = end.saturating_sub(start) + 1;
        if lines > MAX_FN_LINES {
            self.found.push(format!(
                "{}:{start} {name} ({lines} lines)",
                self.path.display()
            ));
        }
    }
}

impl<'ast> Visit<'ast> for LongFns<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            self.measure(&item.sig.ident, item.sig.span(), &item.block);
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            self.measure(&item.sig.ident, item.sig.span(), &item.block);
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            self.measure(&item.sig.ident, item.sig.span(), block);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

#[test]
fn no_function_of_the_shipped_crates_is_over_80_lines() -> anyhow::Result<()> {
    let mut long = Vec::new();
    let mut files = 0;
    for krate in SHIPPED {
        for path in sources(&crates_dir().join(krate).join("src")) {
            let file = syn::parse_file(&std::fs::read_to_string(&path)?)
                .map_err(|e| anyhow::anyhow!("{} does not parse: {e}", path.display()))?;
            let mut finder = LongFns {
                path: &path,
                found: Vec::new(),
            };
            finder.visit_file(&file);
            long.extend(finder.found);
            files += 1;
        }
    }
    // The walk saw the tree: a path gone wrong would find nothing and pass.
    assert!(files > 100, "only {files} source files found");
    assert!(
        long.is_empty(),
        "over {MAX_FN_LINES} lines: cut them into named steps\n{}",
        long.join("\n")
    );
    Ok(())
}

#[test]
fn no_gateway_source_file_is_over_500_lines() -> anyhow::Result<()> {
    let gateway = crates_dir().join("fleetd/src/gateway");
    let mut long = Vec::new();
    let files = sources(&gateway);
    assert!(files.len() > 30, "only {} gateway files found", files.len());
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        // A file's own unit tests, at its end, are not what a reader of the code wades through.
        let code = text
            .find("\n#[cfg(test)]\nmod tests {")
            .map_or(text.as_str(), |at| &text[..at]);
        let lines = code.lines().count();
        if lines > MAX_GATEWAY_FILE_LINES {
            long.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_GATEWAY_FILE_LINES} lines: split them by concern\n{}",
        long.join("\n")
    );
    Ok(())
}
