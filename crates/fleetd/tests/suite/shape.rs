//! The shape of the code, as the next developer meets it: no function of the shipped crates
//! over 80 lines, no source file of the gateway over 500 (tests aside), and the gateway a thin
//! front over planes that do not reach into each other. Read from the sources with `syn`, so a
//! function is measured from its `fn` to its closing brace.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 80;
/// The longest a gateway source file may be, in lines (its unit tests aside).
const MAX_GATEWAY_FILE_LINES: usize = 500;
/// The most statements a method of the gateway's front may hold: it hands the call on.
const MAX_FRONT_STATEMENTS: usize = 5;
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

/// The inherent `impl NAME` blocks of one file, for NAME in `types`: each method as
/// `(type, method, statements)`.
fn methods_of(file: &syn::File, types: &[&str]) -> Vec<(String, String, usize)> {
    let mut found = Vec::new();
    for item in &file.items {
        let syn::Item::Impl(block) = item else {
            continue;
        };
        let syn::Type::Path(ty) = block.self_ty.as_ref() else {
            continue;
        };
        let Some(name) = ty.path.get_ident().map(ToString::to_string) else {
            continue;
        };
        if block.trait_.is_some() || is_test(&block.attrs) || !types.contains(&name.as_str()) {
            continue;
        }
        for member in &block.items {
            if let syn::ImplItem::Fn(method) = member {
                let statements = method.block.stmts.len();
                found.push((name.clone(), method.sig.ident.to_string(), statements));
            }
        }
    }
    found
}

#[test]
fn the_gateway_is_a_thin_front_over_planes_that_keep_to_themselves() -> anyhow::Result<()> {
    let gateway = crates_dir().join("fleetd/src/gateway");
    let mut wrong = Vec::new();
    let (mut front, mut local) = (0, 0);
    for path in sources(&gateway) {
        let file = syn::parse_file(&std::fs::read_to_string(&path)?)
            .map_err(|e| anyhow::anyhow!("{} does not parse: {e}", path.display()))?;
        let shown = path
            .strip_prefix(&gateway)
            .unwrap_or(&path)
            .display()
            .to_string();
        let in_federation = shown.starts_with("federation/");
        for (ty, method, statements) in methods_of(&file, &["Gateway", "LocalPlane", "Federation"])
        {
            match ty.as_str() {
                "Gateway" if shown != "front.rs" => {
                    wrong.push(format!(
                        "{shown}: Gateway::{method} (the front's methods live in front.rs)"
                    ));
                }
                "Gateway" if statements > MAX_FRONT_STATEMENTS => {
                    wrong.push(format!("{shown}: Gateway::{method} has {statements} statements: the front hands calls on, a plane does them"));
                }
                "Gateway" => front += 1,
                "LocalPlane" if in_federation => {
                    wrong.push(format!("{shown}: LocalPlane::{method} (the federation takes the local plane, it does not extend it)"));
                }
                "LocalPlane" => local += 1,
                "Federation" if !in_federation => {
                    wrong.push(format!(
                        "{shown}: Federation::{method} (the federation's acts live in federation/)"
                    ));
                }
                _ => {}
            }
        }
        // The local plane reaches other hosts through its seam only: outside federation/, the
        // federation's type is named by the front that holds it and the module that declares it.
        let text = std::fs::read_to_string(&path)?;
        if !in_federation
            && !matches!(shown.as_str(), "mod.rs" | "front.rs")
            && text.lines().any(|l| {
                !l.trim_start().starts_with("//")
                    && l.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .any(|word| word == "Federation")
            })
        {
            wrong.push(format!(
                "{shown} names the Federation type: reach other hosts through afar"
            ));
        }
    }
    // The walk saw the types: a path or a name gone wrong would find none and pass.
    assert!(front >= 20, "only {front} methods of the front found");
    assert!(local >= 50, "only {local} methods of the local plane found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}
