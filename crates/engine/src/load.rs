//! Loading a model for inference with candle on the CPU: F32 by default, optionally with
//! half-precision weight matrices (see [`WeightDtype`]). A model is a Hugging Face Qwen2
//! checkpoint folder or a GGUF file (Qwen2 or Llama; [`crate::gguf`]), or a folder holding one.
//!
//! Everything a run needs comes from the model's own files: in a folder, the architecture from
//! config.json, the stop tokens from generation_config.json, the prompt format from the
//! tokenizer_config.json chat template, the ids from tokenizer.json; in a GGUF file, all of it
//! from the file's metadata. Each failure is an error that names the file, never a panic.

pub use crate::gguf::{Architecture, GgufError};
use crate::qwen::{Qwen2, WeightDtype};
use crate::template::{ChatTemplate, Message, TemplateError};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen2::Config;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use supply::config::{parse_config, stop_token_ids, ConfigError};
use tokenizers::Tokenizer;

/// The dtype the weights are read in and activations computed in: F32 is what the transformers
/// reference uses, so greedy ids are comparable.
pub(crate) const DTYPE: DType = DType::F32;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: missing; a Qwen2 checkpoint folder needs it")]
    Missing { path: String },
    #[error("{path}: cannot read: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tokenizer.json does not parse: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("model.safetensors: {0}; the weights are truncated, corrupt or not a Qwen2 checkpoint of this config")]
    Weights(String),
    #[error("prompt does not tokenize: {0}")]
    Encode(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{file}: {cause}; the weights do not fit the file's own configuration")]
    GgufWeights { file: String, cause: String },
    #[error("{file}: no tokenizer.chat_template; this engine renders prompts with the model's own template")]
    NoTemplate { file: String },
    #[error(
        "{dir}: a checkpoint folder has no block types to run natively; pass --dtype f32, f16 or bf16, or a .gguf file"
    )]
    NativeCheckpoint { dir: String },
    #[error("{dir}: holds {count} .gguf files and no config.json; pass the one to run")]
    Ambiguous { dir: String, count: usize },
}

/// A loaded checkpoint. Sessions share `model` (the weights) and own their KV caches.
pub struct LoadedModel {
    /// The checkpoint folder or the GGUF file.
    pub dir: PathBuf,
    /// What the weights came in: a GGUF file or a safetensors checkpoint.
    pub format: Format,
    pub architecture: Architecture,
    pub config: Config,
    pub model: Arc<Qwen2>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub stop_ids: Vec<u32>,
    pub device: Device,
    /// The tokenizer with special tokens read as plain text, for message contents that spell
    /// one; made the first time one does.
    literal: std::sync::OnceLock<Tokenizer>,
}

/// The file format a model was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Gguf,
}

/// The GGUF file `path` names: itself when it is a file, or the one `.gguf` file of a folder
/// without a config.json.
fn gguf_file(path: &Path) -> Result<Option<PathBuf>, LoadError> {
    if path.is_file() {
        return Ok(Some(path.to_path_buf()));
    }
    if path.join("config.json").exists() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|cause| LoadError::Io { path: path.display().to_string(), cause })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf") && p.is_file())
        .collect();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        count => Err(LoadError::Ambiguous { dir: path.display().to_string(), count }),
    }
}

/// GPT-2's byte-level alphabet backwards: the character each byte is written as in a
/// byte-level vocabulary, to its byte (printable Latin-1 bytes stand for themselves, the other
/// 68 for the characters from U+0100 on, in byte order).
fn byte_level_table() -> &'static std::collections::HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0x100u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    next += 1;
                    char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
                };
                (c, b)
            })
            .collect()
    })
}

/// Two private-use characters that no message holds, to mark where each content is rendered.
fn markers(messages: &[Message<'_>]) -> (char, char) {
    let free = |c: &char| !messages.iter().any(|m| m.content.contains(*c));
    // The private-use area has 6,400 characters; a conversation that holds all of them is
    // marked with the first two anyway, and `unmark` then finds them unbalanced and refuses.
    let mut candidates = ('\u{E000}'..='\u{F8FF}').filter(free);
    let open = candidates.next().unwrap_or('\u{E000}');
    let close = candidates.next().unwrap_or('\u{E001}');
    (open, close)
}

/// The rendered text without its markers, and the byte ranges the marked contents take in it;
/// `None` when the markers do not pair up (the template cut or reordered a content).
fn unmark(rendered: &str, open: char, close: char) -> Option<(String, Vec<(usize, usize)>)> {
    let mut text = String::with_capacity(rendered.len());
    let mut contents = Vec::new();
    let mut start = None;
    for c in rendered.chars() {
        match (c, start) {
            (c, None) if c == open => start = Some(text.len()),
            (c, Some(s)) if c == close => {
                contents.push((s, text.len()));
                start = None;
            }
            (c, _) if c == open || c == close => return None,
            (c, _) => text.push(c),
        }
    }
    start.is_none().then_some((text, contents))
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, LoadError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|cause| {
        if cause.kind() == std::io::ErrorKind::NotFound {
            LoadError::Missing { path: name.to_string() }
        } else {
            LoadError::Io { path: name.to_string(), cause }
        }
    })
}

impl LoadedModel {
    /// Loads the checkpoint in `dir` in F32. Verify it against its pin first (see
    /// [`supply::resolve`]).
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        Self::load_as(dir, WeightDtype::F32)
    }

    /// Loads the model at `path` (a checkpoint folder, a GGUF file or a folder holding one) with
    /// its weight matrices stored in `dtype`.
    pub fn load_as(path: &Path, dtype: WeightDtype) -> Result<Self, LoadError> {
        match gguf_file(path)? {
            Some(file) => Self::load_gguf(path, &file, dtype),
            None => Self::load_checkpoint(path, dtype),
        }
    }

    fn load_gguf(path: &Path, file: &Path, dtype: WeightDtype) -> Result<Self, LoadError> {
        let shown = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let gguf = crate::gguf::read(file, &shown)?;
        let template = ChatTemplate::new(gguf.template.ok_or(LoadError::NoTemplate { file: shown.clone() })?)?;
        let device = Device::Cpu;
        let started = std::time::Instant::now();
        let model = Qwen2::load_from(&gguf.config, &gguf.weights, dtype)
            .map_err(|e| LoadError::GgufWeights { file: shown.clone(), cause: e.to_string() })?;
        tracing::debug!(ms = started.elapsed().as_secs_f64() * 1e3, "gguf: weights laid out");
        Ok(LoadedModel {
            dir: path.to_path_buf(),
            format: Format::Gguf,
            architecture: gguf.arch,
            config: gguf.config,
            model: Arc::new(model),
            tokenizer: gguf.tokenizer,
            template,
            stop_ids: gguf.stop_ids,
            device,
            literal: std::sync::OnceLock::new(),
        })
    }

    fn load_checkpoint(dir: &Path, dtype: WeightDtype) -> Result<Self, LoadError> {
        if dtype == WeightDtype::Native {
            return Err(LoadError::NativeCheckpoint { dir: dir.display().to_string() });
        }
        let config_bytes = read(dir, "config.json")?;
        let config = parse_config(&config_bytes)?;
        let generation = match read(dir, "generation_config.json") {
            Ok(b) => Some(b),
            Err(LoadError::Missing { .. }) => None,
            Err(e) => return Err(e),
        };
        let stop_ids = stop_token_ids(generation.as_deref(), &config_bytes)?;
        let tokenizer =
            Tokenizer::from_bytes(read(dir, "tokenizer.json")?).map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        let template = ChatTemplate::from_tokenizer_config(&read(dir, "tokenizer_config.json")?)?;
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(LoadError::Missing { path: "model.safetensors".into() });
        }
        let device = Device::Cpu;
        // Safety: the file is mapped read-only; the pin check ran before, and a file changed
        // under a running experiment would invalidate its results anyway.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DTYPE, &device) }
            .map_err(|e| LoadError::Weights(e.to_string()))?;
        let model = Arc::new(Qwen2::load_from(&config, &vb, dtype).map_err(|e| LoadError::Weights(e.to_string()))?);
        Ok(LoadedModel {
            dir: dir.to_path_buf(),
            format: Format::Safetensors,
            architecture: Architecture::Qwen2,
            config,
            model,
            tokenizer,
            template,
            stop_ids,
            device,
            literal: std::sync::OnceLock::new(),
        })
    }

    /// The chat-templated prompt for one user message and its token ids ([`Self::encode_chat`]).
    pub fn encode_user_prompt(&self, prompt: &str) -> Result<(String, Vec<u32>), LoadError> {
        self.encode_chat(&[Message { role: "user", content: prompt }], true)
    }

    /// A conversation rendered through the checkpoint's chat template, and its token ids, with
    /// special tokens (`<|im_end|>`, `<|im_start|>`) encoded only where the template put them:
    /// a message that spells one is tokenized as the text it is, so a client cannot close its
    /// turn and open another (a system turn, say) by typing the control token.
    ///
    /// Each message's content is rendered between two marker characters that no content holds,
    /// so the content's place in the rendered text is known whatever the template writes around
    /// it. The text without markers is tokenized whole, as before; only when a special token
    /// falls inside a content's place is it tokenized again in pieces: split at the template's
    /// own special tokens, each piece with special tokens read as text. The tokenizer splits at
    /// special tokens before anything else, so for any other content the ids are exactly the
    /// whole text's.
    pub fn encode_chat(
        &self,
        messages: &[Message<'_>],
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), LoadError> {
        let (open, close) = markers(messages);
        let wrapped: Vec<String> = messages.iter().map(|m| format!("{open}{}{close}", m.content)).collect();
        let marked: Vec<Message> =
            messages.iter().zip(&wrapped).map(|(m, content)| Message { role: m.role, content }).collect();
        let rendered = self.template.render(&marked, add_generation_prompt)?;
        let (text, contents) = unmark(&rendered, open, close).ok_or_else(|| {
            LoadError::Encode(
                "the chat template changed its messages' text; this engine cannot tell them apart from the template's"
                    .into(),
            )
        })?;
        let encode =
            |tokenizer: &Tokenizer, s: &str| tokenizer.encode(s, false).map_err(|e| LoadError::Encode(e.to_string()));
        let whole = encode(&self.tokenizer, &text)?;
        let specials: std::collections::HashSet<u32> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let special = |id: u32| specials.contains(&id);
        let inside = |(start, end): (usize, usize)| contents.iter().any(|&(a, b)| start < b && a < end);
        let spelled = whole.get_ids().iter().zip(whole.get_offsets()).any(|(&id, &at)| special(id) && inside(at));
        if !spelled {
            return Ok((text, whole.get_ids().to_vec()));
        }
        let literal = self.literal();
        let mut ids = Vec::with_capacity(whole.len());
        let mut from = 0;
        let template_specials =
            whole.get_ids().iter().zip(whole.get_offsets()).filter(|(&id, &at)| special(id) && !inside(at));
        for (&id, &(start, end)) in template_specials {
            if from < start {
                ids.extend_from_slice(encode(literal, &text[from..start])?.get_ids());
            }
            ids.push(id);
            from = end;
        }
        if from < text.len() {
            ids.extend_from_slice(encode(literal, &text[from..])?.get_ids());
        }
        Ok((text, ids))
    }

    /// The tokenizer with special tokens read as plain text.
    fn literal(&self) -> &Tokenizer {
        self.literal.get_or_init(|| {
            let mut t = self.tokenizer.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// `text`'s ids as llama-server's `/tokenize` gives them: with the model's BOS when
    /// `add_special` (where the model adds one), special tokens split out when `parse_special`
    /// and read as text otherwise.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, LoadError> {
        let tokenizer = if parse_special { &self.tokenizer } else { self.literal() };
        let encoding = tokenizer.encode(text, add_special).map_err(|e| LoadError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The bytes token `id` stands for (`None` past the vocabulary): a special token's text, or
    /// a byte-level token's bytes, which need not be UTF-8 on their own.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        if let Some(added) = self.tokenizer.get_added_tokens_decoder().get(&id) {
            return Some(added.content.as_bytes().to_vec());
        }
        let token = self.tokenizer.id_to_token(id)?;
        let table = byte_level_table();
        let mut bytes = Vec::with_capacity(token.len());
        for c in token.chars() {
            match table.get(&c) {
                Some(&b) => bytes.push(b),
                // Not a byte-level vocabulary: the token's own text.
                None => return Some(token.into_bytes()),
            }
        }
        Some(bytes)
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }
}
