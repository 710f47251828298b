//! `new-experiment NAME`: scaffold a binary crate under `experiments/` wired to `common`, plus a
//! manifest on the `tiny` generated model, that builds and runs as it is.

use anyhow::{bail, Context, Result};
use clap::Parser;
use common::workspace::Workspace;

#[derive(Parser)]
#[command(about = "Scaffold a new experiment crate and its manifest")]
struct Cli {
    /// Crate and binary name: lower-case letters, digits and dashes, starting with a letter.
    name: String,
}

/// Binaries that already exist in the workspace; a new experiment must not shadow them.
const TAKEN: [&str; 5] = ["common", "source-hash", "models", "reproduce", "new-experiment"];

const FILES: [(&str, &str); 4] = [
    ("experiments/__NAME__/Cargo.toml", include_str!("../../templates/experiment/Cargo.toml.tmpl")),
    ("experiments/__NAME__/build.rs", include_str!("../../templates/experiment/build.rs.tmpl")),
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
        && !name.ends_with('-');
    if !valid {
        bail!(
            "NAME `{name}`: use lower-case letters, digits and dashes, starting with a letter (e.g. `prefill-sweep`)"
        );
    }
    if TAKEN.contains(&name) {
        bail!("NAME `{name}` is already a binary of this workspace; pick another");
    }
    let ws = Workspace::discover()?;
    for (path, _) in FILES {
        let path = ws.root.join(path.replace("__NAME__", name));
        if path.exists() {
            bail!("{} already exists; experiment `{name}` is taken, pick another name", ws.display_path(&path));
        }
    }
    for (path, template) in FILES {
        let path = ws.root.join(path.replace("__NAME__", name));
        std::fs::create_dir_all(path.parent().context("file has a folder")?)?;
        std::fs::write(&path, template.replace("__NAME__", name))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("created {}", ws.display_path(&path));
    }
    println!("\nrun it: cargo run -p {name}   (or `just reproduce`, which now includes it)");
    Ok(())
}
