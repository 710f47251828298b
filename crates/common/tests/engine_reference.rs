//! The engine's greedy ids equal Hugging Face transformers' (F32, CPU) for the tiny generated
//! checkpoint, under every policy, chunk size and admission limit. The reference JSON is written
//! by `scripts/transformers_reference.py` and committed.

mod support;

use common::load::LoadedModel;
use common::policy::Policy;
use common::sample::Sampling;
use common::schedule::{self, request_metrics, Job, RunConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    revision: String,
    jobs: Vec<RefJob>,
}

#[derive(Deserialize)]
struct RefJob {
    id: String,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
}

fn reference() -> Reference {
    serde_json::from_str(include_str!("data/transformers-reference-tiny.json")).unwrap()
}

/// The seed's jobs with the reference's prompt ids, each id followed by `suffix`, all arriving at once.
fn seed_jobs(reference: &Reference, suffix: &str) -> Vec<Job> {
    common::schedule::seed_workload()
        .jobs
        .iter()
        .map(|j| Job {
            id: format!("{}{suffix}", j.id),
            prompt_ids: reference.jobs.iter().find(|r| r.id == j.id).unwrap().prompt_ids.clone(),
            max_new_tokens: j.max_new_tokens,
            arrival_ms: 0.0,
            sampling: Sampling::GREEDY,
        })
        .collect()
}

/// The tightest KV budget `jobs` run under: the longest job's whole length, in blocks.
fn tightest_budget(jobs: &[Job]) -> usize {
    let tile = common::qwen::KvPool::BLOCK_POSITIONS;
    jobs.iter().map(|j| (j.prompt_ids.len() + j.max_new_tokens).div_ceil(tile) * tile).max().unwrap()
}

#[test]
fn reference_was_made_on_the_pinned_tiny_checkpoint() {
    let pin = support::workspace().model_pin("tiny").unwrap();
    assert_eq!(reference().revision, pin.revision, "regenerate the reference after re-pinning tiny");
}

#[test]
fn prompts_render_and_tokenize_exactly_like_transformers() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let params = common::schedule::seed_workload();
    for r in reference().jobs {
        let spec = params.jobs.iter().find(|j| j.id == r.id).unwrap();
        let (_, ids) = model.encode_user_prompt(&spec.prompt).unwrap();
        assert_eq!(ids, r.prompt_ids, "{}", r.id);
    }
}

#[test]
fn greedy_ids_equal_transformers_for_every_policy_chunk_and_limit() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let reference = reference();
    let jobs = seed_jobs(&reference, "");
    let (tile, tight) = (common::qwen::KvPool::BLOCK_POSITIONS, tightest_budget(&jobs));
    let mut checked = 0;
    let mut preempted = 0;
    for policy in Policy::ALL {
        for chunk_size in [Some(1), Some(7), Some(64), None] {
            for (max_active, kv_budget) in [(1, None), (2, None), (3, None), (3, Some(tight)), (2, Some(tight + tile))]
            {
                let config = RunConfig { policy, chunk_size, max_active, kv_budget, prefix_cache: false };
                let outcome = schedule::run(&model, &jobs, config).unwrap();
                preempted += outcome.timeline.iter().filter(|s| s.kind == common::session::StepKind::Preempt).count();
                assert!(outcome.peak_kv_bytes <= outcome.kv_pool_bytes, "{config:?}: the budget is kept");
                let metrics = request_metrics(&outcome.timeline);
                assert_eq!(metrics.len(), 3);
                for r in &reference.jobs {
                    let ours = metrics.iter().find(|m| m.id == r.id).unwrap();
                    assert_eq!(ours.output_ids, r.output_ids, "{config:?} job {}", r.id);
                }
                // Every prompt token was prefilled once (and again after each preemption, with
                // what had been generated), in chunks of at most chunk_size.
                for job in &jobs {
                    let prefill: Vec<_> = outcome
                        .timeline
                        .iter()
                        .filter(|s| s.job == job.id && s.kind == common::session::StepKind::Prefill)
                        .collect();
                    let preemptions = outcome.finish.iter().find(|f| f.job == job.id).unwrap().preemptions;
                    if preemptions == 0 {
                        assert_eq!(prefill.iter().map(|s| s.tokens).sum::<usize>(), job.prompt_ids.len());
                    }
                    assert!(prefill.iter().all(|s| s.tokens <= chunk_size.unwrap_or(usize::MAX)));
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 60);
    assert!(preempted > 0, "the tight budget preempted some job somewhere");
}

#[test]
fn policies_order_steps_as_the_seed_describes() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let reference = reference();
    let jobs: Vec<Job> = reference
        .jobs
        .iter()
        .zip(common::schedule::seed_workload().jobs)
        .map(|(r, spec)| Job {
            id: r.id.clone(),
            prompt_ids: r.prompt_ids.clone(),
            max_new_tokens: spec.max_new_tokens,
            arrival_ms: 0.0,
            sampling: Sampling::GREEDY,
        })
        .collect();
    let order = |config| -> Vec<String> {
        let outcome = schedule::run(&model, &jobs, config).unwrap();
        let mut seq: Vec<String> = outcome.timeline.iter().map(|s| s.job.clone()).collect();
        seq.dedup();
        seq
    };
    // fifo: each job runs to completion, in arrival order.
    let fifo = order(RunConfig {
        policy: Policy::Fifo,
        chunk_size: None,
        max_active: 2,
        kv_budget: None,
        prefix_cache: false,
    });
    assert_eq!(fifo, vec!["long-document", "interactive-a", "interactive-b"]);
    // interleave: long and a alternate until a finishes, then b joins.
    let inter = order(RunConfig {
        policy: Policy::Interleave,
        chunk_size: None,
        max_active: 2,
        kv_budget: None,
        prefix_cache: false,
    });
    assert_eq!(&inter[..4], ["long-document", "interactive-a", "long-document", "interactive-a"]);
    // chunked: interactive-a gets its first token before long-document's prefill ends.
    let outcome = schedule::run(
        &model,
        &jobs,
        RunConfig {
            policy: Policy::Interleave,
            chunk_size: Some(64),
            max_active: 2,
            kv_budget: None,
            prefix_cache: false,
        },
    )
    .unwrap();
    let m = request_metrics(&outcome.timeline);
    let ttft = |id: &str| m.iter().find(|r| r.id == id).unwrap().ttft_ms;
    assert!(ttft("interactive-a") < ttft("long-document"));
    let timeline_end = outcome.timeline.last().unwrap().end_ms;
    assert_eq!(outcome.elapsed_ms, timeline_end);
    assert!(outcome.timeline.windows(2).all(|w| w[0].end_ms <= w[1].start_ms), "steps are serial");
}

/// The ids after prompts of 1k, 4k and 8k tokens (`transformers_reference.py --long`).
fn long_reference() -> Reference {
    serde_json::from_str(include_str!("data/transformers-reference-tiny-long.json")).unwrap()
}

#[test]
fn greedy_ids_after_long_prompts_equal_transformers_whole_chunked_and_preempted() {
    let reference = long_reference();
    assert_eq!(reference.revision, support::workspace().model_pin("tiny").unwrap().revision);
    // tiny declares 4096 positions. transformers computes rotary angles for any position and so
    // reads the 8k prompt as it is; our engine tabulates them up to the declared length, so this
    // copy declares more. Nothing else differs.
    let copy = support::tiny_copy();
    let config = copy.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let longer = text.replace("\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 16384");
    assert_ne!(text, longer, "tiny's config declares its 4096 positions");
    std::fs::write(&config, longer).unwrap();
    let model = LoadedModel::load(copy.path()).unwrap();

    for r in &reference.jobs {
        let ours = schedule::long_prompt(&model, r.prompt_ids.len()).unwrap();
        assert_eq!(
            ours, r.prompt_ids,
            "{}: the engine renders and tokenizes the long prompt as transformers does",
            r.id
        );
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
    let lengths: Vec<usize> = jobs.iter().map(|j| j.prompt_ids.len()).collect();
    assert_eq!(lengths, [1024, 4096, 8192]);
    // Whole prompts one at a time; all three side by side, prefilled in chunks; and prefilled by
    // turns under a budget that holds the longest request and little more, so that they preempt
    // each other.
    let tile = common::qwen::KvPool::BLOCK_POSITIONS;
    let longest = (8192 + 8usize).div_ceil(tile) * tile;
    let configs = [
        RunConfig { policy: Policy::Fifo, chunk_size: None, max_active: 1, kv_budget: None, prefix_cache: false },
        RunConfig {
            policy: Policy::Batched,
            chunk_size: Some(512),
            max_active: 3,
            kv_budget: None,
            prefix_cache: false,
        },
        RunConfig {
            policy: Policy::Interleave,
            chunk_size: Some(512),
            max_active: 3,
            kv_budget: Some(longest + 4 * tile),
            prefix_cache: false,
        },
        // The prompts are prefixes of one text: with reuse, the 4k prompt takes the 1k one's
        // blocks and the 8k prompt the 4k one's, and under the tight budget they also evict.
        RunConfig { policy: Policy::Fifo, chunk_size: None, max_active: 1, kv_budget: None, prefix_cache: true },
        RunConfig {
            policy: Policy::Interleave,
            chunk_size: Some(512),
            max_active: 3,
            kv_budget: Some(longest + 4 * tile),
            prefix_cache: true,
        },
    ];
    let mut preempted = 0;
    for config in configs {
        let outcome = schedule::run(&model, &jobs, config).unwrap();
        preempted += outcome.finish.iter().map(|f| f.preemptions).sum::<usize>();
        let metrics = request_metrics(&outcome.timeline);
        for r in &reference.jobs {
            let ours = metrics.iter().find(|m| m.id == r.id).unwrap();
            assert_eq!(ours.output_ids, r.output_ids, "{config:?} job {}", r.id);
        }
        let reused: Vec<usize> =
            jobs.iter().map(|j| outcome.timeline.iter().filter(|s| s.job == j.id).map(|s| s.reused).sum()).collect();
        if !config.prefix_cache {
            assert_eq!(reused, [0, 0, 0], "{config:?}");
        } else if config.policy == Policy::Fifo {
            // One at a time, each prompt takes its longest common prefix with a history before
            // it (a prompt and all its output ids but the last), never its own last token: the
            // prompt before it whole, and as many of that one's output ids as the text repeats.
            let histories: Vec<Vec<u32>> = reference
                .jobs
                .iter()
                .map(|r| [&r.prompt_ids[..], &r.output_ids[..r.output_ids.len() - 1]].concat())
                .collect();
            let expected: Vec<usize> = (0..jobs.len())
                .map(|i| {
                    let wanted = &reference.jobs[i].prompt_ids[..reference.jobs[i].prompt_ids.len() - 1];
                    histories[..i]
                        .iter()
                        .map(|h| h.iter().zip(wanted).take_while(|(a, b)| a == b).count())
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            assert!(expected[1] >= 1024 && expected[2] >= 4096, "{expected:?}");
            assert_eq!(reused, expected, "each prompt takes its longest cached prefix");
        }
    }
    assert!(preempted > 0, "the tight budget preempted a long request");
}

#[test]
fn greedy_ids_equal_transformers_with_prefix_reuse_under_every_policy() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let reference = reference();
    // Every reference job twice, the copy arriving with the original.
    let jobs: Vec<Job> = [seed_jobs(&reference, ""), seed_jobs(&reference, "#2")].concat();
    let tight = tightest_budget(&jobs);
    let long = &reference.jobs.iter().find(|r| r.id == "long-document").unwrap().prompt_ids;
    for policy in Policy::ALL {
        for chunk_size in [Some(7), None] {
            for (max_active, kv_budget) in [(1, None), (3, None), (2, Some(tight))] {
                let config = RunConfig { policy, chunk_size, max_active, kv_budget, prefix_cache: true };
                let outcome = schedule::run(&model, &jobs, config).unwrap();
                assert!(outcome.peak_kv_bytes <= outcome.kv_pool_bytes, "{config:?}: the budget is kept");
                let metrics = request_metrics(&outcome.timeline);
                assert_eq!(metrics.len(), 6);
                for m in &metrics {
                    let r = reference.jobs.iter().find(|r| r.id == m.id.trim_end_matches("#2")).unwrap();
                    assert_eq!(m.output_ids, r.output_ids, "{config:?} job {}", m.id);
                }
                // One at a time, the copy finds the original's prompt cached: all of it before
                // its last token.
                if max_active == 1 {
                    let first = outcome.timeline.iter().find(|s| s.job == "long-document#2").unwrap();
                    assert_eq!(first.reused, long.len() - 1, "{config:?}");
                    assert_eq!(first.position, first.reused);
                }
            }
        }
    }
}
