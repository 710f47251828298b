//! Batched steps compute exactly what serial steps compute: one forward over several sessions
//! at different positions gives each the bits it gets alone, and the `batched` policy advances
//! every admitted request in each step under its token budget. On the tiny generated checkpoint.

mod support;

use common::greedy;
use common::load::LoadedModel;
use common::policy::Policy;
use common::qwen::{Next, Want, WeightDtype};
use common::sample::Sampling;
use common::schedule::{self, request_metrics, Job, RunConfig};
use common::session::{step_batch, Session, StepKind};

fn prompts(model: &LoadedModel) -> Vec<Vec<u32>> {
    ["Explain caching.", "Name one reason to bound a request queue, briefly please.", "Hi"]
        .iter()
        .map(|p| model.encode_user_prompt(p).unwrap().1)
        .collect()
}

#[test]
fn one_forward_over_sessions_at_different_positions_gives_each_its_serial_logits() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let qwen = &model.model;
    let prompts = prompts(&model);
    // Prefill each prompt (different lengths, so different positions), then decode one token
    // each: alone, and all three in one forward.
    let mut alone = Vec::new();
    let mut caches = Vec::new();
    for p in &prompts {
        let mut cache = qwen.new_cache(p.len() + 4).unwrap();
        qwen.forward(&mut cache, p).unwrap();
        let mut solo = qwen.new_cache(p.len() + 4).unwrap();
        qwen.forward(&mut solo, p).unwrap();
        let logits: Vec<f32> = qwen.forward(&mut solo, &[7]).unwrap().to_vec1().unwrap();
        alone.push(logits);
        caches.push(cache);
    }
    let mut items: Vec<_> = caches.iter_mut().map(|c| (c, &[7u32][..])).collect();
    let batched: Vec<Vec<f32>> = qwen.forward_batch(&mut items).unwrap().to_vec2().unwrap();
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "session {i}: batched logits differ");
    }
    // A mixed batch: a prefill chunk of one session next to decodes of the others.
    let mut fresh = qwen.new_cache(prompts[0].len() + 4).unwrap();
    let mut items: Vec<_> = vec![(&mut fresh, &prompts[0][..])];
    items.extend(caches.iter_mut().skip(1).map(|c| (c, &[9u32][..])));
    let mixed: Vec<Vec<f32>> = qwen.forward_batch(&mut items).unwrap().to_vec2().unwrap();
    let mut solo = qwen.new_cache(prompts[0].len() + 4).unwrap();
    let first: Vec<f32> = qwen.forward(&mut solo, &prompts[0]).unwrap().to_vec1().unwrap();
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    assert_eq!(argmax(&mixed[0]), argmax(&first), "the prefill chunk's next token");
}

#[test]
fn a_prompt_prefilled_whole_in_chunks_or_token_by_token_gives_the_same_logits() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let qwen = &model.model;
    // A prompt of over two key tiles, so that chunks start and end inside tiles.
    let prompt: Vec<u32> = prompts(&model).concat().repeat(4);
    assert!(prompt.len() > 2 * common::qwen::KvPool::BLOCK_POSITIONS, "{} tokens", prompt.len());
    let logits = |chunk: usize| -> Vec<Vec<f32>> {
        let mut cache = qwen.new_cache(prompt.len() + 2).unwrap();
        let mut last = Vec::new();
        for piece in prompt.chunks(chunk) {
            last = qwen.forward(&mut cache, piece).unwrap().to_vec1::<f32>().unwrap();
        }
        // And the first decode step after it.
        let next = qwen.forward(&mut cache, &[7]).unwrap().to_vec1::<f32>().unwrap();
        vec![last, next]
    };
    let whole = logits(prompt.len());
    for chunk in [1, 5, 64, 100] {
        let got = logits(chunk);
        for (a, b) in whole.iter().zip(&got) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "chunks of {chunk}: logits differ");
        }
    }
}

#[test]
fn greedy_ids_through_the_screen_are_the_first_largest_of_each_sessions_own_logits() {
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
        let model = LoadedModel::load_as(&support::tiny_dir(), dtype).unwrap();
        let qwen = &model.model;
        // Ten distinct sessions in one batch, more than a decode step usually carries.
        let base = prompts(&model);
        let prompts: Vec<Vec<u32>> = (0..10u32).map(|i| [&base[i as usize % 3][..], &[i + 5]].concat()).collect();
        let mut solo: Vec<_> = prompts.iter().map(|p| qwen.new_cache(p.len() + 4).unwrap()).collect();
        let mut batch: Vec<_> = prompts.iter().map(|p| qwen.new_cache(p.len() + 4).unwrap()).collect();
        let mut inputs = prompts.clone();
        for step in 0..4 {
            let expected: Vec<u32> = solo
                .iter_mut()
                .zip(&inputs)
                .map(|(c, ids)| greedy::argmax(&qwen.forward(c, ids).unwrap().to_vec1::<f32>().unwrap()))
                .collect();
            let mut items: Vec<_> = batch.iter_mut().zip(&inputs).map(|(c, ids)| (c, &ids[..])).collect();
            // The second session's step is marked as needing no token: it advances all the same.
            let wants: Vec<Want> = (0..10).map(|i| if i == 1 { Want::Nothing } else { Want::Greedy }).collect();
            let next = qwen.next_batch(&mut items, &wants).unwrap();
            assert_eq!(next[1], Next::Nothing);
            for (i, (next, e)) in next.iter().zip(&expected).enumerate().filter(|(i, _)| *i != 1) {
                assert_eq!(*next, Next::Id(*e), "{dtype:?} step {step} session {i}");
            }
            inputs = expected.iter().map(|e| vec![*e]).collect();
        }
    }
}

#[test]
fn step_batch_advances_every_session_like_step_does() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let prompts = prompts(&model);
    let serial: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::new(&model, p.clone(), 6).unwrap();
            while !s.is_finished() {
                s.step(Some(5)).unwrap();
            }
            s.output().to_vec()
        })
        .collect();
    let mut sessions: Vec<Session> = prompts.iter().map(|p| Session::new(&model, p.clone(), 6).unwrap()).collect();
    loop {
        let mut live: Vec<&mut Session> = sessions.iter_mut().filter(|s| !s.is_finished()).collect();
        if live.is_empty() {
            break;
        }
        let chunks = vec![Some(5); live.len()];
        let outcomes = step_batch(&mut live, &chunks).unwrap();
        assert!(outcomes.iter().all(|o| o.kind == StepKind::Decode || o.tokens <= 5));
    }
    let batched: Vec<Vec<u32>> = sessions.iter().map(|s| s.output().to_vec()).collect();
    assert_eq!(batched, serial);
}

#[test]
fn the_batched_policy_steps_every_decode_and_fills_its_budget_with_prefill() {
    let model = LoadedModel::load(&support::tiny_dir()).unwrap();
    let jobs: Vec<Job> = prompts(&model)
        .into_iter()
        .enumerate()
        .map(|(i, prompt_ids)| Job {
            id: format!("job-{i}"),
            prompt_ids,
            max_new_tokens: 5,
            arrival_ms: 0.0,
            sampling: Sampling::GREEDY,
        })
        .collect();
    let budget = 8;
    let config = RunConfig {
        policy: Policy::Batched,
        chunk_size: Some(budget),
        max_active: 3,
        kv_budget: None,
        prefix_cache: false,
    };
    let outcome = schedule::run(&model, &jobs, config).unwrap();
    // Group the timeline into forwards (the entries of one forward share their times).
    let mut steps: Vec<Vec<&schedule::TimelineStep>> = Vec::new();
    for s in &outcome.timeline {
        match steps.last_mut() {
            Some(last) if (last[0].start_ms, last[0].end_ms) == (s.start_ms, s.end_ms) => last.push(s),
            _ => steps.push(vec![s]),
        }
    }
    assert!(steps.iter().any(|s| s.len() > 1), "some forward ran several jobs");
    assert!(steps.windows(2).all(|w| w[0][0].end_ms <= w[1][0].start_ms), "forwards do not overlap");
    // Replay the jobs' states: every decoding job is in every forward, and prefill takes the
    // whole budget left after the decodes while any prompt is unfinished.
    let mut prefill_left: Vec<usize> = jobs.iter().map(|j| j.prompt_ids.len()).collect();
    let mut generated = vec![0usize; jobs.len()];
    for step in &steps {
        assert!(step.iter().all(|s| s.batch == step.len()), "batch names the forward's size");
        let index = |s: &schedule::TimelineStep| jobs.iter().position(|j| j.id == s.job).unwrap();
        let decoding: Vec<usize> =
            (0..jobs.len()).filter(|&i| prefill_left[i] == 0 && generated[i] < jobs[i].max_new_tokens).collect();
        for &i in &decoding {
            assert!(step.iter().any(|s| index(s) == i && s.kind == StepKind::Decode), "{} skipped", jobs[i].id);
        }
        let prefill: usize = step.iter().filter(|s| s.kind == StepKind::Prefill).map(|s| s.tokens).sum();
        let waiting: usize = prefill_left.iter().sum();
        assert_eq!(prefill, budget.saturating_sub(decoding.len()).min(waiting), "budget use");
        for s in step {
            let i = index(s);
            if s.kind == StepKind::Prefill {
                prefill_left[i] -= s.tokens;
            }
            generated[i] += usize::from(s.token.is_some());
        }
    }
    assert!(prefill_left.iter().all(|&l| l == 0));
    // The same ids as the serial policies.
    let fifo = schedule::run(
        &model,
        &jobs,
        RunConfig { policy: Policy::Fifo, chunk_size: None, max_active: 1, kv_budget: None, prefix_cache: false },
    )
    .unwrap();
    let ids = |t: &[schedule::TimelineStep]| request_metrics(t).into_iter().map(|m| m.output_ids).collect::<Vec<_>>();
    assert_eq!(ids(&outcome.timeline), ids(&fifo.timeline));
}

#[test]
fn half_precision_weights_halve_the_matrices_and_keep_the_logits_near_f32s() {
    let dir = support::tiny_dir();
    let f32m = LoadedModel::load(&dir).unwrap();
    let prompt = &prompts(&f32m)[0];
    // A prefill chunk and one decode step.
    let run = |m: &LoadedModel| -> Vec<Vec<f32>> {
        let mut cache = m.model.new_cache(prompt.len() + 1).unwrap();
        let first = m.model.forward(&mut cache, prompt).unwrap().to_vec1().unwrap();
        let second = m.model.forward(&mut cache, &[7]).unwrap().to_vec1().unwrap();
        vec![first, second]
    };
    let reference = run(&f32m);
    for dtype in [WeightDtype::F16, WeightDtype::Bf16] {
        let m = LoadedModel::load_as(&dir, dtype).unwrap();
        assert_eq!(m.model.weight_dtype(), dtype);
        assert_eq!(m.model.weight_bytes() * 2, f32m.model.weight_bytes(), "{dtype:?}");
        let logits = run(&m);
        for (a, b) in reference.iter().zip(&logits) {
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale;
            if dtype == WeightDtype::F16 {
                assert!(worst <= 1e-3, "F16 logits stray from F32 by {worst} of their scale");
            } else {
                // The checkpoint is stored in BF16, so the weights are the same values; the
                // layers' products round the activations to BF16 (kernel::paired), which moves
                // the logits by a small share of their scale, never to the same bits by chance.
                assert!(worst > 0.0 && worst <= 3e-2, "BF16 logits stray from F32 by {worst} of their scale");
            }
        }
    }
}
