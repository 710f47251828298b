use super::*;

fn params() -> Parameters {
    Parameters {
        prefix_tokens: vec![128],
        shares: vec![0.5],
        kv_budgets: vec![None],
        requests: 4,
        question_tokens: 3,
        max_new_tokens: 2,
        rounds: 1,
        seed: 1,
    }
}

fn step(job: usize, kind: StepKind, tokens: usize, position: usize, reused: usize, t: f64) -> TimelineStep {
    TimelineStep {
        job: job_id(job),
        kind,
        tokens,
        position,
        start_ms: t,
        end_ms: t + 1.0,
        token: Some(7),
        batch: 1,
        reused,
    }
}

#[test]
fn shares_spread_from_the_first_job_and_prompts_share_exactly_their_prefix() {
    let p = params();
    assert_eq!(p.sharing(0.5), [true, false, true, false]);
    assert_eq!(p.sharing(1.0), [true; 4]);
    assert_eq!(p.sharing(0.01), [true, false, false, false], "at least one");
    let prompts = draw_prompts(&p, 1000);
    let jobs = &prompts["p128-s0.5"];
    assert_eq!(jobs[0][..128], jobs[2][..128]);
    assert_ne!(jobs[0][..128], jobs[1][..128]);
    assert_ne!(jobs[0][128..], jobs[2][128..], "each its own question");
    assert_eq!(draw_prompts(&p, 1000), prompts, "the seed draws the same");
    assert!(p.validate().is_ok());
    let too_small = Parameters { kv_budgets: vec![Some(64)], ..params() };
    assert!(too_small.validate().unwrap_err().to_string().contains("kv_budgets[0]"));
}

#[test]
fn a_timeline_is_the_one_fifo_gives_or_it_is_named() {
    let p = params();
    let prompts = draw_prompts(&p, 1000)["p128-s0.5"].clone();
    let mut timeline = Vec::new();
    for (j, reused) in [0, 0, 128, 0].into_iter().enumerate() {
        let t = timeline.len() as f64 * 2.0;
        timeline.push(step(j, StepKind::Prefill, 131 - reused, reused, reused, t));
        timeline.push(step(j, StepKind::Decode, 1, 131, 0, t + 2.0));
    }
    let elapsed_ms = timeline.last().unwrap().end_ms;
    let run = RunRecord {
        point: "p128-s0.5".into(),
        prefix_tokens: 128,
        share: 0.5,
        kv_budget: None,
        reuse: true,
        round: 0,
        elapsed_ms,
        output_tokens_per_s: 0.0,
        cached_ttft_ms: None,
        prefill_tokens: 0,
        reused_tokens: 0,
        peak_kv_bytes: 0,
        kv_pool_bytes: 0,
        requests: Vec::new(),
        timeline,
    };
    assert_eq!(timeline_problem(&run, &prompts, 2), None);
    let records = requests_of(&run.timeline, &prompts, &p.sharing(0.5));
    assert_eq!((records[2].reused_tokens, records[2].prefill_tokens, records[2].shared), (128, 3, true));
    let forged = |edit: &dyn Fn(&mut RunRecord)| {
        let mut r = run.clone();
        edit(&mut r);
        timeline_problem(&r, &prompts, 2)
    };
    assert!(forged(&|r| r.reuse = false).is_some(), "reuse in a run without it");
    assert!(forged(&|r| r.timeline[4].position = 64).is_some());
    assert!(forged(&|r| r.timeline[1].batch = 2).is_some());
    assert!(forged(&|r| r.timeline.swap(0, 2)).is_some());
    assert!(forged(&|r| r.elapsed_ms += 1.0).is_some());
    let stopped = |r: &mut RunRecord| {
        r.timeline.pop();
        r.elapsed_ms = r.timeline.last().unwrap().end_ms;
    };
    assert_eq!(forged(&stopped), None, "a job may stop before its cap");
    assert!(timeline_problem(&run, &prompts, 1).is_some(), "past the cap");
}
