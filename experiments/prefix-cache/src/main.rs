//! `prefix-cache`: each point's jobs run one at a time with prefix reuse off and on, round after
//! round (args, prepare, run, write).

use common::experiment::{claims_table, judge_claims, prepare, Experiment};
use common::policy::Policy;
use common::sample::Sampling;
use common::schedule::{self, Job, RunConfig};
use prefix_cache::{
    cached_ttft, draw_prompts, ids_identical, job_id, point_label, requests_of, summarize_runs, tokens_per_s, Artifact,
    PrefixCache, RunRecord,
};

fn main() {
    common::experiment::main(|args: <PrefixCache as Experiment>::Args| -> anyhow::Result<()> {
        let prepared = prepare(&PrefixCache, &args)?;
        let (model, p) = (&prepared.model.loaded, prepared.parameters.clone());
        let prompts = draw_prompts(&p, model.config.vocab_size);
        let mut runs = Vec::new();
        let points = p.points();
        for round in 0..p.rounds {
            for (i, &(prefix, share, kv_budget)) in points.iter().enumerate() {
                let point = point_label(prefix, share, kv_budget);
                // Off first in even rounds, on first in odd ones: neither always runs on a warm machine.
                let order = if (round + i) % 2 == 0 { [false, true] } else { [true, false] };
                for reuse in order {
                    let jobs: Vec<Job> = prompts[&point]
                        .iter()
                        .enumerate()
                        .map(|(j, ids)| Job {
                            id: job_id(j),
                            prompt_ids: ids.clone(),
                            max_new_tokens: p.max_new_tokens,
                            arrival_ms: 0.0,
                            sampling: Sampling::GREEDY,
                        })
                        .collect();
                    let config = RunConfig {
                        policy: Policy::Fifo,
                        chunk_size: None,
                        max_active: 1,
                        kv_budget,
                        prefix_cache: reuse,
                    };
                    let outcome = schedule::run(model, &jobs, config)?;
                    let requests = requests_of(&outcome.timeline, &prompts[&point], &p.sharing(share));
                    eprintln!(
                        "round {}/{} {point} reuse {}: cached TTFT {} ms, {} prompt tokens computed",
                        round + 1,
                        p.rounds,
                        if reuse { "on" } else { "off" },
                        cached_ttft(&requests).map_or("-".into(), |t| format!("{t:.2}")),
                        requests.iter().map(|r| r.prefill_tokens).sum::<usize>()
                    );
                    runs.push(RunRecord {
                        point: point.clone(),
                        prefix_tokens: prefix,
                        share,
                        kv_budget,
                        reuse,
                        round,
                        elapsed_ms: outcome.elapsed_ms,
                        output_tokens_per_s: tokens_per_s(&requests, outcome.elapsed_ms),
                        cached_ttft_ms: cached_ttft(&requests),
                        prefill_tokens: requests.iter().map(|r| r.prefill_tokens).sum(),
                        reused_tokens: requests.iter().map(|r| r.reused_tokens).sum(),
                        peak_kv_bytes: outcome.peak_kv_bytes,
                        kv_pool_bytes: outcome.kv_pool_bytes,
                        requests,
                        timeline: outcome.timeline,
                    });
                }
            }
        }

        let provenance = prepared.provenance(common::build_facts!())?;
        let mut artifact = Artifact {
            run_id: prepared.clock.run_id.clone(),
            model_id: prepared.model_id(),
            parameters: p,
            summary: summarize_runs(&runs),
            output_ids_identical: ids_identical(&runs),
            vocab_size: model.config.vocab_size,
            block_bytes: model.model.block_bytes(),
            prompts,
            runs,
            claims: Vec::new(),
            provenance,
        };
        artifact.claims = judge_claims(&PrefixCache, &prepared.claims, &artifact)?;
        let path = prepared.write(&artifact)?;
        for row in &artifact.summary {
            println!(
                "{:<24} reuse {:<3}  cached TTFT p50 {:>9} ms  prefill tokens {:>7}  reused {:>7}  {:>8} tok/s",
                row.point,
                if row.reuse { "on" } else { "off" },
                row.cached_ttft_ms.p50.map_or("-".into(), |t| format!("{t:.2}")),
                row.prefill_tokens,
                row.reused_tokens,
                row.output_tokens_per_s.p50.map_or("-".into(), |t| format!("{t:.1}")),
            );
        }
        println!("reuse changed no id: {}", artifact.output_ids_identical);
        if !artifact.claims.is_empty() {
            let rows: Vec<_> = artifact.claims.iter().map(|c| (prepared.manifest_label(), c)).collect();
            print!("\n{}", claims_table(&rows));
        }
        println!("artifact: {}", prepared.ws.display_path(&path));
        Ok(())
    })
}
