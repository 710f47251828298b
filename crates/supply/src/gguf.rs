//! Export of a Qwen2 checkpoint folder to GGUF (F32, F16, Q8_0, Q4_0 or Q4_1), so that the identical weights
//! run in llama.cpp and Ollama and engines can be compared on the same numbers.
//!
//! Names and metadata follow llama.cpp's `qwen2` architecture. Norms and biases stay F32 (as
//! llama.cpp's converter keeps them); every matrix takes the export's type (the embedding and
//! head too, as llama-quantize's `--pure` writes them; candle's quantizers are ggml's reference
//! ones), and a matrix whose rows do not split into 32-value blocks falls back to F16. The tokenizer goes in as llama.cpp's `gpt2` BPE with
//! Qwen2's pre-tokenizer name, with unused placeholder tokens filling any id gap so that the token
//! list has exactly `vocab_size` entries.

use crate::config::parse_config;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// The weight types an export can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightType {
    F32,
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
}

impl WeightType {
    /// llama.cpp's `general.file_type` code.
    fn file_type(self) -> u32 {
        match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q8_0 => 7,
            WeightType::Q4_0 => 2,
            WeightType::Q4_1 => 3,
        }
    }

    /// The type of every matrix whose rows split into whole blocks (others are kept at F16).
    fn matrix_type(self) -> GgmlDType {
        match self {
            WeightType::F32 => GgmlDType::F32,
            WeightType::F16 => GgmlDType::F16,
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q4_0 => GgmlDType::Q4_0,
            WeightType::Q4_1 => GgmlDType::Q4_1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{file}: {cause}")]
    Read { file: String, cause: String },
    #[error("tensor `{name}`: {cause}")]
    Tensor { name: String, cause: String },
    #[error("tensor `{0}` has no GGUF name: not a Qwen2 weight this exporter knows")]
    UnknownTensor(String),
    #[error("{path}: cannot write: {cause}")]
    Write { path: String, cause: String },
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub tensors: usize,
    /// Matrices kept at F16 in a quantized export (rows not a multiple of 32).
    pub fallbacks: Vec<String>,
}

/// Hugging Face tensor names and their GGUF names: whole names first, then a layer's parts
/// (`model.layers.N.<hf>` is `blk.N.<gguf>`). One table for both directions, so an export and a
/// load cannot disagree.
const WHOLE: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];
const LAYER_PARTS: [(&str, &str); 12] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// `name` translated through the table, `from` being the side it is written in (0: Hugging
/// Face, 1: GGUF).
fn translate(name: &str, from: usize) -> Option<String> {
    let side = |pair: &(&'static str, &'static str)| if from == 0 { (pair.0, pair.1) } else { (pair.1, pair.0) };
    if let Some((_, to)) = WHOLE.iter().map(side).find(|(f, _)| *f == name) {
        return Some(to.to_string());
    }
    let (prefix, to_prefix) = if from == 0 { ("model.layers.", "blk.") } else { ("blk.", "model.layers.") };
    let (layer, part) = name.strip_prefix(prefix)?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, to) = LAYER_PARTS.iter().map(side).find(|(f, _)| *f == part)?;
    Some(format!("{to_prefix}{layer}.{to}"))
}

/// The GGUF name of a Hugging Face Qwen2 (or Llama) tensor.
pub fn gguf_name(hf: &str) -> Option<String> {
    translate(hf, 0)
}

/// The Hugging Face name of a GGUF tensor ([`gguf_name`] backwards).
pub fn hf_name(gguf: &str) -> Option<String> {
    translate(gguf, 1)
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, GgufError> {
    std::fs::read(dir.join(name)).map_err(|e| GgufError::Read { file: name.into(), cause: e.to_string() })
}

fn json(dir: &Path, name: &str) -> Result<serde_json::Value, GgufError> {
    serde_json::from_slice(&read(dir, name)?).map_err(|e| GgufError::Read { file: name.into(), cause: e.to_string() })
}

/// Exports the checkpoint in `dir` to `out` (written atomically, never over an existing file).
pub fn export(dir: &Path, out: &Path, ty: WeightType) -> Result<Exported, GgufError> {
    let config_bytes = read(dir, "config.json")?;
    let config = parse_config(&config_bytes)
        .map_err(|e| GgufError::Read { file: "config.json".into(), cause: e.to_string() })?;
    let raw_config: serde_json::Value = serde_json::from_slice(&config_bytes)
        .map_err(|e| GgufError::Read { file: "config.json".into(), cause: e.to_string() })?;
    let tokenizer = json(dir, "tokenizer.json")?;
    let tokenizer_config = json(dir, "tokenizer_config.json")?;

    // Tokens by id, gaps filled with unused placeholders, specials marked as control tokens.
    let mut by_id: BTreeMap<u64, (String, i32)> = BTreeMap::new();
    if let Some(vocab) = tokenizer.pointer("/model/vocab").and_then(|v| v.as_object()) {
        for (token, id) in vocab {
            if let Some(id) = id.as_u64() {
                by_id.insert(id, (token.clone(), 1));
            }
        }
    }
    for added in tokenizer.get("added_tokens").and_then(|a| a.as_array()).into_iter().flatten() {
        if let (Some(id), Some(content)) =
            (added.get("id").and_then(|v| v.as_u64()), added.get("content").and_then(|v| v.as_str()))
        {
            let kind = if added.get("special").and_then(|v| v.as_bool()) == Some(true) { 3 } else { 4 };
            by_id.insert(id, (content.to_string(), kind));
        }
    }
    let vocab_size = config.vocab_size.max(by_id.keys().next_back().map(|k| *k as usize + 1).unwrap_or(0));
    let (tokens, types): (Vec<gguf_file::Value>, Vec<gguf_file::Value>) = (0..vocab_size as u64)
        .map(|id| {
            let (token, kind) = by_id.get(&id).cloned().unwrap_or_else(|| (format!("[PAD{id}]"), 5));
            (gguf_file::Value::String(token), gguf_file::Value::I32(kind))
        })
        .unzip();
    let merges: Vec<gguf_file::Value> = tokenizer
        .pointer("/model/merges")
        .and_then(|m| m.as_array())
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(pair) => {
                Some(pair.iter().filter_map(|p| p.as_str()).collect::<Vec<_>>().join(" "))
            }
            _ => None,
        })
        .map(gguf_file::Value::String)
        .collect();
    let token_id = |key: &str| -> Option<gguf_file::Value> {
        let v = raw_config.get(key)?;
        v.as_u64().or_else(|| v.as_array()?.first()?.as_u64()).map(|id| gguf_file::Value::U32(id as u32))
    };

    use gguf_file::Value as V;
    let mut metadata: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String("qwen2".into())),
        (
            "general.name".into(),
            V::String(dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        ),
        ("general.file_type".into(), V::U32(ty.file_type())),
        ("qwen2.context_length".into(), V::U32(config.max_position_embeddings as u32)),
        ("qwen2.embedding_length".into(), V::U32(config.hidden_size as u32)),
        ("qwen2.block_count".into(), V::U32(config.num_hidden_layers as u32)),
        ("qwen2.feed_forward_length".into(), V::U32(config.intermediate_size as u32)),
        ("qwen2.attention.head_count".into(), V::U32(config.num_attention_heads as u32)),
        ("qwen2.attention.head_count_kv".into(), V::U32(config.num_key_value_heads as u32)),
        ("qwen2.rope.freq_base".into(), V::F32(config.rope_theta as f32)),
        ("qwen2.attention.layer_norm_rms_epsilon".into(), V::F32(config.rms_norm_eps as f32)),
        ("tokenizer.ggml.model".into(), V::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), V::String("qwen2".into())),
        ("tokenizer.ggml.tokens".into(), V::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), V::Array(types)),
        ("tokenizer.ggml.merges".into(), V::Array(merges)),
    ];
    for (key, field) in
        [("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")]
    {
        if let Some(v) = token_id(field) {
            metadata.push((key.into(), v));
        }
    }
    if let Some(template) = tokenizer_config.get("chat_template").and_then(|t| t.as_str()) {
        metadata.push(("tokenizer.chat_template".into(), V::String(template.to_string())));
    }

    let weights = dir.join("model.safetensors");
    let source = candle_core::safetensors::load(&weights, &Device::Cpu)
        .map_err(|e| GgufError::Read { file: "model.safetensors".into(), cause: e.to_string() })?;
    let mut names: Vec<&String> = source.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut fallbacks = Vec::new();
    for hf in names {
        let name = gguf_name(hf).ok_or_else(|| GgufError::UnknownTensor(hf.clone()))?;
        let tensor_err = |e: candle_core::Error| GgufError::Tensor { name: hf.clone(), cause: e.to_string() };
        let t: Tensor = source[hf].to_dtype(DType::F32).map_err(tensor_err)?;
        let matrix = t.rank() == 2;
        let dtype = match ty.matrix_type() {
            _ if !matrix => GgmlDType::F32,
            d if t.dims()[1].is_multiple_of(d.block_size()) => d,
            _ => {
                fallbacks.push(name.clone());
                GgmlDType::F16
            }
        };
        tensors.push((name, QTensor::quantize(&t, dtype).map_err(tensor_err)?));
    }

    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let write_err = |cause: String| GgufError::Write { path: out.display().to_string(), cause };
    if out.exists() {
        return Err(write_err("it already exists; pick another path".into()));
    }
    let mut tmp =
        tempfile::Builder::new().prefix(".partial-").tempfile_in(parent).map_err(|e| write_err(e.to_string()))?;
    {
        let meta_refs: Vec<(&str, &V)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut writer = std::io::BufWriter::new(tmp.as_file_mut());
        gguf_file::write(&mut writer, &meta_refs, &tensor_refs).map_err(|e| write_err(e.to_string()))?;
        std::io::Write::flush(&mut writer).map_err(|e| write_err(e.to_string()))?;
    }
    tmp.as_file().sync_all().map_err(|e| write_err(e.to_string()))?;
    tmp.persist_noclobber(out).map_err(|e| write_err(e.error.to_string()))?;
    Ok(Exported { tensors: tensors.len(), fallbacks })
}
