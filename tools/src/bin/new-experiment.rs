//! `new-experiment NAME`: scaffold an experiment crate under `experiments/` (a library with its
//! `Experiment` implementation and a thin binary) wired to `common`, plus a manifest on the `tiny`
//! generated model, and register it: one line in `tools/src/registry.rs` and its crate in
//! `tools/Cargo.toml`. It builds, runs, audits and reports as it is.

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::workspace::Workspace;

#[derive(Parser)]
#[command(about = "Scaffold a new experiment crate and its manifest")]
struct Cli {
    /// Crate and binary name: lower-case letters, digits and dashes, starting with a letter.
    name: String,
}

/// Binaries of the tools crate; a new experiment must not shadow them (crate names are checked
/// against the folders under `crates/` and `experiments/`).
const TAKEN: [&str; 5] = ["audit", "models", "new-experiment", "reproduce", "report"];

const REGISTRY: &str = "tools/src/registry.rs";
const TOOLS_MANIFEST: &str = "tools/Cargo.toml";

const FILES: [(&str, &str); 5] = [
    ("experiments/__NAME__/Cargo.toml", include_str!("../../templates/experiment/Cargo.toml.tmpl")),
    ("experiments/__NAME__/build.rs", include_str!("../../templates/experiment/build.rs.tmpl")),
    ("experiments/__NAME__/src/lib.rs", include_str!("../../templates/experiment/lib.rs.tmpl")),
    ("experiments/__NAME__/src/main.rs", include_str!("../../templates/experiment/main.rs.tmpl")),
    ("manifests/__NAME__/tiny.json", include_str!("../../templates/experiment/manifest.json.tmpl")),
];

fn main() {
    tools::main(run)
}

/// Rust's keywords, strict and reserved, in every edition: none can name a module (the crate's
/// identifier is its name with `_` for `-`).
const KEYWORDS: [&str; 53] = [
    "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn", "for", "if", "impl", "in",
    "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait",
    "true", "type", "unsafe", "use", "where", "while", "async", "await", "dyn", "abstract", "become", "box", "do",
    "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen", "union", "raw",
];

/// Crates every Rust program can name: a crate of this name would shadow them.
const BUILTIN_CRATES: [&str; 5] = ["std", "core", "alloc", "proc_macro", "test"];

/// Binary names cargo forbids (they are folders of its target directory), and names Windows
/// reserves for devices.
const FORBIDDEN_BINARIES: [&str; 26] = [
    "build",
    "deps",
    "examples",
    "incremental",
    "con",
    "prn",
    "aux",
    "nul",
    "com1",
    "com2",
    "com3",
    "com4",
    "com5",
    "com6",
    "com7",
    "com8",
    "com9",
    "lpt1",
    "lpt2",
    "lpt3",
    "lpt4",
    "lpt5",
    "lpt6",
    "lpt7",
    "lpt8",
    "lpt9",
];

/// Names the prelude gives every module: the generated type must not shadow them.
const PRELUDE: [&str; 24] = [
    "Box", "String", "Vec", "Option", "Some", "None", "Result", "Ok", "Err", "Clone", "Copy", "Default", "Drop", "Eq",
    "Fn", "FnMut", "FnOnce", "From", "Into", "Iterator", "Ord", "Send", "Sized", "Sync",
];

/// Why `name` cannot become an experiment's crate, binary, module and type, checked before
/// anything is written: `None` when it can. `packages` are the names in `Cargo.lock` (every
/// dependency, whose name a crate would clash with in the tools' manifest), `templates` the text
/// of what the scaffold writes (whose identifiers the generated type must not shadow).
fn refusal(name: &str, packages: &[String], templates: &[&str]) -> Option<String> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--");
    if !valid {
        return Some("use lower-case letters, digits and dashes, starting with a letter (e.g. `prefill-sweep`)".into());
    }
    let ident = name.replace('-', "_");
    if KEYWORDS.contains(&ident.as_str()) {
        return Some(format!("`{ident}` is a Rust keyword and cannot name a module"));
    }
    if BUILTIN_CRATES.contains(&ident.as_str()) {
        return Some(format!("`{ident}` would shadow Rust's own `{ident}` crate"));
    }
    if FORBIDDEN_BINARIES.contains(&name) {
        return Some(format!("cargo forbids `{name}` as a binary name"));
    }
    if TAKEN.contains(&name) {
        return Some("the workspace tools have a binary of that name".into());
    }
    if packages.iter().any(|p| p.replace('-', "_") == ident) {
        return Some(format!(
            "a package named `{name}` is already in Cargo.lock (a dependency or a crate of this workspace)"
        ));
    }
    let type_name = type_name(name);
    let words = |t: &&str| t.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == type_name);
    if PRELUDE.contains(&type_name.as_str()) || templates.iter().any(words) {
        return Some(format!("its type `{type_name}` would clash with a name the generated code uses"));
    }
    None
}

/// The experiment's type: its name in upper camel case (`prefill-sweep` -> `PrefillSweep`).
fn type_name(name: &str) -> String {
    name.split('-').filter(|p| !p.is_empty()).map(|part| part[..1].to_ascii_uppercase() + &part[1..]).collect()
}

/// The package names `Cargo.lock` lists.
fn locked_packages(lock: &str) -> Vec<String> {
    lock.lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .map(str::to_string)
        .collect()
}

fn run(cli: Cli) -> Result<()> {
    let name = cli.name.as_str();
    let ws = Workspace::discover()?;
    let lock = std::fs::read_to_string(ws.root.join("Cargo.lock")).context("reading Cargo.lock")?;
    let templates: Vec<&str> = FILES.iter().map(|(_, t)| *t).collect();
    if let Some(why) = refusal(name, &locked_packages(&lock), &templates) {
        bail!("NAME `{name}`: {why}; pick another");
    }
    let crate_taken = ["crates", "experiments"].iter().any(|dir| ws.root.join(dir).join(name).exists());
    if crate_taken {
        bail!("NAME `{name}` is already a crate or binary of this workspace; pick another");
    }
    for (path, _) in FILES {
        let path = ws.root.join(path.replace("__NAME__", name));
        if path.exists() {
            bail!("{} already exists; experiment `{name}` is taken, pick another name", ws.display_path(&path));
        }
    }
    // Both registrations are checked before anything is written, so a failure leaves no half.
    let ident = name.replace('-', "_");
    let type_name = type_name(name);
    let registry_path = ws.root.join(REGISTRY);
    let registry = std::fs::read_to_string(&registry_path).with_context(|| format!("reading {REGISTRY}"))?;
    let registry = register(&registry, "\n];", &format!("    &{ident}::{type_name},\n"))
        .with_context(|| format!("{REGISTRY} has no `];` line closing the list; restore it from git"))?;
    let tools_path = ws.root.join(TOOLS_MANIFEST);
    let tools = std::fs::read_to_string(&tools_path).with_context(|| format!("reading {TOOLS_MANIFEST}"))?;
    let tools =
        register(&tools, "\n\n[dev-dependencies]", &format!("{name} = {{ path = \"../experiments/{name}\" }}\n"))
            .with_context(|| {
                format!("{TOOLS_MANIFEST} has no [dev-dependencies] section after its experiments; restore it from git")
            })?;

    for (path, template) in FILES {
        let path = ws.root.join(path.replace("__NAME__", name));
        std::fs::create_dir_all(path.parent().context("file has a folder")?)?;
        let text = template.replace("__NAME__", name).replace("__IDENT__", &ident).replace("__TYPE__", &type_name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("created {}", ws.display_path(&path));
    }
    common::artifact::write_replace(&registry_path, registry.as_bytes())?;
    common::artifact::write_replace(&tools_path, tools.as_bytes())?;
    println!("registered it in {REGISTRY} and {TOOLS_MANIFEST}");
    println!(
        "\nrun it: cargo run -p {name}   (`just reproduce` now includes it)\nthen commit its schemas: UPDATE_SCHEMAS=1 cargo test -p tools --test schemas"
    );
    Ok(())
}

/// `text` with `line` inserted before the last line starting with `before` (a newline, then the
/// end of the registry's list, or the section after the tools' experiment dependencies); `None`
/// when there is none.
fn register(text: &str, before: &str, line: &str) -> Option<String> {
    // `before` starts with a newline: insert after it, at the start of the next line.
    let at = text.rfind(before)? + 1;
    Some(format!("{}{line}{}", &text[..at], &text[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_cannot_become_a_crate_a_binary_a_module_and_a_type_are_refused() {
        let packages: Vec<String> = ["clap", "anyhow", "tempfile", "serde_json", "serving-bench", "common"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let templates: Vec<&str> = FILES.iter().map(|(_, t)| *t).collect();
        let refused = |n: &str| refusal(n, &packages, &templates);
        for name in [
            "clap",
            "anyhow",
            "tempfile",
            "serde-json",
            "serving-bench",
            "common",
            "build",
            "deps",
            "examples",
            "incremental",
            "async",
            "fn",
            "self",
            "std",
            "core",
            "type",
            "try",
            "gen",
            "audit",
            "report",
            "experiment",
            "artifact",
            "parameters",
            "vec",
            "option",
            "Bad",
            "9lives",
            "a--b",
            "b-",
            "",
        ] {
            assert!(refused(name).is_some(), "`{name}` was accepted");
        }
        for name in ["prefill-sweep", "kv-budget", "demo", "a1", "x-2-y", "builder", "types"] {
            assert_eq!(refused(name), None, "`{name}` was refused");
        }
        assert!(refused("async").unwrap().contains("keyword"));
        assert!(refused("clap").unwrap().contains("Cargo.lock"));
        assert!(refused("build").unwrap().contains("cargo forbids"));
        assert_eq!(locked_packages("[[package]]\nname = \"clap\"\nversion = \"4\"\n"), vec!["clap".to_string()]);
    }
}
