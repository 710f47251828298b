//! The client against a scripted server on loopback. Each test names its fault injector: a tiny
//! raw-TCP server that answers one request the way a broken or slow server would, which a real
//! inference server cannot be made to do on demand. Every fault must end as a classified failure
//! (never a panic, never a lost record), and a clean stream in one-byte reads must succeed.

mod support;

use loadgen::client::{http_client, measure, request_headers, RequestOptions, Spec, Timeouts};
use serving_bench::serving::{Endpoint, ErrorClass, Kind, RequestRecord, Runtime};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the scripted server writes, in order; `Pause` waits before the next write.
#[derive(Clone)]
enum Step {
    Write(Vec<u8>),
    Pause(Duration),
    /// Write these bytes one at a time, flushing each.
    Trickle(Vec<u8>),
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
const NDJSON_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n";

fn sse_text(t: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}]}}\n\n")
}

fn good_sse() -> String {
    format!(
        "{SSE_HEAD}data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\"}},\"finish_reason\":null}}]}}\n\n{}{}\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"length\"}}]}}\n\n\
         data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":3}}}}\n\ndata: [DONE]\n\n",
        sse_text("Hello"),
        sse_text(" world")
    )
}

/// Fault injector: serves one connection with `script`, reading the request first.
async fn scripted(script: Vec<Step>) -> String {
    scripted_seeing(script).await.0
}

/// [`scripted`], also giving the request it read.
async fn scripted_seeing(script: Vec<Step>) -> (String, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (request, seen_request) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let _ = request.send(read_request(&mut sock).await);
        for step in script {
            match step {
                Step::Write(b) => {
                    if sock.write_all(&b).await.is_err() {
                        return;
                    }
                }
                Step::Pause(d) => tokio::time::sleep(d).await,
                Step::Trickle(b) => {
                    for byte in b {
                        if sock.write_all(&[byte]).await.is_err() {
                            return;
                        }
                        let _ = sock.flush().await;
                        tokio::time::sleep(Duration::from_micros(50)).await;
                    }
                }
            }
        }
        let _ = sock.shutdown().await;
    });
    (format!("http://{addr}"), seen_request)
}

/// Reads a request: until the end of the headers and the JSON body (its closing brace at the
/// end; a GET has none), or until the client stops sending.
async fn read_request(sock: &mut (impl tokio::io::AsyncRead + Unpin)) -> Vec<u8> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = Vec::new();
    let complete =
        |seen: &[u8]| seen.windows(4).any(|w| w == b"\r\n\r\n") && (seen.starts_with(b"GET ") || seen.ends_with(b"}"));
    while !complete(&seen) {
        let n = sock.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        first_token: Duration::from_millis(1000),
        idle: Duration::from_millis(500),
        total: Duration::from_secs(3),
    }
}

async fn run(kind: Kind, base: String, t: Timeouts) -> RequestRecord {
    run_with(&http_client(&t, Default::default(), false), target(kind, base, Default::default()), t).await
}

/// A scripted server as a target, and how requests to it are made.
type Target = (Runtime, RequestOptions);

/// One request for "hi" (at most 3 tokens) to `target` through `http`.
async fn run_with(http: &loadgen::client::Http, target: Target, t: Timeouts) -> RequestRecord {
    run_capped(http, target, t, 3).await
}

/// One request for "hi" with a cap of `max_tokens` to `target` through `http`.
async fn run_capped(
    http: &loadgen::client::Http,
    (target, options): Target,
    t: Timeouts,
    max_tokens: usize,
) -> RequestRecord {
    let spec = Spec {
        concurrency: 1,
        round: 0,
        index: 0,
        prompt_name: "short",
        prompt: "hi",
        messages: None,
        max_tokens,
        seed: 1,
        options,
    };
    measure(http, &target, &spec, &t, Instant::now(), None).await
}

fn target(kind: Kind, base: String, options: RequestOptions) -> Target {
    (Runtime { name: "scripted".into(), kind, base_url: base, model: "m".into(), replicas: Vec::new() }, options)
}

fn w(s: &str) -> Step {
    Step::Write(s.as_bytes().to_vec())
}

#[tokio::test]
async fn a_clean_stream_in_one_byte_reads_succeeds() {
    let base = scripted(vec![Step::Trickle(good_sse().into_bytes())]).await;
    let r = run(Kind::OpenAi, base, timeouts()).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    assert_eq!((r.chunks, r.usage_completion_tokens, r.finish_reason.as_deref()), (2, Some(3), Some("length")));
    assert_eq!(r.chunk_gaps_s.len(), 1);
    let (sched, sent, byte, token) =
        (r.scheduled_s, r.sent_s.unwrap(), r.first_byte_s.unwrap(), r.first_token_s.unwrap());
    assert!(sched <= sent && sent <= byte && byte <= token && token <= r.end_s, "{r:?}");
}

#[tokio::test]
async fn a_stream_without_done_marker_but_finished_succeeds() {
    let body = good_sse().replace("data: [DONE]\n\n", "");
    let r = run(Kind::OpenAi, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
}

#[tokio::test]
async fn a_stream_that_ends_well_without_text_is_an_empty_stream_failure() {
    // A role chunk, the finish, usage of zero tokens, the marker: well formed, and nothing to time.
    let body = format!(
        "{SSE_HEAD}data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\"}},\"finish_reason\":null}}]}}\n\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":0}}}}\n\ndata: [DONE]\n\n"
    );
    let r = run(Kind::OpenAi, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::EmptyStream), "{:?}", r.error_detail);
    assert!(!r.ok() && r.error_detail.is_some() && r.first_token_s.is_none());
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    // The same for Ollama's NDJSON: a final object after no text.
    let body = format!(
        "{NDJSON_HEAD}{{\"message\":{{\"content\":\"\"}},\"done\":true,\"done_reason\":\"stop\",\"eval_count\":0}}\n"
    );
    let r = run(Kind::Ollama, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::EmptyStream), "{:?}", r.error_detail);
    // It is counted among the failures by its class, as the audit recomputes them.
    let runtimes = [scripted_runtime(Kind::Ollama)];
    let summary = serving_bench::serving::summarize_all(
        &serving_bench::cli::seed_parameters(),
        &runtimes,
        std::slice::from_ref(&r),
    );
    assert_eq!(summary[0].failures_by_class["empty_stream"], 1, "{:?}", summary[0]);
}

#[tokio::test]
async fn credentials_in_a_target_url_are_sent_as_basic_auth() {
    let (base, seen) = scripted_seeing(vec![Step::Write(good_sse().into_bytes())]).await;
    let with_credentials = base.replace("http://", "http://alice:s3cret@");
    let r = run(Kind::OpenAi, with_credentials, timeouts()).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    let request = String::from_utf8(seen.await.unwrap()).unwrap().to_ascii_lowercase();
    // base64("alice:s3cret")
    assert!(request.contains("authorization: basic ywxpy2u6cznjcmv0"), "{request}");
}

#[tokio::test]
async fn headers_an_api_key_from_any_variable_and_the_completions_endpoint_are_sent_and_kept_secret() {
    // SAFETY of set_var: no other test reads this variable.
    std::env::set_var("SERVING_BENCH_TEST_CREDENTIAL", "abc123xyz");
    let specs = ["X-Bench: one".to_string(), "X-Api-Token: tok-987654".to_string()];
    let (headers, names) = request_headers(&specs, &[], Some("SERVING_BENCH_TEST_CREDENTIAL")).unwrap();
    assert_eq!(names, ["x-bench", "x-api-token", "authorization"]);
    let (base, seen) = scripted_seeing(vec![Step::Write(good_sse().into_bytes())]).await;
    let options = RequestOptions { endpoint: Endpoint::Completions, ignore_eos: true, ..Default::default() };
    let target = target(Kind::OpenAi, base, options);
    let t = timeouts();
    let r = run_with(&http_client(&t, headers, false), target, t).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    let request = String::from_utf8(seen.await.unwrap()).unwrap();
    let lower = request.to_ascii_lowercase();
    assert!(request.starts_with("POST /v1/completions "), "{request}");
    for line in ["authorization: bearer abc123xyz", "x-bench: one", "x-api-token: tok-987654"] {
        assert!(lower.contains(line), "{line} not sent: {request}");
    }
    assert!(request.contains("\"prompt\":\"hi\"") && request.contains("\"ignore_eos\":true"), "{request}");
    // No header value is recorded: the key and values of six characters or more are redacted
    // wherever they would appear in an artifact (a short one would match ordinary words).
    let redacted = common::artifact::Redactor::from_env().redact_str("abc123xyz tok-987654 one");
    assert_eq!(redacted, "<redacted> <redacted> one");
    // A variable named but unset is an error, not a silent run without the key.
    let err = request_headers(&[], &[], Some("SERVING_BENCH_TEST_UNSET")).unwrap_err();
    assert_eq!(err.to_string(), "--api-key-env SERVING_BENCH_TEST_UNSET: the variable is not set");
    assert!(request_headers(&["no colon".into()], &[], None).is_err());
    // A malformed header's error shows its name, never its value.
    let err = request_headers(&["X-Password: S3cr\nt".into()], &[], None).unwrap_err().to_string();
    assert!(err.contains("X-Password:<redacted>") && !err.contains("S3cr"), "{err}");
}

/// A scripted server (fault injector: a real server cannot be made to lie about its counts)
/// whose usage claims 100,000,000 tokens for one chunk of text under `max_tokens` 3.
#[tokio::test]
async fn usage_that_contradicts_the_request_is_a_failure_of_its_own_and_enters_no_throughput() {
    let lie = good_sse().replace("\"completion_tokens\":3", "\"completion_tokens\":100000000");
    let r = run(Kind::OpenAi, scripted(vec![w(&lie)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::InconsistentUsage), "{:?}", r.error_detail);
    assert!(r.error_detail.as_deref().unwrap().contains("100000000 is more than the 3 tokens"), "{:?}", r.error_detail);
    assert_eq!((r.max_tokens, r.usage_completion_tokens), (Some(3), Some(100_000_000)));
    // Ollama's counters are held to the same cap.
    let body = format!(
        "{NDJSON_HEAD}{{\"message\":{{\"content\":\"Hi\"}},\"done\":false}}\n\
         {{\"message\":{{\"content\":\"\"}},\"done\":true,\"done_reason\":\"length\",\"eval_count\":4,\"eval_duration\":1000}}\n"
    );
    let r = run(Kind::Ollama, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::InconsistentUsage), "{:?}", r.error_detail);
    // Running counts that add up past the final count are no success either.
    let chunk = |t: &str, n: u64| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{n}}}}}\n\n")
    };
    let script = vec![
        w(SSE_HEAD),
        w(&chunk("Hel", 2)),
        w(&chunk("lo", 3)),
        w("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"),
    ];
    let (base, _) = scripted_seeing(script).await;
    let target = target(Kind::OpenAi, base, RequestOptions { continuous_usage: true, ..Default::default() });
    let t = timeouts();
    let r = run_with(&http_client(&t, Default::default(), false), target, t).await;
    assert_eq!(r.error, Some(ErrorClass::InconsistentUsage), "{:?}", r.error_detail);
    // In the summary it is a failure by its class, and no token of it is throughput.
    let runtimes = [scripted_runtime(Kind::OpenAi)];
    let row = &serving_bench::serving::summarize_all(&serving_bench::cli::seed_parameters(), &runtimes, &[r])[0];
    assert_eq!(row.failures_by_class["inconsistent_usage"], 1, "{row:?}");
    assert_eq!(row.successes, 0);
    assert_eq!(row.aggregate_output_tps.mean, Some(0.0), "{row:?}");
}

#[tokio::test]
async fn running_usage_counts_give_each_chunk_its_tokens_and_per_token_gaps() {
    let chunk = |t: &str, n: u64| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{n}}}}}\n\n")
    };
    let script = vec![
        w(SSE_HEAD),
        w(&chunk("Hel", 1)),
        Step::Pause(Duration::from_millis(40)),
        w(&chunk("lo wor", 3)),
        Step::Pause(Duration::from_millis(40)),
        w(&chunk("ld", 4)),
        w("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n"),
    ];
    let (base, seen) = scripted_seeing(script).await;
    let options = RequestOptions { continuous_usage: true, ..Default::default() };
    let target = target(Kind::OpenAi, base, options);
    let t = timeouts();
    let r = run_capped(&http_client(&t, Default::default(), false), target, t, 4).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    assert_eq!((r.chunks, r.chunk_tokens.clone()), (3, vec![1, 2, 1]));
    let gaps = r.token_gaps();
    assert_eq!(gaps.len(), 3, "the second chunk's gap splits over its two tokens");
    assert_eq!((gaps[0], gaps[2]), (r.chunk_gaps_s[0] / 2.0, r.chunk_gaps_s[1]));
    assert!(String::from_utf8(seen.await.unwrap()).unwrap().contains("\"continuous_usage_stats\":true"));
    // Without a count on every chunk the record keeps none, and inter-token latency is per chunk.
    let runtimes = [scripted_runtime(Kind::OpenAi)];
    let row = &serving_bench::serving::summarize_all(
        &serving_bench::cli::seed_parameters(),
        &runtimes,
        std::slice::from_ref(&r),
    )[0];
    assert_eq!((row.itl_source.as_str(), row.itl_s.n), ("usage", 3));
    let plain = run(Kind::OpenAi, scripted(vec![w(&good_sse())]).await, timeouts()).await;
    assert!(plain.chunk_tokens.is_empty());
    let row = &serving_bench::serving::summarize_all(
        &serving_bench::cli::seed_parameters(),
        &runtimes,
        std::slice::from_ref(&plain),
    )[0];
    assert_eq!(row.itl_source, "chunks");
}

/// A TLS server with a fresh self-signed certificate, answering each of `connections` with the
/// good stream; a real server cannot be given an untrusted certificate on demand.
async fn tls_server(connections: usize) -> String {
    let acceptor = support::self_signed_acceptor();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for _ in 0..connections {
            let (sock, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // An unverified client hangs up during the handshake: nothing to answer.
                let Ok(mut tls) = acceptor.accept(sock).await else { return };
                read_request(&mut tls).await;
                let _ = tls.write_all(good_sse().as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    format!("https://127.0.0.1:{}", addr.port())
}

#[tokio::test]
async fn https_verifies_certificates_unless_told_not_to() {
    let base = tls_server(2).await;
    let target = target(Kind::OpenAi, base, Default::default());
    let t = timeouts();
    let verified = run_with(&http_client(&t, Default::default(), false), target.clone(), t).await;
    assert_eq!(verified.error, Some(ErrorClass::Connect), "{:?}", verified.error_detail);
    let detail = verified.error_detail.unwrap();
    assert!(detail.starts_with("TLS: the server's certificate is not trusted; pass --insecure"), "{detail}");
    let insecure = run_with(&http_client(&t, Default::default(), true), target, t).await;
    assert_eq!(insecure.error, None, "{:?}", insecure.error_detail);
    assert_eq!(insecure.chunks, 2);
}

#[tokio::test]
async fn fault_connection_refused() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let r = run(Kind::OpenAi, format!("http://{addr}"), timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::Connect), "{:?}", r.error_detail);
    assert_eq!(r.status, None);
    let detail = r.error_detail.unwrap();
    assert!(detail.starts_with("connection refused: nothing listens at that address and port"), "{detail}");
}

#[tokio::test]
async fn fault_http_500() {
    let base =
        scripted(vec![w("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops")])
            .await;
    let r = run(Kind::OpenAi, base, timeouts()).await;
    assert_eq!((r.error, r.status), (Some(ErrorClass::HttpStatus), Some(500)));
    assert!(r.error_detail.unwrap().contains("oops"));
}

#[tokio::test]
async fn fault_stream_cut_midway() {
    // Connection-close framing: the stream simply ends before its final event.
    let cut = format!("{SSE_HEAD}{}", sse_text("Hel"));
    let r = run(Kind::OpenAi, scripted(vec![w(&cut)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::TruncatedStream), "{:?}", r.error_detail);
    assert_eq!(r.chunks, 1);
    // Chunked framing cut inside a chunk: the transport itself reports the break.
    let chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n\
                   40\r\n{\"message\":{\"content\":\"Hi\"},\"done\":false}\n";
    let r = run(Kind::Ollama, scripted(vec![w(chunked)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::TruncatedStream), "{:?}", r.error_detail);
}

#[tokio::test]
async fn fault_stall_past_idle_timeout() {
    let script = vec![w(SSE_HEAD), w(&sse_text("Hi")), Step::Pause(Duration::from_millis(1500)), w(&good_sse())];
    let r = run(Kind::OpenAi, scripted(script).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::IdleTimeout), "{:?}", r.error_detail);
}

#[tokio::test]
async fn fault_no_text_before_first_token_timeout() {
    // Keep-alive comments arrive (so the idle timer never fires) but no generated text does.
    let mut script = vec![w(SSE_HEAD)];
    for _ in 0..12 {
        script.push(w(": waiting\n\n"));
        script.push(Step::Pause(Duration::from_millis(150)));
    }
    let r = run(Kind::OpenAi, scripted(script).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::FirstTokenTimeout), "{:?}", r.error_detail);
}

#[tokio::test]
async fn fault_slow_stream_past_total_timeout() {
    let mut script = vec![w(SSE_HEAD)];
    for _ in 0..30 {
        script.push(w(&sse_text("x")));
        script.push(Step::Pause(Duration::from_millis(150)));
    }
    let t = Timeouts { total: Duration::from_millis(1200), ..timeouts() };
    let r = run(Kind::OpenAi, scripted(script).await, t).await;
    assert_eq!(r.error, Some(ErrorClass::TotalTimeout), "{:?}", r.error_detail);
    assert!(r.chunks >= 2);
}

#[tokio::test]
async fn fault_malformed_json() {
    let body = format!("{SSE_HEAD}{}data: {{\"choices\": [oops\n\n", sse_text("Hi"));
    let r = run(Kind::OpenAi, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::BadJson), "{:?}", r.error_detail);
    let nd = format!("{NDJSON_HEAD}{{\"message\":{{\"content\":\"Hi\"}},\"done\":false}}\nnot json\n");
    let r = run(Kind::Ollama, scripted(vec![w(&nd)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::BadJson), "{:?}", r.error_detail);
}

#[tokio::test]
async fn fault_error_event() {
    let body = format!("{SSE_HEAD}{}event: error\ndata: {{\"message\":\"engine overloaded\"}}\n\n", sse_text("Hi"));
    let r = run(Kind::OpenAi, scripted(vec![w(&body)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::ErrorEvent));
    assert_eq!(r.error_detail.as_deref(), Some("engine overloaded"));
    let nd = format!("{NDJSON_HEAD}{{\"error\":\"model not loaded\"}}\n");
    let r = run(Kind::Ollama, scripted(vec![w(&nd)]).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::ErrorEvent));
}

#[tokio::test]
async fn ollama_stream_in_one_byte_reads_keeps_counters() {
    let body = format!(
        "{NDJSON_HEAD}{{\"message\":{{\"role\":\"assistant\",\"content\":\"Hi\"}},\"done\":false}}\n\
         {{\"message\":{{\"role\":\"assistant\",\"content\":\"\"}},\"done\":true,\"done_reason\":\"stop\",\
         \"eval_count\":2,\"eval_duration\":4000000,\"prompt_eval_count\":6,\"prompt_eval_duration\":1000000}}\n"
    );
    let r = run(Kind::Ollama, scripted(vec![Step::Trickle(body.into_bytes())]).await, timeouts()).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    assert_eq!((r.ollama_eval_count, r.ollama_prompt_eval_count), (Some(2), Some(6)));
    assert_eq!(r.decode_tps(), Some(500.0));
    assert_eq!(r.prompt_tps(), Some(6000.0));
}

/// The runtime a scripted server's records are summarized under.
fn scripted_runtime(kind: Kind) -> Runtime {
    Runtime { name: "scripted".into(), kind, base_url: String::new(), model: "m".into(), replicas: Vec::new() }
}

/// Fault injector: closes the first `closed` connections as soon as their request is read (what
/// the client sees when a server closes a kept-alive connection as the request goes out), then
/// answers every later one with `answer`.
async fn closing_then(closed: usize, answer: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for n in 0.. {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            read_request(&mut sock).await;
            if n >= closed {
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            }
            drop(sock);
        }
    });
    format!("http://{addr}")
}

/// [`closing_then`] answering a good stream.
async fn closing(closed: usize) -> String {
    closing_then(closed, good_sse()).await
}

/// A connection closed before any answer is sent again once, on a fresh connection, and the
/// record says so; closed twice, the request fails.
#[tokio::test]
async fn a_connection_closed_before_any_answer_is_resent_once() {
    let r = run(Kind::OpenAi, closing(1).await, timeouts()).await;
    assert_eq!(r.error, None, "{:?}", r.error_detail);
    assert!(r.resent && r.usage_completion_tokens == Some(3), "{r:?}");
    let r = run(Kind::OpenAi, closing(2).await, timeouts()).await;
    assert_eq!(r.error, Some(ErrorClass::TruncatedStream), "{:?}", r.error_detail);
    assert!(r.resent, "{r:?}");
    // A clean first send is not marked.
    let r = run(Kind::OpenAi, closing(0).await, timeouts()).await;
    assert!(r.ok() && !r.resent, "{r:?}");
}

/// A `/metrics` GET whose connection closed before any answer is sent again once, and the scrape
/// says so and times the answered sending; closed twice, the scrape is an error without values.
#[tokio::test]
async fn a_scrape_closed_before_any_answer_is_resent_once() {
    use loadgen::scrape::Scraper;
    let exposition = "# TYPE serve_num_requests_running gauge\nserve_num_requests_running 2\n";
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{exposition}",
        exposition.len()
    );
    let http = http_client(&timeouts(), Default::default(), false);
    let scrapes = |closed: usize| {
        let (http, answer) = (http.clone(), answer.clone());
        async move {
            let (runtime, _) = target(Kind::OpenAi, closing_then(closed, answer).await, Default::default());
            let scraper = Scraper::start(&http, &runtime, Duration::from_secs(3600), Instant::now()).await;
            scraper.finish(&runtime.name, "c1".into(), 0).await.scrapes
        }
    };
    // The first scrape's connection is closed once; the last one is answered at once.
    let [first, last] = &scrapes(1).await[..] else { panic!("two scrapes: before and after the group") };
    assert!(first.resent && first.error.is_none(), "{first:?}");
    assert_eq!(first.values.get("serve_num_requests_running"), Some(&2.0));
    assert!(first.answer_s.is_some_and(|a| a >= 0.0) && !last.resent && last.answer_s.is_some(), "{last:?}");
    // Closed twice: the first scrape fails, with no answer time.
    let series = scrapes(2).await;
    assert!(series[0].resent && series[0].error.is_some() && series[0].answer_s.is_none(), "{:?}", series[0]);
    assert!(series[1].error.is_none() && !series[1].resent, "{:?}", series[1]);
}

/// A scripted server (fault injector: a real server cannot be made to break its own word on
/// demand) that ends by `length` after 3 tokens of a cap of 8, and one that sends the stop string
/// it was given: each answer is a success, its text digested, its inconsistency recorded.
#[tokio::test]
async fn answers_that_contradict_their_request_are_recorded_as_inconsistent_successes() {
    let t = timeouts();
    let http = http_client(&t, Default::default(), false);
    let short =
        run_capped(&http, target(Kind::OpenAi, scripted(vec![w(&good_sse())]).await, Default::default()), t, 8).await;
    assert_eq!(short.error, None, "{:?}", short.error_detail);
    let why = short.inconsistency.as_deref().unwrap();
    assert!(why.contains("length after 3 tokens") && why.contains("max_tokens 8"), "{why}");
    let digest = common::digest::bytes_digest(b"Hello world", common::digest::Algorithm::Sha256);
    assert_eq!(
        (short.text_sha256.as_deref(), short.text.as_deref()),
        (Some(digest.as_str()), None),
        "no text kept unless asked"
    );
    // A stop string sent, and the server sends it anyway (finish_reason stop, 3 of 3 tokens).
    let sampling = serving_bench::serving::Sampling { stop: vec![" wor".into()], ..Default::default() };
    let options = RequestOptions { sampling: std::sync::Arc::new(sampling), keep_text: true, ..Default::default() };
    let past = good_sse().replace("\"length\"", "\"stop\"");
    let r = run_with(&http, target(Kind::OpenAi, scripted(vec![w(&past)]).await, options), t).await;
    assert_eq!((r.error, r.text.as_deref()), (None, Some("Hello world")), "{:?}", r.error_detail);
    let why = r.inconsistency.as_deref().unwrap();
    assert!(why.contains("stop string \" wor\" at character 5"), "{why}");
    // The same answer, consistent with its cap of 3: nothing recorded.
    let fine = run(Kind::OpenAi, scripted(vec![w(&good_sse())]).await, t).await;
    assert_eq!(fine.inconsistency, None);
}
