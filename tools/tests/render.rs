//! Reports render the seed artifacts and a fresh tiny-model run into valid, deterministic
//! images that show what they claim, and compare two artifacts side by side.

use common::load::LoadedModel;
use common::policy::Policy;
use common::schedule::{self, request_metrics, Job, RunConfig};
use scheduler::study::{output_tokens_per_s, summarize_throughput, RequestRecord, RunRecord};
use std::path::{Path, PathBuf};
use tools::registry::EXPERIMENTS;

fn seed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/seeds").join(name)
}

/// A scheduler artifact's drawable part from a real run of the engine on the tiny checkpoint.
fn fresh_tiny_artifact(dir: &Path) -> PathBuf {
    let ckpt = dir.join("tiny");
    common::generate::generate_into(&common::generate::shape("tiny").unwrap(), &ckpt, false).unwrap();
    let model = LoadedModel::load(&ckpt).unwrap();
    let params = common::schedule::seed_workload();
    let jobs: Vec<Job> = params.jobs.iter().map(|j| Job::from_spec(&model, j).unwrap()).collect();
    let mut runs = Vec::new();
    for round in 0..2 {
        for config in [
            RunConfig { policy: Policy::Fifo, chunk_size: None, max_active: 2, kv_budget: None, prefix_cache: false },
            RunConfig {
                policy: Policy::Interleave,
                chunk_size: Some(64),
                max_active: 2,
                kv_budget: None,
                prefix_cache: false,
            },
            RunConfig {
                policy: Policy::Batched,
                chunk_size: Some(64),
                max_active: 3,
                kv_budget: None,
                prefix_cache: false,
            },
        ] {
            let out = schedule::run(&model, &jobs, config).unwrap();
            let requests: Vec<RequestRecord> = request_metrics(&out.timeline)
                .into_iter()
                .map(|m| RequestRecord {
                    text: model.decode(&m.output_ids),
                    prompt: String::new(),
                    prompt_tokens: 0,
                    id: m.id,
                    output_ids: m.output_ids,
                    ttft_ms: m.ttft_ms,
                    completion_ms: m.completion_ms,
                    max_gap_ms: m.max_gap_ms,
                    finish_reason: common::session::FinishReason::Length,
                    kv_cache_bytes: 0,
                    preemptions: 0,
                })
                .collect();
            runs.push(RunRecord {
                policy: config.policy,
                chunk_size: config.chunk_size,
                max_active: config.max_active,
                round,
                elapsed_ms: out.elapsed_ms,
                scheduler_overhead_ms: out.overhead_ms,
                output_tokens_per_s: output_tokens_per_s(&requests, out.elapsed_ms),
                peak_rss_bytes: out.peak_rss_bytes,
                kv_budget: config.kv_budget,
                prefix_cache: config.prefix_cache,
                peak_kv_bytes: out.peak_kv_bytes,
                kv_pool_bytes: out.kv_pool_bytes,
                requests,
                timeline: out.timeline,
            });
        }
    }
    let throughput = summarize_throughput(&runs);
    let value = serde_json::json!({"model_id": "generated/tiny", "arrival_policy": "all at once", "runs": runs, "throughput": throughput, "provenance": {"experiment": "scheduler"}});
    let path = dir.join("fresh-tiny.json");
    std::fs::write(&path, value.to_string()).unwrap();
    path
}

/// Width and height from a PNG's IHDR, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

fn render_all(inputs: &[PathBuf], out: &Path) -> String {
    render_with(inputs, out, &Default::default())
}

fn render_with(inputs: &[PathBuf], out: &Path, options: &common::experiment::ReportOptions) -> String {
    report::init_font().unwrap();
    inputs
        .iter()
        .map(|p| report::section(&report::load(&workspace(), p, EXPERIMENTS).unwrap(), out, options).unwrap())
        .collect()
}

#[test]
fn seeds_and_a_fresh_run_render_to_valid_images_showing_their_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = fresh_tiny_artifact(tmp.path());
    let out = tmp.path().join("report");
    let inputs = [seed("000_56313d9d03231830.txt"), seed("001_9c5fc480f3b35933.txt"), fresh];
    let md = render_all(&inputs, &out);

    for name in ["000_56313d9d03231830", "fresh-tiny"] {
        for metric in ["ttft", "completion", "max-gap"] {
            let stem = out.join(name).join(format!("compare-{metric}"));
            assert_eq!(png_size(&stem.with_extension("png")), (1000, 460));
            let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
            let batched = (name == "fresh-tiny").then_some("batched budget 64");
            let ids = ["interactive-a", "interactive-b", "long-document", "fifo", "interleave chunk 64"];
            for id in ids.into_iter().chain(batched) {
                assert!(svg.contains(id), "{name} {metric}: no `{id}`");
            }
        }
    }
    // Timelines exist only where steps were recorded: the fresh run, not the seed; one per
    // configuration (its median round), not one per round.
    assert!(!out.join("000_56313d9d03231830/timeline-00.svg").exists());
    assert!(!out.join("fresh-tiny/timeline-03.svg").exists(), "three configurations of two rounds each");
    for i in 0..3 {
        let stem = out.join(format!("fresh-tiny/timeline-{i:02}"));
        let (w, h) = png_size(&stem.with_extension("png"));
        assert_eq!((w, h), (1000, 140 + 60 * 3));
        assert!(std::fs::metadata(stem.with_extension("png")).unwrap().len() > 5_000, "a blank image?");
        let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
        for label in [
            "prefill",
            "decode",
            "first token",
            "completion",
            "long-document",
            "interactive-b",
            "milliseconds since the scheduler started",
            "the median of",
        ] {
            assert!(svg.contains(label), "timeline {i}: no `{label}`");
        }
    }
    for file in ["percentiles-ttft_s", "percentiles-total_s", "throughput"] {
        let stem = out.join("001_9c5fc480f3b35933").join(file);
        assert_eq!(png_size(&stem.with_extension("png")), (1000, 460));
        assert!(std::fs::read_to_string(stem.with_extension("svg")).unwrap().contains("vllm-metal c=4"), "{file}");
    }
    assert!(md.contains("| fifo | interactive-a | 1 | 524.6 | 716.5 | 28.1 |"), "the seed's numbers in the table");
    // The seeds judged on the manifests' claims: a line each, and their forest plot.
    assert!(
        md.contains("| interleave / fifo | 1 | 0.211 | **inconclusive** |"),
        "the seed's interleave claim as a point estimate"
    );
    assert!(md.contains("| `batching-raises-aggregate-throughput [vllm-metal]` |"), "the serving seed's claim");
    let forest = out.join("000_56313d9d03231830/claims");
    let svg = std::fs::read_to_string(forest.with_extension("svg")).unwrap();
    assert!(svg.contains("interleave-cuts-interactive-ttft") && svg.contains("inconclusive"));
    // One row per claim with an estimate (the seed has no batched run to estimate on).
    let rows = svg.matches("(inconclusive)").count() as u32;
    assert!(rows >= 5, "{rows}");
    assert_eq!(png_size(&forest.with_extension("png")).1, 110 + 34 * rows);
    assert!(md.contains("![time to first token](fresh-tiny/compare-ttft.svg)"));
    assert!(md.contains("No per-step timeline"));
    // The throughput table: every configuration of the fresh run, with two rounds each.
    for config in ["fifo", "interleave chunk 64", "batched budget 64"] {
        assert!(md.lines().any(|l| l.starts_with(&format!("| {config} | ")) && l.contains(" | 2 | ")), "{config}");
    }

    // Asked for every round: each configuration's two rounds, in order, one of them (the
    // faster) still called its median.
    let all = tmp.path().join("all-rounds");
    let md = render_with(&inputs[2..], &all, &common::experiment::ReportOptions { all_rounds: true });
    assert!(!all.join("fresh-tiny/timeline-06.svg").exists(), "three configurations of two rounds each");
    let svgs: Vec<String> =
        (0..6).map(|i| std::fs::read_to_string(all.join(format!("fresh-tiny/timeline-{i:02}.svg"))).unwrap()).collect();
    for (i, svg) in svgs.iter().enumerate() {
        assert!(svg.contains(&format!("(round {}", i % 2)), "timeline {i}");
    }
    for pair in svgs.chunks(2) {
        assert_eq!(
            pair.iter().filter(|svg| svg.contains(", the median of 2)")).count(),
            1,
            "one median per configuration"
        );
    }
    assert_eq!(md.matches("![timeline of ").count(), 6, "{md}");
}

#[test]
fn the_same_input_renders_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = fresh_tiny_artifact(tmp.path());
    let inputs = [seed("001_9c5fc480f3b35933.txt"), fresh];
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    assert_eq!(render_all(&inputs, &a), render_all(&inputs, &b));
    let mut count = 0;
    for entry in walk(&a) {
        let rel = entry.strip_prefix(&a).unwrap();
        assert_eq!(std::fs::read(&entry).unwrap(), std::fs::read(b.join(rel)).unwrap(), "{}", rel.display());
        count += 1;
    }
    assert!(count >= 10, "{count} files");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn artifacts_compare_side_by_side_with_ratios_and_provenance() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh_path = fresh_tiny_artifact(tmp.path());
    let ws = workspace();
    let load = |p: &std::path::Path| report::load(&ws, p, EXPERIMENTS).unwrap();
    let (old, fresh) = (seed("000_56313d9d03231830.txt"), load(&fresh_path));
    let md = report::compare(&[load(&old), fresh]).unwrap();
    assert!(md.contains("| fifo / interactive-a TTFT ms (median) | 524.647 |"), "{md}");
    assert!(md.contains("| predecessor environment |"), "{md}");
    // The same claim in each artifact: the seed's point estimate; this run stored none.
    assert!(
        md.contains("| `interleave-cuts-interactive-ttft` | < 1 | 0.211 (1 round): **inconclusive** | (not judged) |"),
        "{md}"
    );
    // Any number at once: each against the first.
    let md = report::compare(&[load(&old), load(&fresh_path), load(&old)]).unwrap();
    assert!(md.contains("| what | A | B | B / A | C | C / A |"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| fifo / interactive-a TTFT ms (median) | 524.647 |")).unwrap();
    assert!(row.ends_with("| 524.647 | 1.00 |"), "{row}");
    let serving = seed("001_9c5fc480f3b35933.txt");
    assert!(report::compare(&[load(&old), load(&serving)]).is_err());
    let md = report::compare(&[load(&serving), load(&serving)]).unwrap();
    assert!(md.contains("| vllm-metal c=4 vs vllm-metal c=4: TTFT p50 ms | 1169.111 | 1169.111 | 1.00 |"), "{md}");
    assert!(md.contains("| (none) | | |"));
}

fn workspace() -> common::workspace::Workspace {
    common::workspace::Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}
