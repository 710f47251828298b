//! The embedded server's limits over real HTTP on loopback, and the whole benchmark end to end
//! on the tiny generated checkpoint.

use common::load::LoadedModel;
use serde_json::{json, Value};
use serving_bench::server::{spawn, Running, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

async fn server(max_active: usize, queue: usize, max_body_bytes: usize) -> (Running, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    common::generate::generate_into(&common::generate::shape("tiny").unwrap(), &dir, false).unwrap();
    let model = Arc::new(LoadedModel::load(&dir).unwrap());
    let config = ServerConfig { model_name: "tiny".into(), max_active, queue, max_body_bytes, chunk_size: None };
    (spawn(([127, 0, 0, 1], 0).into(), model, config).await.unwrap(), tmp)
}

fn chat(tokens: usize, stream: bool) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": "Explain cache invalidation."}], "max_tokens": tokens, "stream": stream})
}

async fn health(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/health")).send().await.unwrap().json().await.unwrap()
}

/// Polls /health until `done` holds, for at most 20 s.
async fn wait_for(http: &reqwest::Client, base: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let h = health(http, base).await;
        if done(&h) {
            return h;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "server never reached the state: {h}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_naming_the_field() {
    let (s, _tmp) = server(2, 4, 4096).await;
    let base = format!("http://{}", s.addr);
    let http = reqwest::Client::new();
    let cases = [
        (json!({"model": "tiny", "messages": [], "max_tokens": 4}), "messages"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": 7}]}), "messages[0].content"),
        (json!({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}), "messages[0].role"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}), "max_tokens"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), "max_tokens"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}), "stream"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}), "messages"),
        (json!({"model": "tiny", "messages": [{"role": "user", "content": "word ".repeat(1000)}]}), "body"),
    ];
    for (body, field) in cases {
        let r = http.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{field}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    let r = http
        .post(format!("{base}/api/chat"))
        .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": -3}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["param"], "options.num_predict");
    let r = http.post(format!("{base}/v1/chat/completions")).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_answers_carry_usage_and_counters() {
    let (s, _tmp) = server(2, 4, 1 << 20).await;
    let base = format!("http://{}", s.addr);
    let http = reqwest::Client::new();
    let v: Value = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(5, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let body = json!({"model": "tiny", "prompt": "Explain cache invalidation.", "stream": false, "options": {"num_predict": 4}});
    let v: Value = http.post(format!("{base}/api/generate")).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!((v["done"].as_bool(), v["eval_count"].as_u64()), (Some(true), Some(4)));
    assert!(v["prompt_eval_duration"].as_u64().unwrap() > 0 && v["eval_duration"].as_u64().unwrap() > 0);
    let models: Value = http.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after() {
    let (s, _tmp) = server(1, 1, 1 << 20).await;
    let base = format!("http://{}", s.addr);
    let http = reqwest::Client::new();
    // One long request occupies the single slot, a second waits in the single queue place.
    let first = http.post(format!("{base}/v1/chat/completions")).json(&chat(3000, true)).send().await.unwrap();
    wait_for(&http, &base, |h| h["active"] == 1).await;
    let second = http.post(format!("{base}/v1/chat/completions")).json(&chat(3000, true)).send().await.unwrap();
    wait_for(&http, &base, |h| h["queued"] == 1).await;
    let third = http.post(format!("{base}/v1/chat/completions")).json(&chat(4, true)).send().await.unwrap();
    assert_eq!(third.status(), 503);
    assert_eq!(third.headers()["retry-after"], "1");
    assert_eq!(health(&http, &base).await["rejected"], 1);
    drop((first, second));
    wait_for(&http, &base, |h| h["active"] == 0 && h["queued"] == 0).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_session() {
    let (s, _tmp) = server(2, 4, 1 << 20).await;
    let base = format!("http://{}", s.addr);
    let http = reqwest::Client::new();
    let mut response = http
        .post(format!("{base}/api/chat"))
        .json(
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 3000}}),
        )
        .send()
        .await
        .unwrap();
    let first = response.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    assert_eq!(health(&http, &base).await["active"], 1);
    drop(response);
    let h = wait_for(&http, &base, |h| h["active"] == 0).await;
    assert_eq!((h["cancelled"].as_u64(), h["completed"].as_u64()), (Some(1), Some(0)));
    s.stop().await;
}

#[test]
fn the_benchmark_runs_end_to_end_on_the_embedded_server() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .env("OPENAI_API_KEY", "sk-test-secret-never-recorded")
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("sk-test-secret-never-recorded"));
    let a: common::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert_eq!(a.runtimes.len(), 2);
    // The manifest: 3 rounds at concurrency 1 and 4, 32 tokens each, through both APIs.
    assert_eq!(a.requests.len(), 2 * (1 + 4) * 3);
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests.iter().find(|r| !r.ok()));
    for r in &a.requests {
        let (n, _) = r.output_tokens();
        assert_eq!(n, 32, "{r:?}");
        assert!(r.scheduled_s <= r.sent_s.unwrap() && r.first_token_s.unwrap() <= r.end_s);
    }
    // The summary is exactly what the records say.
    assert_eq!(a.summary, common::serving::summarize_all(&a.runtimes, &a.requests));
    let ollama = a.summary.iter().find(|row| row["runtime"] == "embedded-ollama" && row["concurrency"] == 4).unwrap();
    assert_eq!((ollama["requests"].as_u64(), ollama["successes"].as_u64()), (Some(12), Some(12)));
    assert!(ollama["prompt_tps_mean"].as_f64().unwrap() > 0.0, "Ollama's counters give prefill speed");
    let openai = a.summary.iter().find(|row| row["runtime"] == "embedded-openai").unwrap();
    assert!(openai["prompt_tps_mean"].is_null() && openai["prompt_tps_note"].is_string());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("embedded-ollama") && stdout.contains("artifact: "), "{stdout}");

    // The audit accepts it, and names a summary number edited by hand even when resealed.
    let ws = common::workspace::Workspace { root: root() };
    let report = common::audit::audit_artifact(&ws, &out);
    assert_eq!(report.verdict, common::audit::Verdict::Ok, "{:#?}", report.findings);
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["summary"][1]["ttft_s_p50"] = json!(0.001);
    let map = v.as_object_mut().unwrap();
    map.remove("seal");
    let seal = common::artifact::seal(&Value::Object(map.clone()));
    map.insert("seal".into(), serde_json::to_value(seal).unwrap());
    let edited = tmp.path().join("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    let report = common::audit::audit_artifact(&ws, &edited);
    assert_eq!(report.verdict, common::audit::Verdict::Wrong);
    assert!(report.first_reason().starts_with("summary[1].ttft_s_p50"), "{}", report.first_reason());
}

#[test]
fn serve_binds_loopback_and_stops_cleanly_on_ctrl_c() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .args(["serve", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(line.contains("on http://127.0.0.1:"), "{line}");
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    let body: Value = reqwest::blocking_get_json(&format!("{url}/api/version"));
    assert!(body["version"].is_string());
    std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// A tiny blocking GET for the test above (the server runs in another process).
mod reqwest {
    pub use ::reqwest::*;
    pub fn blocking_get_json(url: &str) -> serde_json::Value {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { ::reqwest::get(url).await.unwrap().json().await.unwrap() })
    }
}

#[test]
fn bad_command_lines_are_one_line_errors_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never.json");
    let cases: [(&[&str], &str); 5] = [
        (&["--target", "vllm"], "write KIND=URL"),
        (&["--target", "grpc=http://127.0.0.1:1"], "unknown target kind `grpc`"),
        (&["--target", "openai=https://127.0.0.1:1"], "must start with http://"),
        (&["--concurrency", "0"], "concurrency: every level must be at least 1"),
        (&["--timeout=-1"], "total_timeout_s: -1"),
    ];
    for (args, expected) in cases {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
            .current_dir(root())
            .env("LAB_MODELS_DIR", tmp.path().join("models"))
            .args(args)
            .args(["--model-name", "m", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.lines().any(|l| l.starts_with("error:") && l.contains(expected)), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote an artifact");
    }
}
