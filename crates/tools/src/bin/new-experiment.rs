//! `new-experiment NAME`: scaffold an experiment crate under `experiments/` (a library with its
//! `Experiment` implementation and a thin binary) wired to `common`, plus a manifest on the `tiny`
//! generated model, and register it: one line in `crates/tools/src/registry.rs` and its crate in
//! `crates/tools/Cargo.toml`. It builds, runs, audits and reports as it is.

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

const REGISTRY: &str = "crates/tools/src/registry.rs";
const TOOLS_MANIFEST: &str = "crates/tools/Cargo.toml";

const FILES: [(&str, &str); 5] = [
    ("experiments/__NAME__/Cargo.toml", include_str!("../../templates/experiment/Cargo.toml.tmpl")),
    ("experiments/__NAME__/build.rs", include_str!("../../templates/experiment/build.rs.tmpl")),
    ("experiments/__NAME__/src/lib.rs", include_str!("../../templates/experiment/lib.rs.tmpl")),
    ("experiments/__NAME__/src/main.rs", include_str!("../../templates/experiment/main.rs.tmpl")),
    ("manifests/__NAME__/tiny.json", include_str!("../../templates/experiment/manifest.json.tmpl")),
];

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let name = cli.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--");
    if !valid {
        bail!(
            "NAME `{name}`: use lower-case letters, digits and dashes, starting with a letter (e.g. `prefill-sweep`)"
        );
    }
    let ws = Workspace::discover()?;
    let crate_taken = ["crates", "experiments"].iter().any(|dir| ws.root.join(dir).join(name).exists());
    if TAKEN.contains(&name) || crate_taken {
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
    let type_name: String = name.split('-').map(|part| part[..1].to_ascii_uppercase() + &part[1..]).collect();
    let registry_path = ws.root.join(REGISTRY);
    let registry = std::fs::read_to_string(&registry_path).with_context(|| format!("reading {REGISTRY}"))?;
    let registry = register(&registry, "\n];", &format!("    &{ident}::{type_name},\n"))
        .with_context(|| format!("{REGISTRY} has no `];` line closing the list; restore it from git"))?;
    let tools_path = ws.root.join(TOOLS_MANIFEST);
    let tools = std::fs::read_to_string(&tools_path).with_context(|| format!("reading {TOOLS_MANIFEST}"))?;
    let tools =
        register(&tools, "\n\n[dev-dependencies]", &format!("{name} = {{ path = \"../../experiments/{name}\" }}\n"))
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
