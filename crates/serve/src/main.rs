//! `serve`: the embedded server alone, on a port of the user's, until Ctrl-C.

use clap::Parser;
use serve::cli::ServeArgs;

/// Serves a model over OpenAI- and Ollama-compatible HTTP until Ctrl-C (`serving-bench serve` is
/// an alias).
#[derive(Parser)]
#[command(name = "serve", version)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn main() {
    common::experiment::main(|cli: Cli| {
        let runtime = tokio::runtime::Runtime::new().map_err(serve::cli::ServeError::Runtime)?;
        runtime.block_on(serve::cli::run(cli.args))
    })
}
