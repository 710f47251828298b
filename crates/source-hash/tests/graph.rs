//! The hash covers what an experiment's binary links, on this workspace's real dependency graph:
//! editing the audit, the report, another experiment or a test leaves an artifact fresh; editing
//! the engine, the experiment itself or the lock entry of a package it links makes it stale.

use source_hash::{find_workspace, hash_crate, linked_crates, linked_lock};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn real() -> std::path::PathBuf {
    find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn an_experiment_links_the_layers_below_it_and_nothing_beside_or_above() {
    let mut crates = linked_crates(&real(), "experiments/scheduler").unwrap();
    assert_eq!(crates[0], "experiments/scheduler");
    crates.sort();
    assert_eq!(
        crates,
        [
            "crates/common",
            "crates/engine",
            "crates/records",
            "crates/source-hash",
            "crates/supply",
            "experiments/scheduler"
        ]
    );
}

#[test]
fn editing_what_it_does_not_link_leaves_the_hash_and_editing_what_it_links_changes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("experiments")).unwrap();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "tools", "experiments/scheduler", "experiments/serving-bench"] {
        let status = Command::new("cp").arg("-r").arg(real().join(item)).arg(root.join(item)).status().unwrap();
        assert!(status.success(), "copying {item}");
    }
    let hash = || hash_crate(root, "experiments/scheduler").unwrap().sha256;
    let before = hash();
    // Code, not a comment: a comment edits nothing the hash reads (below).
    let append = |file: &str| {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str("\nconst _EDITED: u8 = 0;\n");
        std::fs::write(&path, text).unwrap();
    };
    for unlinked in [
        "crates/audit/src/lib.rs",
        "crates/report/src/lib.rs",
        "tools/src/registry.rs",
        "experiments/serving-bench/src/lib.rs",
        "crates/engine/tests/new_test.rs",
        "crates/common/benches/verify.rs",
    ] {
        append(unlinked);
        assert_eq!(hash(), before, "editing {unlinked} changed the scheduler's source hash");
    }
    for linked in ["crates/engine/src/qwen.rs", "experiments/scheduler/src/lib.rs"] {
        let was = hash();
        append(linked);
        assert_ne!(hash(), was, "editing {linked} left the scheduler's source hash unchanged");
    }

    // Cargo.lock: a package only the report links (plotters), or only the serving benchmark
    // (axum), or only a dev-dependency (criterion), is not the scheduler's; candle-core is.
    let lock = format!("\n{}", linked_lock(root, "experiments/scheduler").unwrap());
    assert!(lock.contains("\ncandle-core ") && lock.contains("\nserde "), "{lock}");
    for other in ["plotters", "axum", "criterion", "proptest"] {
        assert!(!lock.contains(&format!("\n{other} ")), "the scheduler's lock entries include {other}");
    }
    let edit_entry = |name: &str| {
        let path = root.join("Cargo.lock");
        let text = std::fs::read_to_string(&path).unwrap();
        let entry = format!("[[package]]\nname = \"{name}\"\nversion = \"");
        assert!(text.contains(&entry), "no lock entry for {name}");
        std::fs::write(&path, text.replacen(&entry, &format!("{entry}0.0.0-edited+"), 1)).unwrap();
    };
    for unlinked in ["plotters", "axum", "criterion"] {
        let was = hash();
        edit_entry(unlinked);
        assert_eq!(hash(), was, "editing {unlinked}'s lock entry changed the scheduler's source hash");
    }
    let was = hash();
    edit_entry("candle-core");
    assert_ne!(hash(), was, "editing candle-core's lock entry left the scheduler's source hash unchanged");
}

/// A review's edits to comments and doc comments, in every source file of every crate, stale no
/// experiment's artifacts; one changed literal stales those that link it.
#[test]
fn comment_edits_anywhere_stale_nothing_and_a_literal_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "experiments", "tools"] {
        let status = Command::new("cp").arg("-r").arg(real().join(item)).arg(root.join(item)).status().unwrap();
        assert!(status.success(), "copying {item}");
    }
    let experiments: Vec<String> = std::fs::read_dir(root.join("experiments"))
        .unwrap()
        .map(|e| format!("experiments/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let hashes = || -> Vec<String> { experiments.iter().map(|e| hash_crate(root, e).unwrap().sha256).collect() };
    let before = hashes();
    let mut edited = 0;
    for group in ["crates", "experiments", "tools"] {
        for file in rust_files(&root.join(group)) {
            let text = std::fs::read_to_string(&file).unwrap();
            let lines: Vec<String> = text
                .lines()
                .map(|line| match line.trim_start().strip_prefix("/// ") {
                    Some(doc) => format!("{}/// Reworded: {doc}  ", &line[..line.len() - line.trim_start().len()]),
                    None => line.to_string(),
                })
                .collect();
            std::fs::write(&file, format!("// Reviewed.\n{}\n", lines.join("\n"))).unwrap();
            edited += 1;
        }
    }
    assert!(edited > 50, "only {edited} source files edited");
    assert_eq!(hashes(), before, "a comment or doc-comment edit changed an experiment's source hash");
    let qwen = root.join("crates/engine/src/qwen.rs");
    let text = std::fs::read_to_string(&qwen).unwrap();
    std::fs::write(&qwen, format!("{text}\nconst _EDITED: &str = \"a\";\n")).unwrap();
    let after = hashes();
    assert!(before.iter().zip(&after).all(|(b, a)| b != a), "a new constant in the engine left a hash unchanged");
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The layering rule of ARCHITECTURE.md, from the manifests: each crate links only the layers
/// below it; no library below the tools links an experiment, and no experiment links another,
/// the audit, the report or the tools.
#[test]
fn every_crate_links_only_the_layers_below_it() {
    let root = real();
    let below: [(&str, &[&str]); 9] = [
        ("crates/source-hash", &[]),
        ("crates/supply", &["crates/source-hash"]),
        ("crates/engine", &["crates/supply", "crates/source-hash"]),
        ("crates/records", &["crates/supply", "crates/source-hash"]),
        ("crates/loadgen", &["crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/common", &["crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/audit", &["crates/common", "crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/report", &["crates/common", "crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/serve", &["crates/common", "crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
    ];
    for (krate, allowed) in below {
        let linked = linked_crates(&root, krate).unwrap();
        let extra: Vec<&String> = linked[1..].iter().filter(|c| !allowed.contains(&c.as_str())).collect();
        assert!(extra.is_empty(), "{krate} links {extra:?}, above or beside its layer");
    }
    let experiments: Vec<String> = std::fs::read_dir(root.join("experiments"))
        .unwrap()
        .map(|e| format!("experiments/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert!(experiments.len() >= 3);
    let mut allowed = linked_crates(&root, "crates/common").unwrap();
    allowed.extend(["crates/serve".into(), "crates/loadgen".into()]);
    for experiment in &experiments {
        let linked = linked_crates(&root, experiment).unwrap();
        let extra: Vec<&String> = linked[1..].iter().filter(|c| !allowed.contains(c)).collect();
        assert!(
            extra.is_empty(),
            "{experiment} links {extra:?}: an experiment links `common`, the layers under it, `loadgen` and `serve` only"
        );
    }
}

/// The layering within crates: no module names a sibling that names it back, directly or around
/// a loop (`supply::claim` and `supply::manifest` once did), so that every crate's modules also
/// read bottom up. Edges are read off the source as `crate::` and `super::` paths (a module's
/// own children and ancestors do not count: a parent declares its children).
#[test]
fn no_module_reaches_itself_through_its_siblings() {
    let root = real();
    let mut crates: Vec<PathBuf> = Vec::new();
    for group in ["crates", "experiments"] {
        for entry in std::fs::read_dir(root.join(group)).unwrap() {
            crates.push(entry.unwrap().path());
        }
    }
    crates.push(root.join("tools"));
    let mut loops = Vec::new();
    for krate in crates {
        let modules = modules(&krate.join("src"));
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (module, file) in &modules {
            let text = std::fs::read_to_string(file).unwrap();
            for path in references(&code_of(&text), module) {
                let Some(target) = (0..=path.len()).rev().map(|k| path[..k].to_vec()).find(|p| modules.contains_key(p))
                else {
                    continue;
                };
                if module.starts_with(&target) || target.starts_with(module) {
                    continue;
                }
                let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
                edges.entry(module[..=common].to_vec()).or_default().insert(target[..=common].to_vec());
            }
        }
        if let Some(cycle) = find_cycle(&edges) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            loops.push(format!("{}: {}", krate.display(), names.join(" -> ")));
        }
    }
    assert!(loops.is_empty(), "modules that reach themselves through their siblings: {loops:#?}");
}

/// A crate's library modules by path (`["serving", "record"]`) and the file each is in; binaries
/// (`main.rs`, `src/bin/`) are crates of their own and left out, and so are test modules in files
/// of their own (`#[cfg(test)] mod tests;`), which may reach anywhere in their crate as an inline
/// one may ([`code_of`]).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = all_modules(src);
    let test_only: Vec<Vec<String>> = out
        .keys()
        .filter(|module| {
            let Some((name, parent)) = module.split_last() else { return false };
            let Some(file) = out.get(parent) else { return false };
            let text = std::fs::read_to_string(file).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
            ["", "pub ", "pub(crate) ", "pub(super) "]
                .iter()
                .any(|vis| text.contains(&format!("#[cfg(test)] {vis}mod {name};")))
        })
        .cloned()
        .collect();
    for module in test_only {
        out.remove(&module);
    }
    out
}

/// Every module of the library under `src`, test modules included.
fn all_modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path == src.join("main.rs") {
                continue;
            }
            let mut module: Vec<String> = path
                .strip_prefix(src)
                .unwrap()
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

/// A file's code, every line of it read as Rust tokens: comments, doc comments and the text of
/// literals left out (a string or a doc link that names a module is no reference), and every
/// `#[cfg(test)]` item (a `mod tests` wherever it stands, a test-only `use`), which may reach
/// anywhere in its crate. Rendered with no space around `::`, so that [`references`] reads paths.
fn code_of(text: &str) -> String {
    let stream: proc_macro2::TokenStream = text.parse().unwrap_or_else(|e| panic!("not Rust: {e:?}"));
    let mut out = String::new();
    render(stream, &mut out);
    out
}

fn render(stream: proc_macro2::TokenStream, out: &mut String) {
    use proc_macro2::{Delimiter, TokenTree};
    let trees: Vec<TokenTree> = stream.into_iter().collect();
    let attribute = |i: usize, name: &str| match (trees.get(i), trees.get(i + 1)) {
        (Some(TokenTree::Punct(p)), Some(TokenTree::Group(g))) if p.as_char() == '#' => {
            let inner: Vec<String> = g.stream().into_iter().map(|t| t.to_string()).collect();
            g.delimiter() == Delimiter::Bracket
                && inner.first().is_some_and(|first| first == name)
                && (name != "cfg" || inner.get(1).is_some_and(|args| args.replace(' ', "") == "(test)"))
        }
        _ => false,
    };
    let mut i = 0;
    while i < trees.len() {
        if attribute(i, "doc") {
            i += 2;
            continue;
        }
        if attribute(i, "cfg") {
            // The item it guards ends at its first `;` or brace group at this level.
            i += 2;
            while let Some(tree) = trees.get(i) {
                i += 1;
                match tree {
                    TokenTree::Punct(p) if p.as_char() == ';' => break,
                    TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => break,
                    _ => {}
                }
            }
            continue;
        }
        let word = |out: &mut String, text: &str| {
            if out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '"') {
                out.push(' ');
            }
            out.push_str(text);
        };
        match &trees[i] {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ('(', ')'),
                    Delimiter::Brace => ('{', '}'),
                    Delimiter::Bracket => ('[', ']'),
                    Delimiter::None => (' ', ' '),
                };
                out.push(open);
                render(g.stream(), out);
                out.push(close);
            }
            TokenTree::Ident(ident) => word(out, &ident.to_string()),
            TokenTree::Punct(p) => out.push(p.as_char()),
            TokenTree::Literal(_) => word(out, "\"\""),
        }
        i += 1;
    }
}

/// The module paths `code` in `module` names through `crate::` and `super::`, resolved from the
/// crate's root (`use crate::{a::b, c}` gives `a::b` and `c`).
fn references(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let at = |i: usize, word: &str| bytes[i.min(bytes.len())..].iter().take(word.len()).copied().eq(word.chars());
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !ident(bytes[i - 1]);
        let mut base = match starts_word {
            true if at(i, "crate::") => Vec::new(),
            true if at(i, "super::") => module[..module.len().saturating_sub(1)].to_vec(),
            _ => {
                i += 1;
                continue;
            }
        };
        i += 7;
        // Further `super::`s, then the path.
        while at(i, "super::") {
            base.pop();
            i += 7;
        }
        if bytes.get(i) == Some(&'{') {
            let mut depth = 0;
            let mut part = String::new();
            let mut parts = Vec::new();
            for &c in &bytes[i..] {
                i += 1;
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => parts.push(std::mem::take(&mut part)),
                    _ if depth == 1 => part.push(c),
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
            parts.push(part);
            for p in parts {
                let segments: Vec<String> = p
                    .split("::")
                    .map(str::trim)
                    .take_while(|s| !s.is_empty() && s.chars().all(ident))
                    .map(String::from)
                    .collect();
                out.push([base.clone(), segments].concat());
            }
        } else {
            let mut path = base;
            loop {
                let word: String = bytes[i..].iter().take_while(|&&c| ident(c)).collect();
                if word.is_empty() {
                    break;
                }
                i += word.len();
                path.push(word);
                if at(i, "::") {
                    i += 2;
                } else {
                    break;
                }
            }
            out.push(path);
        }
    }
    out
}

/// A loop in `edges`, as the modules around it (the first repeated at the end), if there is one.
fn find_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if !done.insert(node.clone()) {
            return None;
        }
        path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn a_loop_between_sibling_modules_is_found_and_a_parent_child_pair_is_not_one() {
    let module = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    let code = code_of("use crate::{manifest::Invalid, pin};\n// crate::digest\nuse super::super::x::Y;\n");
    assert_eq!(references(&code, &module("a::b")), [module("manifest::Invalid"), module("pin"), module("x::Y")]);
    // Past a test module in the middle of a file, the code is read on; the tests' own reach,
    // a test-only import, doc comments and strings are not references.
    let code = code_of(
        "/// [`crate::doc`]\nfn f() -> &'static str { \"crate::text\" }\n#[cfg(test)]\nmod tests {\n    use crate::z;\n    fn t() { let _ = '{'; }\n}\n#[cfg(test)]\nuse crate::only_tests;\nuse crate::after::Thing;\n",
    );
    assert_eq!(references(&code, &module("a")), [module("after::Thing")]);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    edges.entry(module("claim")).or_default().insert(module("manifest"));
    assert_eq!(find_cycle(&edges), None);
    edges.entry(module("manifest")).or_default().insert(module("claim"));
    assert_eq!(find_cycle(&edges), Some(vec![module("claim"), module("manifest"), module("claim")]));
}

/// Blocks are the KV pool's unit, and the pool says what they hold (`KvPool::BLOCK_POSITIONS`,
/// `blocks_for`, `blocks_within`): no code outside the engine, tests included, turns positions
/// into blocks with the attention kernel's `TILE`, which may change apart from the pool's blocks.
#[test]
fn no_code_outside_the_engine_names_the_kernel_tile() {
    fn names(stream: proc_macro2::TokenStream, ident: &str) -> bool {
        stream.into_iter().any(|tree| match tree {
            proc_macro2::TokenTree::Ident(i) => i == ident,
            proc_macro2::TokenTree::Group(g) => names(g.stream(), ident),
            _ => false,
        })
    }
    let root = real();
    let mut offenders = Vec::new();
    for group in ["crates", "experiments", "tools"] {
        for file in rust_files(&root.join(group)) {
            if file.starts_with(root.join("crates/engine")) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let stream: proc_macro2::TokenStream = text.parse().unwrap_or_else(|e| panic!("not Rust: {e:?}"));
            if names(stream, "TILE") {
                offenders.push(file.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    assert!(offenders.is_empty(), "the kernel's TILE named outside crates/engine: {offenders:?}");
}
