//! `serving-bench`: reproduce the seed 001 benchmark. A strict streaming client measures
//! OpenAI- and Ollama-compatible servers; with no `--target` it measures the project's own
//! embedded server on the manifest's model. `serving-bench serve` runs that server alone (an
//! alias of the `serve` binary).

use anyhow::{Context, Result};
use common::experiment::claims_table;
use common::workspace::Workspace;
use serving_bench::cli::{BenchArgs, Cli, Command};
use serving_bench::serving::{self, ServingArtifact};
use serving_bench::{measure, table};
use std::path::Path;

fn main() {
    common::experiment::main(|cli: Cli| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        // The client's workers go ahead of the servers it measures, unless an embedded server
        // in this process would share them (and the engine threads they start); so does this
        // thread, which runs the groups and spawns each open-loop request ahead of its time.
        if cli.command.is_none() && cli.bench.targets().is_ok_and(|t| t.iter().all(|s| s.url.is_some())) {
            loadgen::os::raise_spawner();
            builder.on_thread_start(loadgen::os::raise_worker);
        }
        let runtime = builder.enable_all().build().context("a tokio runtime")?;
        match cli.command {
            Some(Command::Serve(args)) => runtime.block_on(serve::cli::run(args)).map(|()| 0).map_err(Into::into),
            None => runtime.block_on(bench(cli)),
        }
    })
}

/// Plans the run, measures it, writes the artifact, then shows what it holds.
async fn bench(cli: Cli) -> Result<i32> {
    let plan = measure::plan(&cli).await?;
    let measured = measure::run(&plan).await?;
    let ws = plan.prepared.ws.clone();
    let (path, label) = measure::record(plan, measured).await?;
    print(&cli.bench, &ws, &path, label.as_deref())
}

/// Exports, the tables, the claims and the artifact's path, all from the artifact as written
/// (redacted, so that no export or printed line holds what the artifact may not); exits 1 when a
/// group measured nothing, unless allowed.
fn print(args: &BenchArgs, ws: &Workspace, path: &Path, label: Option<&str>) -> Result<i32> {
    let artifact: ServingArtifact = common::artifact::read_artifact(path)?;
    for format in &args.export {
        for file in serving_bench::export::write(&artifact, path, *format)? {
            println!("export: {}", ws.display_path(&file));
        }
    }
    print!("{}", table::summary(&artifact));
    for note in serving::backlog_notes(&artifact.requests).into_iter().chain(serving::unsent_turns_notes(&artifact)) {
        println!("note: {note}");
    }
    print!("{}", table::comparison(&artifact));
    print!("{}", table::checks(&artifact));
    if let (false, Some(label)) = (artifact.claims.is_empty(), label) {
        let rows: Vec<_> = artifact.claims.iter().map(|c| (label.to_string(), c)).collect();
        print!("\n{}", claims_table(&rows));
    }
    println!("artifact: {}", ws.display_path(path));
    let failed = serving::failed_groups(&artifact.requests);
    if failed.is_empty() || args.allow_failed_groups {
        return Ok(0);
    }
    eprintln!(
        "error: every request failed in {}; the artifact is written (--allow-failed-groups exits 0 on such a run)",
        failed.join("; ")
    );
    Ok(1)
}
