//! Sampling on the tiny checkpoint: the ids a seed draws do not depend on how the request was
//! scheduled, and the draws follow the distribution the filters define.

mod support;

use common::load::LoadedModel;
use common::policy::Policy;
use common::sample::{every, uniform, Sampling};
use common::schedule::{self, request_metrics, Job, RunConfig};

/// Every filter at once, as a product would set them.
const MIXED: Sampling =
    Sampling { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.02, repetition_penalty: 1.1, seed: 7 };

fn seed_jobs(model: &LoadedModel, sampling: Sampling) -> Vec<Job> {
    schedule::seed_workload()
        .jobs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut job = Job::from_spec(model, spec).unwrap();
            job.sampling = Sampling { seed: sampling.seed + i as u64, ..sampling };
            job
        })
        .collect()
}

fn ids(model: &LoadedModel, jobs: &[Job], config: RunConfig) -> Vec<(String, Vec<u32>)> {
    let outcome = schedule::run(model, jobs, config).unwrap();
    let mut ids: Vec<_> = request_metrics(&outcome.timeline).into_iter().map(|m| (m.id, m.output_ids)).collect();
    ids.sort();
    ids
}

#[test]
fn a_seed_draws_the_same_ids_under_every_policy_chunk_budget_and_prefix_cache() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    // Every logit (the penalty needs them), and top-k through the head's screen.
    for sampling in [MIXED, Sampling { repetition_penalty: 1.0, ..MIXED }] {
        same_ids_however_scheduled(&model, sampling);
    }
}

fn same_ids_however_scheduled(model: &LoadedModel, sampling: Sampling) {
    let jobs = seed_jobs(model, sampling);
    let tile = common::qwen::KvPool::BLOCK_POSITIONS;
    // The longest job's whole length: any tighter and it could never run.
    let tight = jobs.iter().map(|j| (j.prompt_ids.len() + j.max_new_tokens).div_ceil(tile) * tile).max().unwrap();
    let alone =
        RunConfig { policy: Policy::Fifo, chunk_size: None, max_active: 1, kv_budget: None, prefix_cache: false };
    let expected = ids(model, &jobs, alone);
    let mut preempted = 0;
    for policy in Policy::ALL {
        for chunk_size in [Some(1), Some(7), None] {
            for (max_active, kv_budget, prefix_cache) in [(3, None, false), (3, Some(tight), false), (2, None, true)] {
                let config = RunConfig { policy, chunk_size, max_active, kv_budget, prefix_cache };
                let outcome = schedule::run(model, &jobs, config).unwrap();
                preempted += outcome.finish.iter().map(|f| f.preemptions).sum::<usize>();
                assert_eq!(ids(model, &jobs, config), expected, "{config:?}");
            }
        }
    }
    assert!(preempted > 0, "the tight budget preempted some job somewhere");
    // Sampling did something: greedy ids differ, and so do another seed's.
    let greedy = ids(model, &seed_jobs(model, Sampling::GREEDY), alone);
    assert_ne!(greedy, expected, "sampled ids equal the greedy ones");
    let reseeded = ids(model, &seed_jobs(model, Sampling { seed: 1000, ..sampling }), alone);
    assert_ne!(reseeded, expected, "another seed drew the same ids");
}

/// The filtered distribution written as transformers' processors compute it (a literal second
/// implementation in f64: ascending sort and cumulative sum for top-p), to hold `pick` to.
fn reference_probabilities(logits: &[f32], held: &[u32], s: &Sampling) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    let r = s.repetition_penalty as f64;
    let mut held: Vec<u32> = held.to_vec();
    held.sort_unstable();
    held.dedup();
    for &id in &held {
        let x = &mut l[id as usize];
        *x = if *x > 0.0 { *x / r } else { *x * r };
    }
    for x in &mut l {
        *x /= s.temperature as f64;
    }
    let softmax = |l: &[f64]| -> Vec<f64> {
        let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = l.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    };
    if s.top_k > 0 {
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[(s.top_k as usize).min(sorted.len()) - 1];
        for x in &mut l {
            if *x < kth {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    if s.top_p < 1.0 {
        let p = softmax(&l);
        let mut ascending: Vec<usize> = (0..l.len()).collect();
        ascending.sort_by(|a, b| l[*a].total_cmp(&l[*b]).then(b.cmp(a)));
        let mut cum = 0.0;
        let last = *ascending.last().unwrap();
        for i in ascending {
            cum += p[i];
            if cum <= 1.0 - s.top_p as f64 && i != last {
                l[i] = f64::NEG_INFINITY;
            }
        }
    }
    if s.min_p > 0.0 {
        let p = softmax(&l);
        let floor = s.min_p as f64 * p.iter().cloned().fold(0.0, f64::max);
        for (x, p) in l.iter_mut().zip(&p) {
            if *p < floor {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    softmax(&l)
}

/// The chi-square statistic of `counts` against `expected` probabilities over `n` draws, bins
/// expected below 5 pooled into one, with its degrees of freedom. A bin the reference gives
/// probability 0 must never be drawn (that fails at once).
fn chi_square(counts: &[usize], expected: &[f64], n: usize, what: &str) -> (f64, usize) {
    let (mut stat, mut bins) = (0.0, 0);
    let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
    for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        assert!(p > 0.0 || c == 0, "{what}: id {id} was drawn {c} times, the filters drop it");
        let e = p * n as f64;
        if e < 5.0 {
            pooled_count += c as f64;
            pooled_expected += e;
        } else {
            stat += (c as f64 - e).powi(2) / e;
            bins += 1;
        }
    }
    if pooled_expected >= 5.0 {
        stat += (pooled_count - pooled_expected).powi(2) / pooled_expected;
        bins += 1;
    } else {
        assert!(pooled_count <= 15.0, "{what}: {pooled_count} draws of ids expected {pooled_expected:.2} times");
    }
    (stat, bins.max(2) - 1)
}

/// The chi-square distribution's upper `1e-4` point for `df` degrees of freedom (Wilson and
/// Hilferty's cube-root normal approximation, within a percent from df = 3 up).
fn critical(df: usize) -> f64 {
    let (k, z) = (df as f64, 3.719);
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn draws_follow_the_filtered_probabilities_for_each_filter_alone_and_combined() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let (_, prompt) = model.encode_user_prompt("Explain what a compiler does, in one sentence.").unwrap();
    let mut cache = model.model.new_cache(prompt.len()).unwrap();
    let logits: Vec<f32> = model.model.forward(&mut cache, &prompt).unwrap().to_vec1().unwrap();
    let base = Sampling { temperature: 1.0, ..Sampling::GREEDY };
    let cases = [
        ("temperature 0.7", Sampling { temperature: 0.7, ..base }),
        ("temperature 1.5", Sampling { temperature: 1.5, ..base }),
        ("top-k 20", Sampling { top_k: 20, ..base }),
        ("top-p 0.97", Sampling { top_p: 0.97, ..base }),
        ("min-p 0.005", Sampling { min_p: 0.005, ..base }),
        ("repetition penalty 1.5", Sampling { repetition_penalty: 1.5, ..base }),
        ("combined", Sampling { temperature: 1.5, ..MIXED }),
    ];
    const DRAWS: usize = 20_000;
    for (what, sampling) in cases {
        let expected = reference_probabilities(&logits, &prompt, &sampling);
        let kept = expected.iter().filter(|p| **p > 0.0).count();
        let mut counts = vec![0usize; logits.len()];
        for position in 0..DRAWS {
            let id = sampling.pick(every(&logits), &prompt, position);
            counts[id as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &expected, DRAWS, what);
        assert!(df >= 10, "{what}: {df} degrees of freedom is too few to test ({kept} ids kept)");
        assert!(
            stat <= critical(df),
            "{what}: chi-square {stat:.1} over {df} degrees of freedom (critical {:.1})",
            critical(df)
        );
        // The filters keep what the reference keeps: the distribution `pick` draws from names
        // exactly the reference's ids.
        let mut named: Vec<u32> = sampling.distribution(every(&logits), &prompt).iter().map(|(id, _)| *id).collect();
        named.sort_unstable();
        let reference: Vec<u32> = (0..expected.len() as u32).filter(|id| expected[*id as usize] > 0.0).collect();
        assert_eq!(named, reference, "{what}: the ids kept");
    }
}

#[test]
fn uniform_numbers_are_a_function_of_seed_and_position() {
    assert_eq!(uniform(3, 17), uniform(3, 17));
    assert_ne!(uniform(3, 17), uniform(3, 18));
    assert_ne!(uniform(3, 17), uniform(4, 17));
    // Roughly uniform: the mean of many is near a half, and none leaves [0, 1).
    let draws: Vec<f64> = (0..100_000).map(|p| uniform(99, p)).collect();
    assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
}
