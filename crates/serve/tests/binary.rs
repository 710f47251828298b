//! The `serve` binary as a user runs it: its flags and their errors, the default manifest's
//! model served over real HTTP on loopback, and a clean stop on Ctrl-C.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The workspace root, where `manifests/` is found.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn serve(models: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_serve"));
    c.current_dir(root()).env("LAB_MODELS_DIR", models).args(args);
    c
}

/// Starts the server; returns it (stdout still open) and the first line it printed.
fn start(models: &Path, args: &[&str]) -> (Child, String) {
    let mut child = serve(models, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.as_mut().unwrap();
    let (mut line, mut byte) = (Vec::new(), [0u8]);
    while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    (child, String::from_utf8(line).unwrap())
}

/// One GET over a fresh loopback connection: the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn the_binary_serves_the_default_manifests_model_and_stops_cleanly_on_ctrl_c() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, line) = start(tmp.path(), &["--port", "0", "--policy", "interleave", "--max-active", "3"]);
    assert!(line.starts_with("serving `") && line.contains("policy interleave, up to 3 active"), "{line}");
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("http://")).unwrap().to_string();
    let (status, body) = get(&addr, "/api/version");
    assert!(status.ends_with("200 OK"), "{status}");
    let version: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(version["version"].is_string(), "{body}");
    // SAFETY: kill(2) on our own child's pid, which it still is: the child has not been waited on.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("warning:") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_flags_and_missing_models_fail_in_one_line_that_names_them() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, says) in [
        (&["--kv-budget", "12XB"][..], "`12XB` is not a KV budget"),
        (&["--max-active", "0"], "--max-active"),
        (&["--idle-timeout", "0"], "must be above 0"),
        (&["--model-dir", "no/such/folder"], "no/such/folder"),
        (&["--manifest", "no-such-manifest.json"], "no-such-manifest.json"),
    ] {
        let o = serve(tmp.path(), args).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    }
    // --help documents the defaults the server runs with.
    let help = String::from_utf8(serve(tmp.path(), &["--help"]).output().unwrap().stdout).unwrap();
    for default in ["[default: 8000]", "[default: batched]", "--kv-budget <POSITIONS|BYTES>", "--no-prefix-cache"] {
        assert!(help.contains(default), "{default} missing from:\n{help}");
    }
}
