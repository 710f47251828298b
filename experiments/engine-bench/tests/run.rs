//! `engine-bench` end to end on the tiny generated checkpoint, in a scratch copy of the workspace
//! (its manifest names `tiny`): every comparison records both sides pair by pair, the audit
//! recomputes the ratios, and an edited pair (resealed) is named.

use audit::{Audit, Verdict};
use common::workspace::Workspace;
use engine_bench::{Artifact, EngineBench};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

#[test]
fn a_run_records_every_pair_and_the_audit_recomputes_the_ratios() {
    let real = source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir_all(root.join("manifests/models")).unwrap();
    std::fs::create_dir_all(root.join("manifests/engine-bench")).unwrap();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "experiments", "schemas", "manifests/models/tiny.json"] {
        let status = Command::new("cp").arg("-r").arg(real.join(item)).arg(root.join(item)).status().unwrap();
        assert!(status.success(), "copying {item}");
    }
    let manifest = json!({
        "experiment": "engine-bench", "model": "tiny",
        "parameters": {"decode_tokens": 4, "rounds": 2, "steps": 3, "short_context": 64, "long_context": 256, "batch": 2,
                       "prompts": [{"tokens": 128, "rounds": 1}, {"tokens": 512, "rounds": 1}], "probe_bytes": 16 << 20},
        "expectations": null
    });
    std::fs::write(root.join("manifests/engine-bench/tiny.json"), manifest.to_string()).unwrap();
    let out = tmp.path().join("bench.json");
    let o = Command::new(env!("CARGO_BIN_EXE_engine-bench"))
        .current_dir(&root)
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .args(["--offline", "--manifest", "manifests/engine-bench/tiny.json", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a: Artifact = common::artifact::read_artifact(&out).unwrap();
    // Without llama.cpp's binding its comparisons are skipped, and say so.
    assert!(a.llama_cpp.is_none() && a.skipped.iter().any(|s| s.contains(".venv-llama")), "{:?}", a.skipped);
    let names: Vec<&str> = a.comparisons.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "decode vs stock candle",
            "decode step, long vs short context",
            "batched decode step",
            engine_bench::STREAM,
            engine_bench::SAMPLED_STEP
        ]
    );
    // The stream is the model's at the short context: its KV part is the cached positions' keys
    // and values (tiny: 3 layers, 2 KV heads of 16 dimensions, F32).
    assert_eq!(a.stream.kv_bytes, 64 * 3 * 2 * 2 * 16 * 4);
    assert_eq!(a.stream.total_bytes, a.stream.layer_bytes + a.stream.head_bytes + a.stream.kv_bytes);
    assert_eq!(a.stream.probe_bytes, 16 << 20);
    assert_eq!(a.comparisons[0].a.len(), 2, "one pair per round");
    assert_eq!(a.comparisons[1].a.len(), 3, "one pair per step");
    assert_eq!(a.overhead.len(), 4);
    let ws = Workspace { root };
    let audit = Audit::new(&ws, &[&EngineBench]);
    let r = audit.audit_artifact(&out);
    assert_eq!(r.verdict, Verdict::Ok, "{:#?}", r.findings);

    let mut v: Value = common::artifact::read_artifact(&out).unwrap();
    v["comparisons"][2]["b"][0] = json!(1e-6);
    let edited = reseal(v, tmp.path().join("edited.json"));
    let r = audit.audit_artifact(&edited);
    assert_eq!(r.verdict, Verdict::Wrong);
    assert!(r.findings.iter().any(|f| f.field == "comparisons[2].ratios"), "{:#?}", r.findings);

    // A quantized file recorded where no quantized pair ran (resealed) is named.
    let mut v: Value = common::artifact::read_artifact(&out).unwrap();
    let stream = v["stream"].clone();
    v["native"] = json!([{ "weights": "q4_0", "stream": stream, "resident": null }]);
    let edited = reseal(v, tmp.path().join("native.json"));
    let r = audit.audit_artifact(&edited);
    assert_eq!(r.verdict, Verdict::Wrong);
    assert!(r.findings.iter().any(|f| f.field == "native"), "{:#?}", r.findings);

    // The fresh process that measures resident memory, on tiny's Q4_0 export: it holds at least
    // the file it read whole and its KV cache, and says so as one JSON line.
    let gguf = tmp.path().join("tiny-q4_0.gguf");
    common::gguf::export(&tmp.path().join("models/generated/tiny"), &gguf, common::gguf::WeightType::Q4_0).unwrap();
    let ids = tmp.path().join("ids.json");
    std::fs::write(&ids, serde_json::to_vec(&(1..=40u32).collect::<Vec<_>>()).unwrap()).unwrap();
    let fresh = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_engine-bench"))
            .env("ENGINE_BENCH_RESIDENT_OF", file)
            .env("ENGINE_BENCH_RESIDENT_IDS", &ids)
            .env("ENGINE_BENCH_RESIDENT_DECODE", "4")
            .output()
            .unwrap()
    };
    let o = fresh(&gguf);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line: Value = serde_json::from_slice(&o.stdout).unwrap();
    let model = common::load::LoadedModel::load_as(&gguf, common::qwen::WeightDtype::Native).unwrap();
    assert_eq!(line["kv"].as_u64(), Some(model.model.cache_bytes(40 + 4 + 1) as u64));
    let file_bytes = std::fs::metadata(&gguf).unwrap().len();
    assert!(line["peak"].as_u64().unwrap() > file_bytes + line["kv"].as_u64().unwrap(), "{line}");
    let o = fresh(&tmp.path().join("missing.gguf"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("missing.gguf") && err.lines().count() == 1, "{err}");
}

/// `v` sealed again, as a forger would, written to `path`.
fn reseal(mut v: Value, path: std::path::PathBuf) -> std::path::PathBuf {
    v.as_object_mut().unwrap().remove(common::artifact::SEAL_KEY);
    let seal = common::artifact::seal(&v);
    v.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), serde_json::to_value(seal).unwrap());
    std::fs::write(&path, v.to_string()).unwrap();
    path
}
