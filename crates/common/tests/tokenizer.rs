//! A GGUF file's tokenizer gives llama.cpp's ids: on 1,200 strings (Unicode, digits, whitespace
//! runs, code, the special tokens alone, glued and cut short), for the real SmolLM2 file
//! (pre-tokenizer `smollm`) and for the tiny checkpoint's export (`qwen2`), with special tokens
//! parsed and read as text. The references are llama.cpp's own ids, written by
//! `scripts/llamacpp_tokenize.py` through its Python binding and committed.

mod support;

use common::load::LoadedModel;
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
struct Reference {
    gguf_sha256: String,
    special_tokens: Vec<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    literal_ids: Vec<u32>,
}

/// Every case's ids, both ways, against the reference; the mismatches are listed whole.
fn assert_llamacpp_ids(file: &Path, reference: &str) {
    let reference: Reference = serde_json::from_str(reference).unwrap();
    let (_, digest) = common::digest::file_digest(file, common::digest::Algorithm::Sha256).unwrap();
    assert_eq!(digest, reference.gguf_sha256, "the reference was made on another file: run the script again");
    assert!(reference.cases.len() >= 1000 && !reference.special_tokens.is_empty());
    let model = LoadedModel::load(file).unwrap();
    let mut literal = model.tokenizer.clone();
    literal.set_encode_special_tokens(true);
    let mut wrong = Vec::new();
    for case in &reference.cases {
        let ids = model.tokenizer.encode(case.text.as_str(), false).unwrap().get_ids().to_vec();
        let literal_ids = literal.encode(case.text.as_str(), false).unwrap().get_ids().to_vec();
        if ids != case.ids || literal_ids != case.literal_ids {
            wrong.push(format!(
                "{:?}: ours {ids:?} / {literal_ids:?}, llama.cpp {:?} / {:?}",
                case.text, case.ids, case.literal_ids
            ));
        }
    }
    assert!(wrong.is_empty(), "{} of {} strings differ:\n{}", wrong.len(), reference.cases.len(), wrong.join("\n"));
}

#[test]
fn smollm2_tokenizes_like_llamacpp() {
    let Some(file) = support::smollm2() else { return };
    assert_llamacpp_ids(&file, include_str!("data/llamacpp-tokens-smollm2.json"));
}

#[test]
fn qwen2_export_tokenizes_like_llamacpp() {
    assert_llamacpp_ids(&support::tiny_gguf(), include_str!("data/llamacpp-tokens-tiny.json"));
}
