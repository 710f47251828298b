//! A GGUF file as a model: its metadata gives the configuration, the tokenizer ([`crate::vocab`])
//! and the chat template; its tensors are found under their Hugging Face names, so the forward in
//! [`crate::qwen`] loads them as it loads a safetensors checkpoint, dequantizing their rows from
//! the file's map as it lays them out ([`crate::weights`]).
//!
//! Two architectures: `qwen2` and `llama`. What differs is read from the file, not branched on
//! in the forward: Qwen2 has q/k/v biases and Llama has none (a bias is used when the file has
//! one), and GGUF stores a Llama's q and k rows in the order of llama.cpp's rotary embedding,
//! which pairs adjacent dimensions, where the forward rotates half against half
//! (read back by index: [`crate::weights::rotary_source`]). Weight types are the ones whose dequantization candle and llama.cpp share;
//! any other is refused by name.

use crate::weights::{Blocks, Matrix, Weights};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use candle_transformers::models::qwen2::Config;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The longest context a file may declare: 2M positions (a rotary table of a gigabyte at most).
const MAX_CONTEXT: usize = 1 << 21;

/// The architectures the forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Qwen2,
    Llama,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "qwen2",
            Architecture::Llama => "llama",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{file}: not a GGUF file this engine reads ({cause}); pass a .gguf model or a checkpoint folder")]
    Format { file: String, cause: String },
    #[error("{file}: architecture `{arch}` is not one this engine runs; it runs llama and qwen2")]
    Architecture { file: String, arch: String },
    #[error("{file}: metadata `{key}` {problem}")]
    Metadata { file: String, key: String, problem: String },
    #[error("{file}: tensor `{name}` is {ty:?}, a weight type this engine does not load; it loads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K")]
    Type { file: String, name: String, ty: GgmlDType },
    #[error("{file}: tensor `{name}` {problem}")]
    Tensor { file: String, name: String, problem: String },
    #[error("{file}: {cause}")]
    Vocab { file: String, cause: crate::vocab::VocabError },
}

/// Everything a GGUF file gives the loader.
pub(crate) struct GgufModel {
    pub(crate) arch: Architecture,
    pub(crate) config: Config,
    /// The tensors under their Hugging Face names, read from the file's map as the forward
    /// loads them.
    pub(crate) weights: GgufWeights,
    pub(crate) tokenizer: tokenizers::Tokenizer,
    pub(crate) template: Option<String>,
    pub(crate) stop_ids: Vec<u32>,
}

/// Metadata lookups that name the file and the key in their errors.
struct Meta<'a> {
    file: &'a str,
    md: &'a HashMap<String, Value>,
}

impl Meta<'_> {
    fn error(&self, key: &str, problem: impl Into<String>) -> GgufError {
        GgufError::Metadata { file: self.file.into(), key: key.into(), problem: problem.into() }
    }

    fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.md.get(key).ok_or_else(|| self.error(key, "is missing"))
    }

    fn count(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.get(key)?;
        let n = v.to_u64().ok().or_else(|| v.to_i32().ok().and_then(|n| u64::try_from(n).ok()));
        n.and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| self.error(key, format!("is {v:?}, not a positive count")))
    }

    fn optional_id(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(v) => v
                .to_u32()
                .or_else(|_| v.to_i32().map(|n| n as u32))
                .map(Some)
                .map_err(|_| self.error(key, format!("is {v:?}, not a token id"))),
        }
    }

    fn float(&self, key: &str, default: Option<f64>) -> Result<f64, GgufError> {
        match (self.md.get(key), default) {
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.error(key, "is missing")),
            (Some(v), _) => v
                .to_f32()
                .map(f64::from)
                .or_else(|_| v.to_f64())
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| self.error(key, format!("is {v:?}, not a positive number"))),
        }
    }

    fn text(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(v) => v.to_string().map(|s| Some(s.as_str())).map_err(|_| self.error(key, "is not a string")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let list = self.get(key)?.to_vec().map_err(|_| self.error(key, "is not an array"))?;
        list.iter()
            .map(|v| v.to_string().map(String::as_str).map_err(|_| self.error(key, "holds a non-string")))
            .collect()
    }

    fn ints(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let list = self.get(key)?.to_vec().map_err(|_| self.error(key, "is not an array"))?;
        list.iter().map(|v| v.to_i32().map_err(|_| self.error(key, "holds a non-integer"))).collect()
    }
}

/// Reads the GGUF file `path` (memory-mapped; verify it against its pin first).
pub(crate) fn read(path: &Path, shown: &str) -> Result<GgufModel, GgufError> {
    let format = |cause: String| GgufError::Format { file: shown.into(), cause };
    let file = std::fs::File::open(path).map_err(|e| format(e.to_string()))?;
    // Safety: mapped read-only; the pin check ran before, and a file changed under a running
    // experiment would invalidate its results anyway.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format(e.to_string()))?;
    let mut reader = std::io::Cursor::new(&map[..]);
    let content = Content::read(&mut reader).map_err(|e| format(e.to_string()))?;
    let meta = Meta { file: shown, md: &content.metadata };

    let arch_name =
        meta.text("general.architecture")?.ok_or_else(|| meta.error("general.architecture", "is missing"))?;
    let arch = match arch_name {
        "qwen2" => Architecture::Qwen2,
        "llama" => Architecture::Llama,
        other => return Err(GgufError::Architecture { file: shown.into(), arch: other.into() }),
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let tokens = meta.strings("tokenizer.ggml.tokens")?;
    let vocab_size = match content.metadata.get(&key("vocab_size")) {
        Some(_) => meta.count(&key("vocab_size"))?,
        None => tokens.len(),
    };
    let (hidden, heads) = (meta.count(&key("embedding_length"))?, meta.count(&key("attention.head_count"))?);
    let kv_heads = match content.metadata.get(&key("attention.head_count_kv")) {
        Some(_) => meta.count(&key("attention.head_count_kv"))?,
        None => heads,
    };
    if !hidden.is_multiple_of(heads) || !heads.is_multiple_of(kv_heads) || !(hidden / heads).is_multiple_of(2) {
        return Err(meta.error(
            &key("attention.head_count"),
            format!("{heads} heads and {kv_heads} KV heads do not divide a width of {hidden} into even head widths"),
        ));
    }
    if let Some(v) = content.metadata.get(&key("rope.dimension_count")) {
        if v.to_u64().ok() != Some((hidden / heads) as u64) {
            return Err(meta.error(
                &key("rope.dimension_count"),
                format!("is {v:?}; this engine rotates whole heads of {} dimensions", hidden / heads),
            ));
        }
    }
    let layers = meta.count(&key("block_count"))?;
    let context = meta.count(&key("context_length"))?;
    // The forward tabulates its rotary embedding for every position of the context.
    if context > MAX_CONTEXT {
        return Err(meta.error(
            &key("context_length"),
            format!("is {context}; this engine holds at most {MAX_CONTEXT} positions"),
        ));
    }
    if tokens.len() > vocab_size {
        return Err(meta.error(
            "tokenizer.ggml.tokens",
            format!("holds {} tokens, more than the model's vocabulary of {vocab_size}", tokens.len()),
        ));
    }
    let config = Config {
        vocab_size,
        hidden_size: hidden,
        intermediate_size: meta.count(&key("feed_forward_length"))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        max_position_embeddings: context,
        sliding_window: context,
        max_window_layers: layers,
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        rope_theta: meta.float(&key("rope.freq_base"), Some(10_000.0))?,
        rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"), None)?,
        use_sliding_window: false,
        hidden_act: candle_nn::Activation::Silu,
    };

    let types = meta.ints("tokenizer.ggml.token_type")?;
    let started = std::time::Instant::now();
    let tokenizer = crate::vocab::from_gguf(&crate::vocab::GgufVocab {
        model: meta.text("tokenizer.ggml.model")?.unwrap_or_default(),
        pre: meta.text("tokenizer.ggml.pre")?.unwrap_or("default"),
        tokens: &tokens,
        types: &types,
        merges: &meta.strings("tokenizer.ggml.merges")?,
        bos: meta.optional_id("tokenizer.ggml.bos_token_id")?,
        add_bos: match content.metadata.get("tokenizer.ggml.add_bos_token") {
            Some(v) => v.to_bool().map_err(|_| meta.error("tokenizer.ggml.add_bos_token", "is not a boolean"))?,
            // llama.cpp's default for its BPE vocabularies: only Llama 3's pre-tokenizer adds one.
            None => meta.text("tokenizer.ggml.pre")? == Some("llama-bpe"),
        },
    })
    .map_err(|cause| GgufError::Vocab { file: shown.into(), cause })?;
    let stop_ids = stop_ids(&meta, &tokens, &types)?;
    tracing::debug!(ms = started.elapsed().as_secs_f64() * 1e3, "gguf: tokenizer built");
    let started = std::time::Instant::now();

    let required = ["token_embd.weight".to_string(), "output_norm.weight".to_string()].into_iter().chain(
        (0..layers).flat_map(|i| {
            ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
                .map(|part| format!("blk.{i}.{part}.weight"))
        }),
    );
    for name in required {
        if !content.tensor_infos.contains_key(&name) {
            return Err(GgufError::Tensor {
                file: shown.into(),
                name,
                problem: format!("is missing; a {arch_name} model of {layers} blocks needs it"),
            });
        }
    }
    let map = Arc::new(map);
    let head_dim = hidden / heads;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    // Sorted, so a file with several faults is always refused for the same one.
    names.sort();
    let mut tensors = HashMap::with_capacity(names.len());
    for name in names {
        let info = &content.tensor_infos[name];
        let problem = |problem: String| GgufError::Tensor { file: shown.into(), name: name.clone(), problem };
        if !crate::weights::loads(info.ggml_dtype) {
            return Err(GgufError::Type { file: shown.into(), name: name.clone(), ty: info.ggml_dtype });
        }
        // Rotary tables some converters store are recomputed by the forward.
        if name.as_str() == "rope_freqs.weight" {
            continue;
        }
        let hf = supply::gguf::hf_name(name)
            .ok_or_else(|| problem(format!("is not a {arch_name} weight this engine knows")))?;
        let rotary = matches!((arch, name.rsplit('.').nth(1)), (Architecture::Llama, Some("attn_q" | "attn_k")));
        let start = content
            .tensor_data_offset
            .checked_add(info.offset)
            .ok_or_else(|| problem("lies past the end of the file".into()))?;
        let blocks = Blocks::new(map.clone(), start, info.ggml_dtype, info.shape.dims(), rotary.then_some(head_dim))
            .map_err(problem)?;
        tensors.insert(hf, (name.clone(), Matrix::Gguf(blocks)));
    }
    tracing::debug!(ms = started.elapsed().as_secs_f64() * 1e3, tensors = tensors.len(), "gguf: tensors found");
    let weights = GgufWeights { tensors };
    let template = meta.text("tokenizer.chat_template")?.map(str::to_string);
    Ok(GgufModel { arch, config, weights, tokenizer, template, stop_ids })
}

/// The ids that end a generation, as llama.cpp finds them: the end-of-sequence and end-of-turn
/// ids the file names, and the control tokens that are ends of turns by their text.
fn stop_ids(meta: &Meta<'_>, tokens: &[&str], types: &[i32]) -> Result<Vec<u32>, GgufError> {
    const ENDS: [&str; 6] = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>"];
    let mut ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = meta.optional_id(key)? {
            if id as usize >= tokens.len() {
                return Err(meta.error(key, format!("is {id}, past the {} tokens", tokens.len())));
            }
            ids.push(id);
        }
    }
    for (id, (text, ty)) in tokens.iter().zip(types).enumerate() {
        if *ty == crate::vocab::CONTROL && ENDS.contains(text) {
            ids.push(id as u32);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// A file's tensors by their Hugging Face names (each with its name in the file, for errors,
/// which the loader prefixes with the file's).
pub(crate) struct GgufWeights {
    tensors: HashMap<String, (String, Matrix)>,
}

impl GgufWeights {
    fn get(&self, name: &str, rows: usize, cols: usize) -> candle_core::Result<&Matrix> {
        let Some((stored, m)) = self.tensors.get(name) else { candle_core::bail!("no tensor for `{name}`") };
        if m.dims() != (rows, cols) {
            let (r, c) = m.dims();
            candle_core::bail!("tensor `{stored}` is {r} × {c}, expected {rows} × {cols}")
        }
        Ok(m)
    }
}

impl Weights for GgufWeights {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> candle_core::Result<Matrix> {
        self.get(name, rows, cols).cloned()
    }

    fn vector(&self, name: &str, len: usize) -> candle_core::Result<Tensor> {
        Tensor::from_vec(self.get(name, 1, len)?.to_vec(), len, &Device::Cpu)
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}
