//! The source hash of an experiment: SHA-256 over the files of the workspace crates its binary
//! links (the experiment's crate and, through the dependency graph, every workspace crate it
//! depends on, build-dependencies included) and the `Cargo.lock` entries of every package it
//! links; nothing else.
//!
//! One function serves both sides of the contract: an experiment's `build.rs` bakes the hash into
//! the binary (so an artifact says which code made it), and the audit recomputes it from the
//! working tree (so a reviewer learns whether the code changed since). Both must agree byte for
//! byte, which is why this is its own tiny crate usable as a build-dependency.
//!
//! So editing the audit, the report or another experiment (or adding a dependency to one of them)
//! leaves an artifact fresh, and editing the engine it runs, or changing the version of a
//! package it links, makes it stale. Of each crate, its tests, benches and examples are not
//! hashed (they are not linked into the binary); everything else is (sources, build script,
//! manifest, bundled assets), identified by its path relative to the workspace root, so moving
//! the checkout does not change the hash.
//!
//! Of a Rust source or a `Cargo.toml`, what is hashed is what the compiler reads, not how it is
//! laid out ([`content`]): a source's tokens without its comments (doc comments too, which reach
//! only `--help` texts and schema descriptions, never a number a run records) and a manifest's
//! values without its comments and spacing. So a review's comment or `cargo fmt` stales nothing,
//! and a changed literal, name or operator stales what links it. Other files (templates, corpora,
//! configs) are read byte for byte: the code reads them as data.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Top-level folders of a crate that are not linked into its binary and so are not hashed.
const UNLINKED: [&str; 4] = ["tests", "benches", "examples", "target"];

/// Why the hashed roots could not be found: a manifest that cannot be read or parsed.
#[derive(Debug)]
pub struct GraphError(pub String);

impl std::fmt::Display for GraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GraphError {}

impl From<GraphError> for io::Error {
    fn from(e: GraphError) -> Self {
        io::Error::other(e.0)
    }
}

/// The workspace crates `crate_dir` links, itself first, as paths relative to `workspace`
/// (forward slashes): its `[dependencies]` and `[build-dependencies]` (also under `[target.*]`)
/// that are path dependencies, directly or through `[workspace.dependencies]`, followed
/// transitively. Dev-dependencies are not linked into the binary and are not followed.
pub fn linked_crates(workspace: &Path, crate_dir: &str) -> Result<Vec<String>, GraphError> {
    let root_toml = read_toml(&workspace.join("Cargo.toml"))?;
    // Workspace dependency name -> crate dir, for `name.workspace = true`.
    let mut shared: BTreeMap<String, String> = BTreeMap::new();
    if let Some(deps) = root_toml.get("workspace").and_then(|w| w.get("dependencies")).and_then(|d| d.as_table()) {
        for (name, spec) in deps {
            if let Some(path) = spec.get("path").and_then(|p| p.as_str()) {
                shared.insert(name.clone(), normalize(path));
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    let mut stack = vec![normalize(crate_dir)];
    while let Some(dir) = stack.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let manifest = read_toml(&workspace.join(&dir).join("Cargo.toml"))?;
        order.push(dir.clone());
        let mut next = Vec::new();
        for (name, spec) in linked_tables(&manifest).into_iter().flatten() {
            if let Some(path) = spec.get("path").and_then(|p| p.as_str()) {
                next.push(normalize(&format!("{dir}/{path}")));
            } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                next.extend(shared.get(name).cloned());
            }
        }
        next.sort();
        stack.extend(next.into_iter().rev());
    }
    Ok(order)
}

/// The files an experiment's source hash reads, relative to `workspace`: the top-level entries of
/// every crate it links (their tests, benches and examples left out) and `Cargo.lock` (of which
/// [`hash_crate`] hashes only the linked packages' entries).
pub fn hashed_roots(workspace: &Path, crate_dir: &str) -> io::Result<Vec<String>> {
    let mut roots = Vec::new();
    for dir in linked_crates(workspace, crate_dir)? {
        let mut entries: Vec<String> = fs::read_dir(workspace.join(&dir))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        entries.retain(|name| !name.starts_with('.') && !UNLINKED.contains(&name.as_str()));
        entries.sort();
        roots.extend(entries.into_iter().map(|name| format!("{dir}/{name}")));
    }
    roots.push(LOCK.to_string());
    Ok(roots)
}

const LOCK: &str = "Cargo.lock";

/// The `Cargo.lock` entries of every package the crate at `crate_dir` links, one line each
/// (`name version source checksum: dependencies`), sorted: from the workspace crates it links
/// (their normal and build dependencies, as their manifests name them), through the lock's own
/// dependency lists of everything else. A dev-dependency, or a dependency of a crate it does not
/// link, is not among them, so adding one to the audit or a test stales no artifact.
pub fn linked_lock(workspace: &Path, crate_dir: &str) -> Result<String, GraphError> {
    let lock = read_toml(&workspace.join(LOCK))?;
    let packages: Vec<&toml::Table> = lock
        .get("package")
        .and_then(|p| p.as_array())
        .map(|a| a.iter().filter_map(|p| p.as_table()).collect())
        .unwrap_or_default();
    let text = |t: &toml::Table, key: &str| t.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let deps = |t: &toml::Table| -> Vec<String> {
        let list = t.get("dependencies").and_then(|d| d.as_array());
        list.map(|a| a.iter().filter_map(|d| d.as_str().map(str::to_string)).collect()).unwrap_or_default()
    };
    // A lock dependency is `name`, `name version` or `name version (source)`.
    let find = |spec: &str| -> Option<usize> {
        let mut words = spec.split(' ');
        let (name, version) = (words.next().unwrap_or_default(), words.next());
        packages.iter().position(|p| text(p, "name") == name && version.is_none_or(|v| text(p, "version") == v))
    };
    let mut linked = BTreeSet::new();
    let mut stack = Vec::new();
    for dir in linked_crates(workspace, crate_dir)? {
        let manifest = read_toml(&workspace.join(&dir).join("Cargo.toml"))?;
        let name = manifest.get("package").and_then(|p| p.get("name")).and_then(|n| n.as_str()).unwrap_or_default();
        let linked_names = linked_dependency_names(&manifest);
        let Some(entry) = packages.iter().position(|p| text(p, "name") == name && p.get("source").is_none()) else {
            return Err(GraphError(format!("{LOCK}: no entry for the workspace crate `{name}`; run `cargo build`")));
        };
        linked.insert(entry);
        for spec in deps(packages[entry]) {
            if linked_names.contains(spec.split(' ').next().unwrap_or_default()) {
                stack.extend(find(&spec));
            }
        }
    }
    while let Some(i) = stack.pop() {
        if linked.insert(i) && packages[i].get("source").is_some() {
            stack.extend(deps(packages[i]).iter().filter_map(|d| find(d)));
        }
    }
    let mut lines: Vec<String> = linked
        .into_iter()
        .map(|i| {
            let p = packages[i];
            let (name, version, source, sum) =
                (text(p, "name"), text(p, "version"), text(p, "source"), text(p, "checksum"));
            format!("{name} {version} {source} {sum}: {}\n", deps(p).join(", "))
        })
        .collect();
    lines.sort();
    Ok(lines.concat())
}

/// The package names a crate's manifest links: its normal and build dependencies (also under
/// `[target.*]`), a renamed one by its package name.
fn linked_dependency_names(manifest: &toml::Table) -> BTreeSet<String> {
    let tables = linked_tables(manifest);
    let specs = tables.into_iter().flatten();
    specs.map(|(name, spec)| spec.get("package").and_then(|p| p.as_str()).unwrap_or(name).to_string()).collect()
}

/// A manifest's dependency tables that are linked into its binary: `[dependencies]` and
/// `[build-dependencies]`, also under `[target.*]` (not `[dev-dependencies]`).
fn linked_tables(manifest: &toml::Table) -> Vec<&toml::Table> {
    let mut tables = Vec::new();
    for key in ["dependencies", "build-dependencies"] {
        tables.extend(manifest.get(key).and_then(|t| t.as_table()));
        if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
            tables.extend(targets.values().filter_map(|t| t.get(key)).filter_map(|t| t.as_table()));
        }
    }
    tables
}

fn read_toml(path: &Path) -> Result<toml::Table, GraphError> {
    let text = fs::read_to_string(path).map_err(|e| GraphError(format!("{}: {e}", path.display())))?;
    text.parse::<toml::Table>().map_err(|e| GraphError(format!("{}: {e}", path.display())))
}

/// `a/b/../c/./d/` -> `a/c/d`: crate paths as written in manifests, made comparable.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The result of hashing: the hex digest and the files it covered (relative paths, sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceHash {
    pub sha256: String,
    pub files: Vec<String>,
}

/// The source hash of the crate at `crate_dir` (relative to `workspace`): its [`hashed_roots`],
/// with `Cargo.lock` standing for the [`linked_lock`] entries only.
pub fn hash_crate(workspace: &Path, crate_dir: &str) -> io::Result<SourceHash> {
    let roots: Vec<String> = hashed_roots(workspace, crate_dir)?.into_iter().filter(|r| r != LOCK).collect();
    let lock = linked_lock(workspace, crate_dir)?;
    hash_with(workspace, &roots, Some(lock.as_bytes()))
}

/// Hashes the given roots (files or directories relative to `workspace`), with `lock` (if given)
/// as the content of `Cargo.lock`.
///
/// The digest is SHA-256 over one line per file, `"<relative path>\0<sha256 of its content>\n"`
/// ([`content`]), in sorted path order: independent of the walk order and of the checkout's
/// location.
fn hash_with(workspace: &Path, roots: &[String], lock: Option<&[u8]>) -> io::Result<SourceHash> {
    let mut files = Vec::new();
    for root in roots {
        collect(workspace, &workspace.join(root), &mut files)?;
    }
    if lock.is_some() {
        files.push(LOCK.to_string());
    }
    files.sort();
    files.dedup();
    let mut outer = Sha256::new();
    for rel in &files {
        let inner = match lock {
            Some(lock) if rel == LOCK => Sha256::digest(lock),
            _ => Sha256::digest(content(rel, fs::read(workspace.join(rel))?)),
        };
        outer.update(rel.as_bytes());
        outer.update([0u8]);
        outer.update(hex(&inner).as_bytes());
        outer.update(b"\n");
    }
    Ok(SourceHash { sha256: hex(&outer.finalize()), files })
}

/// What of a file the hash reads: a Rust source's tokens ([`tokens`]) and a `Cargo.toml`'s values
/// ([`toml_values`]); any other file, or one that does not parse (which no build would accept),
/// byte for byte.
fn content(rel: &str, bytes: Vec<u8>) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&bytes) else { return bytes };
    let canonical = if rel.ends_with(".rs") {
        text.parse::<TokenStream>().ok().map(|stream| {
            let mut out = String::new();
            tokens(stream, &mut out);
            out
        })
    } else if rel == "Cargo.toml" || rel.ends_with("/Cargo.toml") {
        text.parse::<toml::Table>().ok().map(|table| {
            let mut out = String::new();
            toml_values(&toml::Value::Table(table), &mut out);
            out
        })
    } else {
        None
    };
    canonical.map(String::into_bytes).unwrap_or(bytes)
}

/// A token stream written one token at a time, each followed by a space unless it is a
/// punctuation mark joined to the next (`->` stays distinct from `- >`); literals as written
/// (`0x10` is not `16` to a reader of the code, and a string's escapes stay). Comments are not
/// tokens; doc comments are (`#[doc = "…"]`, inner or outer) and are left out here, as is any
/// other `doc` attribute.
fn tokens(stream: TokenStream, out: &mut String) {
    let trees: Vec<TokenTree> = stream.into_iter().collect();
    let is_doc = |tree: Option<&TokenTree>| match tree {
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket => {
            matches!(g.stream().into_iter().next(), Some(TokenTree::Ident(i)) if i == "doc")
        }
        _ => false,
    };
    let mut i = 0;
    while i < trees.len() {
        if let TokenTree::Punct(p) = &trees[i] {
            if p.as_char() == '#' {
                let inner = matches!(trees.get(i + 1), Some(TokenTree::Punct(b)) if b.as_char() == '!');
                let attribute = if inner { i + 2 } else { i + 1 };
                if is_doc(trees.get(attribute)) {
                    i = attribute + 1;
                    continue;
                }
            }
        }
        match &trees[i] {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                out.push(' ');
                tokens(g.stream(), out);
                out.push_str(close);
                out.push(' ');
            }
            TokenTree::Punct(p) => {
                out.push(p.as_char());
                if p.spacing() == Spacing::Alone {
                    out.push(' ');
                }
            }
            TokenTree::Ident(ident) => {
                out.push_str(&ident.to_string());
                out.push(' ');
            }
            TokenTree::Literal(literal) => {
                out.push_str(&literal.to_string());
                out.push(' ');
            }
        }
        i += 1;
    }
}

/// A TOML value written canonically: tables by sorted key, strings quoted as JSON would, one
/// value per line; comments, spacing and the order of keys are not values.
fn toml_values(value: &toml::Value, out: &mut String) {
    match value {
        toml::Value::Table(table) => {
            let mut keys: Vec<&String> = table.keys().collect();
            keys.sort();
            out.push('{');
            for key in keys {
                out.push_str(&format!("{key:?}="));
                toml_values(&table[key.as_str()], out);
                out.push('\n');
            }
            out.push('}');
        }
        toml::Value::Array(items) => {
            out.push('[');
            for item in items {
                toml_values(item, out);
                out.push(',');
            }
            out.push(']');
        }
        toml::Value::String(s) => out.push_str(&format!("{s:?}")),
        toml::Value::Integer(n) => out.push_str(&n.to_string()),
        toml::Value::Float(x) => out.push_str(&format!("{x:?}")),
        toml::Value::Boolean(b) => out.push_str(&b.to_string()),
        toml::Value::Datetime(d) => out.push_str(&d.to_string()),
    }
}

fn collect(workspace: &Path, path: &Path, out: &mut Vec<String>) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_file() {
        let rel = path
            .strip_prefix(workspace)
            .map_err(|_| io::Error::other(format!("{} is outside the workspace", path.display())))?;
        // Forward slashes so the hash is the same on every platform.
        let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        out.push(rel.join("/"));
    } else if meta.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect::<io::Result<_>>()?;
        entries.sort();
        for entry in entries {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            collect(workspace, &entry, out)?;
        }
    }
    Ok(())
}

/// Lower-case hex of a byte slice.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// For an experiment's `build.rs`: hashes what the experiment links (see [`hashed_roots`]), tells
/// cargo to rerun when any hashed file (or the set of files, or the dependency graph) changes, and exports the build facts the
/// provenance block records (`SOURCE_SHA256`, `SOURCE_FILES`, `BUILD_RUSTC`, `BUILD_TARGET`,
/// `BUILD_PROFILE`, `BUILD_FEATURES`).
pub fn build_script() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from build.rs"));
    let workspace = find_workspace(&manifest_dir).expect("Cargo.lock above the crate");
    let crate_dir =
        manifest_dir.strip_prefix(&workspace).expect("crate inside workspace").to_string_lossy().replace('\\', "/");
    let roots = hashed_roots(&workspace, &crate_dir).expect("the workspace's dependency graph");
    let hashed = hash_crate(&workspace, &crate_dir).expect("hash sources");
    println!("cargo:rerun-if-changed={}", workspace.join("Cargo.toml").display());
    for root in &roots {
        // A directory entry makes cargo rerun when files are added or removed inside it.
        println!("cargo:rerun-if-changed={}", workspace.join(root).display());
    }
    for file in &hashed.files {
        println!("cargo:rerun-if-changed={}", workspace.join(file).display());
    }
    println!("cargo:rustc-env=SOURCE_SHA256={}", hashed.sha256);
    println!("cargo:rustc-env=SOURCE_FILES={}", hashed.files.len());
    println!("cargo:rustc-env=SOURCE_CRATE_DIR={crate_dir}");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_RUSTC={version}");
    println!("cargo:rustc-env=BUILD_TARGET={}", std::env::var("TARGET").unwrap_or_default());
    println!("cargo:rustc-env=BUILD_PROFILE={}", std::env::var("PROFILE").unwrap_or_default());
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_lowercase().replace('_', "-")))
        .collect();
    features.sort();
    println!("cargo:rustc-env=BUILD_FEATURES={}", features.join(","));
}

/// The nearest directory at or above `start` holding `Cargo.lock`.
pub fn find_workspace(start: &Path) -> Option<PathBuf> {
    start.ancestors().find(|d| d.join("Cargo.lock").is_file()).map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_content_and_path_not_location() {
        let a = tempdir("a");
        let b = tempdir("b");
        for root in [&a, &b] {
            fs::create_dir_all(root.join("exp/src")).unwrap();
            fs::write(root.join("exp/src/main.rs"), "fn main() {}").unwrap();
            fs::write(root.join("Cargo.lock"), "lock").unwrap();
            fs::create_dir_all(root.join("exp/target")).unwrap();
            fs::write(root.join("exp/target/junk"), "ignored").unwrap();
        }
        let roots = vec!["exp".to_string(), "Cargo.lock".to_string()];
        let ha = hash_with(&a, &roots, None).unwrap();
        let hb = hash_with(&b, &roots, None).unwrap();
        assert_eq!(ha, hb);
        assert_eq!(ha.files, vec!["Cargo.lock", "exp/src/main.rs"]);

        fs::write(b.join("exp/src/main.rs"), "fn main() { () }").unwrap();
        assert_ne!(hash_with(&b, &roots, None).unwrap().sha256, ha.sha256);
        fs::write(b.join("exp/src/main.rs"), "fn main() {}").unwrap();
        fs::rename(b.join("exp/src/main.rs"), b.join("exp/src/lib.rs")).unwrap();
        assert_ne!(hash_with(&b, &roots, None).unwrap().sha256, ha.sha256);
        fs::remove_dir_all(&a).unwrap();
        fs::remove_dir_all(&b).unwrap();
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("source-hash-test-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn comments_and_layout_leave_a_source_alone_and_code_moves_it() {
        let base = "//! A module.\n\n/// Adds.\npub fn add(a: u8) -> u8 {\n    a + 1 // one\n}\n";
        let hashed = |text: &str| content("src/lib.rs", text.as_bytes().to_vec());
        let same = [
            "//! Another module.\n/// Adds one.\npub fn add(a: u8) -> u8 { a + 1 }\n",
            "pub fn add(a: u8)\n    -> u8\n{\n    /* block */ a + 1\n}\n",
            "#![doc = \"written out\"]\n#[doc = \"and here\"]\npub fn add(a: u8) -> u8 {\n\ta+1\n}\n",
            "/** Block doc. */\npub fn add(a: u8) -> u8 { a + 1 } // trailing\n",
        ];
        for edit in same {
            assert_eq!(hashed(edit), hashed(base), "{edit:?} changed the hashed content");
        }
        let moved = [
            "pub fn add(a: u8) -> u8 { a + 2 }\n",
            "pub fn add(a: u8) -> u8 { a + 0x1 }\n",
            "pub fn add(b: u8) -> u8 { b + 1 }\n",
            "pub fn add(a: u8) -> u8 { a - 1 }\n",
            "fn add(a: u8) -> u8 { a + 1 }\n",
            "#[inline]\npub fn add(a: u8) -> u8 { a + 1 }\n",
            "pub fn add(a: u8) -> u8 { a + 1 }\nconst S: &str = \"// not a comment\";\n",
        ];
        for edit in moved {
            assert_ne!(hashed(edit), hashed(base), "{edit:?} left the hashed content");
        }
        // Joined punctuation stays joined: `->` is not `- >`.
        assert_ne!(hashed("fn f() -> u8 { 0 }"), hashed("fn f() - > u8 { 0 }"));
        // A string's text is code: a comment marker inside one is not a comment.
        assert_ne!(hashed("const S: &str = \"a // b\";"), hashed("const S: &str = \"a // c\";"));
    }

    #[test]
    fn a_manifest_hashes_its_values_and_other_files_their_bytes() {
        let toml = |text: &str| content("crates/x/Cargo.toml", text.as_bytes().to_vec());
        let base = "[package]\nname = \"x\" # the name\nversion = \"0.1.0\"\n";
        assert_eq!(toml("# a comment\n[package]\nversion=\"0.1.0\"\n\nname = \"x\"\n"), toml(base));
        assert_ne!(toml("[package]\nname = \"x\"\nversion = \"0.1.1\"\n"), toml(base));
        let json = "{\"a\": 1} // kept\n";
        assert_eq!(content("assets/x.json", json.as_bytes().to_vec()), json.as_bytes());
        // A source that is not Rust (no build would take it) is read as bytes.
        assert_eq!(content("src/bad.rs", b"fn (".to_vec()), b"fn (");
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}
