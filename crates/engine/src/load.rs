//! Loading a Hugging Face Qwen2 checkpoint folder for inference with candle on the CPU: F32 by
//! default, optionally with half-precision weight matrices (see [`WeightDtype`]).
//!
//! Everything a run needs comes from the checkpoint's own files: the architecture from
//! config.json, the stop tokens from generation_config.json, the prompt format from the
//! tokenizer_config.json chat template, the ids from tokenizer.json. Each failure is an error that
//! names the file, never a panic.

use crate::qwen::{Qwen2, WeightDtype};
use crate::template::{ChatTemplate, TemplateError};
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
}

/// A loaded checkpoint. Sessions share `model` (the weights) and own their KV caches.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub config: Config,
    pub model: Arc<Qwen2>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub stop_ids: Vec<u32>,
    pub device: Device,
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

    /// Loads the checkpoint in `dir` with its weight matrices stored in `dtype`.
    pub fn load_as(dir: &Path, dtype: WeightDtype) -> Result<Self, LoadError> {
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
        let model = Arc::new(Qwen2::load(&config, vb, dtype).map_err(|e| LoadError::Weights(e.to_string()))?);
        Ok(LoadedModel { dir: dir.to_path_buf(), config, model, tokenizer, template, stop_ids, device })
    }

    /// The chat-templated prompt for one user message and its token ids.
    pub fn encode_user_prompt(&self, prompt: &str) -> Result<(String, Vec<u32>), LoadError> {
        let text = self.template.render_user(prompt)?;
        let enc = self.tokenizer.encode(text.as_str(), false).map_err(|e| LoadError::Encode(e.to_string()))?;
        Ok((text, enc.get_ids().to_vec()))
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }
}
