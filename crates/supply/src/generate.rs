//! Generated checkpoints: deterministic random-weight Qwen2 models in the Hugging Face layout.
//!
//! No model hub is reachable from CI, yet every experiment needs a real checkpoint: real files,
//! a real tokenizer, real tensor shapes. So we make them: the same bytes on every machine and
//! every run (a counter-based generator seeded by tensor name, no floating-point reductions, no
//! hash-map order), pinned by digest like a downloaded model. Output text is noise; timings on
//! the `qwen2.5-0.5b` shape are representative because the shapes are the real ones.

use crate::digest::Algorithm;
use crate::pin::{ModelPin, ModelSource, PinnedFile};
use half::bf16;
use serde_json::{json, Value};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

/// Qwen2.5's chat template (the checkpoint's `tokenizer_config.json` carries it).
pub const QWEN25_CHAT_TEMPLATE: &str = include_str!("../assets/qwen2.5-chat-template.jinja");
/// Qwen2's pre-tokenizer split pattern: contractions, letter runs, single digits, punctuation
/// runs, newlines and spaces, as in the real tokenizer.json.
const QWEN_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CORPUS: &str = include_str!("../assets/tokenizer-corpus.txt");
/// Common English words, so that a realistic shape's tokenizer turns everyday English into about
/// as many tokens as a real one does, not only the corpus's sentences (and the words synthetic
/// prompts are made of).
pub const ENGLISH_WORDS: &str = include_str!("../assets/english-words.txt");
/// The BPE vocabulary the trainer aims for when a shape does not say; the small corpus stops it
/// earlier.
const BPE_VOCAB_TARGET: usize = 4096;
/// Qwen2.5's added tokens in id order from `<|endoftext|>`, each with whether it is special
/// (left out of decoded text). The real tokenizer marks the tool-call and fill-in-the-middle
/// tokens as not special, so they decode to their text.
pub const QWEN25_ADDED_TOKENS: [(&str, bool); 22] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
];
/// The chat template's additional special tokens (tokenizer_config.json), as the real file lists them.
const ADDITIONAL_SPECIAL: usize = 13;

/// The files of a generated checkpoint, in pin order.
pub const FILES: [&str; 5] =
    ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];

/// A generated checkpoint's shape: its architecture and how its weights are drawn.
#[derive(Debug, Clone)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub max_positions: usize,
    pub rope_theta: f64,
    /// Rows of the embedding (ids the model can emit); `None`: the tokenizer's ids rounded up
    /// to 64. Ids past the tokenizer's get filler tokens (see [`build_tokenizer`]).
    pub vocab_size: Option<usize>,
    /// Regular (byte-level BPE) tokens before the added ones: `None`, only those trained from
    /// the corpus; `Some(n)`, the trained ones and then filler words up to `n`, so that the added
    /// tokens start at id `n` as in the real tokenizer.
    pub regular_tokens: Option<usize>,
    /// How many of [`QWEN25_ADDED_TOKENS`] the tokenizer has (at least the first three, which
    /// the chat template and the stop ids use).
    pub added_tokens: usize,
    /// Whether the tokenizer also learns the bundled list of common English words.
    pub english_words: bool,
    /// Exact bytes to use for config.json and generation_config.json, when imitating a real model.
    pub config_bytes: Option<(&'static [u8], &'static [u8])>,
    /// Total safetensors file size to match (the header is padded with spaces to reach it).
    pub safetensors_size: Option<u64>,
    pub embed_std: f32,
    pub weight_std: f32,
    pub bias_std: f32,
}

/// The shapes this project can generate.
pub fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "tiny",
            hidden: 64,
            intermediate: 176,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            max_positions: 4096,
            rope_theta: 1_000_000.0,
            vocab_size: None,
            regular_tokens: None,
            added_tokens: 3,
            english_words: false,
            config_bytes: None,
            safetensors_size: None,
            // Large enough that greedy choices are decisive (top logits far apart compared with
            // float rounding), so every correct implementation picks the same ids.
            embed_std: 0.5,
            weight_std: 0.3,
            bias_std: 0.1,
        },
        Shape {
            name: "qwen2.5-0.5b",
            hidden: 896,
            intermediate: 4864,
            layers: 24,
            heads: 14,
            kv_heads: 2,
            max_positions: 32768,
            rope_theta: 1_000_000.0,
            vocab_size: Some(151_936),
            regular_tokens: Some(151_643),
            added_tokens: QWEN25_ADDED_TOKENS.len(),
            english_words: true,
            config_bytes: Some((
                include_bytes!("../assets/qwen2.5-0.5b/config.json"),
                include_bytes!("../assets/qwen2.5-0.5b/generation_config.json"),
            )),
            safetensors_size: Some(988_097_824),
            // Not the real model's 0.02: with it, random weights give near-tied top logits and
            // greedy ids that flip between correct implementations. These scales keep every
            // layer's contribution and the top logits' margins large; timings do not depend on
            // the values.
            embed_std: 0.5,
            weight_std: 0.06,
            bias_std: 0.06,
        },
    ]
}

pub fn shape(name: &str) -> Option<Shape> {
    shapes().into_iter().find(|s| s.name == name)
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("unknown shape `{0}`; known shapes: tiny, qwen2.5-0.5b")]
    UnknownShape(String),
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("shape `{shape}`: safetensors header needs {needed} bytes but the target size leaves {room}")]
    HeaderTooLarge { shape: String, needed: usize, room: usize },
    #[error("{0} already exists; remove it or pass --force to regenerate")]
    Exists(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> GenerateError + '_ {
    move |cause| GenerateError::Io { path: path.display().to_string(), cause }
}

/// Generates `shape` into `dest`, atomically: everything is written into a temporary sibling
/// folder that is renamed into place last, so an interrupted run leaves no half checkpoint.
/// An existing `dest` is replaced only with `force`.
pub fn generate_into(shape: &Shape, dest: &Path, force: bool) -> Result<(), GenerateError> {
    if dest.exists() && !force {
        return Err(GenerateError::Exists(dest.display().to_string()));
    }
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.partial-", shape.name))
        .tempdir_in(parent)
        .map_err(io_err(parent))?;
    write_files(shape, tmp.path())?;
    let tmp_path = tmp.keep();
    if dest.exists() {
        // Move the old copy aside first so that `dest` is never a mix of both.
        let old = parent.join(format!(".{}.old-{}", shape.name, std::process::id()));
        std::fs::rename(dest, &old).map_err(io_err(dest))?;
        std::fs::rename(&tmp_path, dest).map_err(io_err(dest))?;
        std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    } else {
        std::fs::rename(&tmp_path, dest).map_err(io_err(dest))?;
    }
    Ok(())
}

fn write_files(shape: &Shape, dir: &Path) -> Result<(), GenerateError> {
    let tokenizer = build_tokenizer(shape)?;
    let (config, generation) = match shape.config_bytes {
        Some((c, g)) => (c.to_vec(), g.to_vec()),
        None => config_files(shape, tokenizer.vocab_size, &tokenizer.specials),
    };
    let write = |name: &str, bytes: &[u8]| -> Result<(), GenerateError> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(io_err(&path))
    };
    write("config.json", &config)?;
    write("generation_config.json", &generation)?;
    write("tokenizer.json", tokenizer.json.as_bytes())?;
    write("tokenizer_config.json", tokenizer_config(shape, tokenizer.specials[0]).as_bytes())?;
    write_safetensors(shape, tokenizer.vocab_size, &dir.join("model.safetensors"))
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

fn pretty(value: &Value) -> String {
    let mut s = serde_json::to_string_pretty(value).expect("JSON values serialise");
    s.push('\n');
    s
}

/// config.json and generation_config.json for a shape that imitates no real file.
fn config_files(shape: &Shape, vocab_size: usize, specials: &[u32; 3]) -> (Vec<u8>, Vec<u8>) {
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": specials[0],
        "eos_token_id": specials[2],
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": shape.weight_std,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": shape.max_positions,
        "max_window_layers": shape.layers,
        "model_type": "qwen2",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_theta,
        "sliding_window": shape.max_positions,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": vocab_size
    });
    let generation = json!({
        "bos_token_id": specials[0],
        "pad_token_id": specials[0],
        "do_sample": false,
        "eos_token_id": [specials[2], specials[0]]
    });
    (pretty(&config).into_bytes(), pretty(&generation).into_bytes())
}

/// A generated tokenizer.json and where its ids fall.
#[derive(Debug, Clone)]
pub struct GeneratedTokenizer {
    pub json: String,
    /// Ids of `<|endoftext|>`, `<|im_start|>` and `<|im_end|>`.
    pub specials: [u32; 3],
    /// Ids covered: every one decodes to a token (the embedding's rows).
    pub vocab_size: usize,
}

/// Builds a shape's tokenizer: a byte-level BPE trained with the tokenizers crate on the bundled
/// corpus (and, for realistic shapes, a list of common English words), filler words up to the shape's regular token count, Qwen2.5's added tokens
/// right after them, and filler words for every id left up to the embedding's size.
///
/// The model emits any id below `vocab_size` (random weights favour none), so every id must
/// decode to text, or a server streams nothing. Fillers are words of the vocabulary that no
/// merge makes: text tokenizes exactly as with the trained merges alone (so prompts keep their
/// realistic lengths), and the model's ids decode to words. The same holds for the ids past the
/// added tokens, which stand for embedding rows the real tokenizer leaves unused. The one cost:
/// text the model wrote, sent back as a prompt, tokenizes into more (smaller) tokens than it was
/// made of.
pub fn build_tokenizer(shape: &Shape) -> Result<GeneratedTokenizer, GenerateError> {
    let tk_err = |e: tokenizers::Error| GenerateError::Tokenizer(e.to_string());
    let bad = |what: String| GenerateError::Tokenizer(format!("shape `{}`: {what}", shape.name));
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_normalizer(Some(NFC));
    let split =
        Split::new(SplitPattern::Regex(QWEN_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).map_err(tk_err)?;
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()])));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    tokenizer.with_post_processor(Some(ByteLevel::new(false, false, false)));
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(shape.regular_tokens.unwrap_or(BPE_VOCAB_TARGET))
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let words = if shape.english_words { ENGLISH_WORDS } else { "" };
    tokenizer.train(&mut trainer, CORPUS.lines().chain(words.lines())).map_err(tk_err)?;

    let mut value: Value = serde_json::from_str(&tokenizer.to_string(false).map_err(tk_err)?)
        .map_err(|e| GenerateError::Tokenizer(e.to_string()))?;
    let model = value["model"].as_object_mut().ok_or_else(|| bad("no BPE model".into()))?;
    let vocab = model.get_mut("vocab").and_then(Value::as_object_mut).ok_or_else(|| bad("no vocab".into()))?;
    let trained = vocab.len();
    let regular = shape.regular_tokens.unwrap_or(trained);
    if regular < trained {
        return Err(bad(format!("{regular} regular tokens leave no room for the {trained} trained ones")));
    }
    // Filler words are vocabulary without merges: no text encodes to them, so text tokenizes
    // exactly as with the trained merges, and the model's words decode as words.
    let mut fillers = filler_words();
    let mut next_filler = |vocab: &serde_json::Map<String, Value>| {
        fillers.find(|w| !vocab.contains_key(w)).ok_or_else(|| bad("ran out of filler words".into()))
    };
    while vocab.len() < regular {
        let word = next_filler(vocab)?;
        vocab.insert(word, json!(vocab.len()));
    }
    let added = &QWEN25_ADDED_TOKENS[..shape.added_tokens];
    let base = regular as u32;
    let mut added_tokens = Vec::new();
    for (id, (token, special)) in (base..).zip(added) {
        // In the model's vocabulary too, so the ids survive any loader's renumbering.
        vocab.insert(token.to_string(), json!(id));
        added_tokens.push(json!({
            "id": id, "content": token, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special
        }));
    }
    let covered = regular + added.len();
    let vocab_size = shape.vocab_size.unwrap_or_else(|| round_up(covered, 64));
    if vocab_size < covered {
        return Err(bad(format!("an embedding of {vocab_size} rows is smaller than the tokenizer's {covered} ids")));
    }
    for id in covered..vocab_size {
        let word = next_filler(vocab)?;
        vocab.insert(word, json!(id));
    }
    model.insert("ignore_merges".into(), json!(false));
    value["added_tokens"] = Value::Array(added_tokens);
    let text = pretty(&value);
    // Prove the file loads, maps the added tokens where we put them, and covers every id.
    let check = text.parse::<Tokenizer>().map_err(tk_err)?;
    for (id, (token, _)) in (base..).zip(added) {
        if check.token_to_id(token) != Some(id) {
            return Err(bad(format!("{token} did not land at id {id}")));
        }
    }
    if let Some(id) = (0..vocab_size as u32).find(|&id| check.id_to_token(id).is_none()) {
        return Err(bad(format!("id {id} has no token")));
    }
    Ok(GeneratedTokenizer { json: text, specials: [base, base + 1, base + 2], vocab_size })
}

/// Word-like filler tokens in the byte-level alphabet, in a fixed order: consonant-vowel
/// syllables, then words of two syllables, then three, ..., each first with a leading space
/// (`Ġ`, as most words of a real vocabulary have) and then without. Within a length the words
/// come in a fixed scrambled order (a multiplier prime to the count), so a cut-off length still
/// mixes all its syllables.
fn filler_words() -> impl Iterator<Item = String> {
    let syllables: Vec<String> =
        "bcdfghjklmnprstvwxyz".chars().flat_map(|c| "aeiou".chars().map(move |v| format!("{c}{v}"))).collect();
    (1u32..).flat_map(move |length| {
        let syllables = syllables.clone();
        let count = (syllables.len() as u64).pow(length);
        (0..count).flat_map(move |i| {
            let mut n = i.wrapping_mul(7919) % count;
            let mut word = String::new();
            for _ in 0..length {
                word.push_str(&syllables[(n % syllables.len() as u64) as usize]);
                n /= syllables.len() as u64;
            }
            [format!("Ġ{word}"), word]
        })
    })
}

fn tokenizer_config(shape: &Shape, base: u32) -> String {
    let added = &QWEN25_ADDED_TOKENS[..shape.added_tokens];
    let mut decoder = serde_json::Map::new();
    for (id, (token, special)) in (base..).zip(added) {
        decoder.insert(
            id.to_string(),
            json!({"content": token, "lstrip": false, "normalized": false, "rstrip": false,
                   "single_word": false, "special": special}),
        );
    }
    // The real file lists the special tokens after `<|endoftext|>` as additional ones.
    let additional: Vec<&str> =
        added.iter().skip(1).take(ADDITIONAL_SPECIAL).filter(|(_, special)| *special).map(|(t, _)| *t).collect();
    pretty(&json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": additional,
        "bos_token": null,
        "chat_template": QWEN25_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": shape.max_positions,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null
    }))
}

/// Tensor names and shapes of a Qwen2 checkpoint with tied embeddings, sorted by name (the
/// order of the header and of the data).
pub fn tensor_layout(shape: &Shape, vocab_size: usize) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (shape.hidden, shape.intermediate);
    let kv = shape.kv_heads * (h / shape.heads);
    let mut tensors = vec![
        ("model.embed_tokens.weight".to_string(), vec![vocab_size, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    for l in 0..shape.layers {
        let p = format!("model.layers.{l}");
        tensors.extend([
            (format!("{p}.input_layernorm.weight"), vec![h]),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
            (format!("{p}.post_attention_layernorm.weight"), vec![h]),
            (format!("{p}.self_attn.k_proj.bias"), vec![kv]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
            (format!("{p}.self_attn.o_proj.weight"), vec![h, h]),
            (format!("{p}.self_attn.q_proj.bias"), vec![h]),
            (format!("{p}.self_attn.q_proj.weight"), vec![h, h]),
            (format!("{p}.self_attn.v_proj.bias"), vec![kv]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
        ]);
    }
    tensors.sort();
    tensors
}

/// Writes BF16 weights as safetensors, streaming (the big shape is a gigabyte).
fn write_safetensors(shape: &Shape, vocab_size: usize, path: &Path) -> Result<(), GenerateError> {
    let tensors = tensor_layout(shape, vocab_size);
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, dims) in &tensors {
        let bytes = dims.iter().product::<usize>() * 2;
        header.insert(name.clone(), json!({"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + bytes]}));
        offset += bytes;
    }
    let mut header = serde_json::to_string(&Value::Object(header)).expect("JSON values serialise");
    let header_len = match shape.safetensors_size {
        Some(total) => {
            let room = (total as usize).saturating_sub(8 + offset);
            if header.len() > room {
                return Err(GenerateError::HeaderTooLarge { shape: shape.name.into(), needed: header.len(), room });
            }
            room
        }
        // Pad so the data starts 8-byte aligned, as the safetensors writers do.
        None => round_up(header.len(), 8),
    };
    header.extend(std::iter::repeat_n(' ', header_len - header.len()));

    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut write = |bytes: &[u8]| out.write_all(bytes).map_err(io_err(path));
    write(&(header.len() as u64).to_le_bytes())?;
    write(header.as_bytes())?;
    let mut buf = Vec::with_capacity(1 << 20);
    for (name, dims) in &tensors {
        let count: usize = dims.iter().product();
        let mut values = TensorValues::new(shape, name);
        let mut left = count;
        while left > 0 {
            let n = left.min(1 << 19);
            buf.clear();
            for _ in 0..n {
                buf.extend_from_slice(&values.next_bf16().to_le_bytes());
            }
            write(&buf)?;
            left -= n;
        }
    }
    let file =
        out.into_inner().map_err(|e| GenerateError::Io { path: path.display().to_string(), cause: e.into_error() })?;
    file.sync_all().map_err(io_err(path))
}

/// The values of one tensor: norm weights are exactly one; every other tensor is uniform noise
/// with the shape's standard deviation, from a SplitMix64 stream seeded by the tensor's name, so
/// each tensor's bytes depend on nothing but the shape and the name.
struct TensorValues {
    state: u64,
    /// Half-width of the uniform distribution: std * sqrt(3). Zero means constant one.
    scale: f32,
}

impl TensorValues {
    fn new(shape: &Shape, name: &str) -> Self {
        let std = if name.ends_with("norm.weight") {
            0.0
        } else if name.ends_with(".bias") {
            shape.bias_std
        } else if name.contains("embed_tokens") {
            shape.embed_std
        } else {
            shape.weight_std
        };
        // FNV-1a of "shape/name": a fixed, documented seed for every tensor.
        let mut seed = 0xcbf2_9ce4_8422_2325u64;
        for b in shape.name.bytes().chain(*b"/").chain(name.bytes()) {
            seed = (seed ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        TensorValues { state: seed, scale: std * 3f32.sqrt() }
    }

    fn next_bf16(&mut self) -> bf16 {
        if self.scale == 0.0 {
            return bf16::ONE;
        }
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 24 random bits -> [-1, 1): exact in f32, so the conversion is the same everywhere.
        let unit = (z >> 40) as f32 * (2.0 / (1u64 << 24) as f32) - 1.0;
        bf16::from_f32(unit * self.scale)
    }
}

/// Digests a generated checkpoint folder into a pin: SHA-256 for the weights (like the Hub's LFS
/// files), git blob SHA-1 for the rest; the revision is a content id over those digests.
pub fn pin_for(shape: &Shape, dir: &Path) -> Result<ModelPin, GenerateError> {
    let mut files = Vec::new();
    for name in FILES {
        let algorithm = if name.ends_with(".safetensors") { Algorithm::Sha256 } else { Algorithm::GitSha1 };
        let path = dir.join(name);
        let (size, digest) = crate::digest::file_digest(&path, algorithm).map_err(io_err(&path))?;
        files.push(PinnedFile { path: name.to_string(), size, algorithm, digest });
    }
    let listing: String = files.iter().map(|f| format!("{} {}\n", f.path, f.digest)).collect();
    Ok(ModelPin {
        name: shape.name.to_string(),
        repo: format!("generated/{}", shape.name),
        revision: crate::digest::bytes_digest(listing.as_bytes(), Algorithm::GitSha1),
        source: ModelSource::Generated { shape: shape.name.to_string() },
        files,
    })
}

/// Where a generated model lives by default.
pub fn default_dir(models_dir: &Path, name: &str) -> PathBuf {
    models_dir.join("generated").join(name)
}
