//! Reading a Hugging Face Qwen2 `config.json` and `generation_config.json`.
//!
//! transformers has written these in two layouts: the classic one (`rope_theta` at the top,
//! `sliding_window` a number) and the transformers 5 one (`rope_parameters.rope_theta`,
//! `sliding_window: null`, `layer_types`). We accept both and hand candle one normalised config.

use candle_nn::Activation;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    max_position_embeddings: usize,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    max_window_layers: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_parameters: Option<RopeParameters>,
    rms_norm_eps: f64,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    head_dim: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
struct RopeParameters {
    rope_theta: f64,
    #[serde(default)]
    rope_type: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json: {0}; the file must be a Hugging Face Qwen2 config")]
    Parse(serde_json::Error),
    #[error("config.json: {0}")]
    Unsupported(String),
    #[error("generation_config.json: {0}")]
    Generation(String),
}

/// The transformers default for Qwen2 when a config names no rope base.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// Parses config.json bytes into candle's Qwen2 config.
pub fn parse_config(bytes: &[u8]) -> Result<candle_transformers::models::qwen2::Config, ConfigError> {
    let raw: RawConfig = serde_json::from_slice(bytes).map_err(ConfigError::Parse)?;
    let rope_theta = match (&raw.rope_parameters, raw.rope_theta) {
        (Some(p), _) => {
            if let Some(t) = p.rope_type.as_deref().filter(|t| *t != "default") {
                return Err(ConfigError::Unsupported(format!(
                    "rope_parameters.rope_type `{t}` is not supported (only `default`)"
                )));
            }
            p.rope_theta
        }
        (None, Some(t)) => t,
        (None, None) => DEFAULT_ROPE_THETA,
    };
    let heads = raw.num_attention_heads;
    if heads == 0 || !raw.hidden_size.is_multiple_of(heads) {
        return Err(ConfigError::Unsupported(format!(
            "hidden_size {} is not a multiple of num_attention_heads {heads}",
            raw.hidden_size
        )));
    }
    if let Some(hd) = raw.head_dim.filter(|hd| *hd != raw.hidden_size / heads) {
        return Err(ConfigError::Unsupported(format!(
            "head_dim {hd} differs from hidden_size / num_attention_heads, which this loader assumes"
        )));
    }
    let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(ConfigError::Unsupported(format!(
            "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )));
    }
    let hidden_act = match raw.hidden_act.as_deref().unwrap_or("silu") {
        "silu" | "swish" => Activation::Silu,
        "gelu" => Activation::NewGelu,
        other => return Err(ConfigError::Unsupported(format!("hidden_act `{other}` is not supported (use silu)"))),
    };
    // A window only matters when it is switched on for some layer; candle applies one window to
    // all layers, so a per-layer mix is refused rather than run wrongly.
    let windowed = raw.use_sliding_window.unwrap_or(false)
        || raw.layer_types.as_ref().is_some_and(|t| t.iter().any(|l| l == "sliding_attention"));
    if windowed {
        return Err(ConfigError::Unsupported(
            "sliding-window attention is switched on; this loader runs full attention only".into(),
        ));
    }
    Ok(candle_transformers::models::qwen2::Config {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        max_position_embeddings: raw.max_position_embeddings,
        // No window: a window as long as the context never masks anything.
        sliding_window: raw.sliding_window.unwrap_or(raw.max_position_embeddings).max(raw.max_position_embeddings),
        max_window_layers: raw.max_window_layers.unwrap_or(raw.num_hidden_layers),
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        rope_theta,
        rms_norm_eps: raw.rms_norm_eps,
        use_sliding_window: false,
        hidden_act,
    })
}

#[derive(Debug, Deserialize)]
struct RawGeneration {
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// The stop token ids from generation_config.json (`eos_token_id`, a number or a list), falling
/// back to config.json's `eos_token_id`.
pub fn stop_token_ids(generation_config: Option<&[u8]>, config: &[u8]) -> Result<Vec<u32>, ConfigError> {
    let from = |bytes: &[u8], what: &str| -> Result<Option<Vec<u32>>, ConfigError> {
        let raw: RawGeneration =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Generation(format!("{what}: {e}")))?;
        Ok(raw.eos_token_id.map(|e| match e {
            OneOrMany::One(id) => vec![id],
            OneOrMany::Many(ids) => ids,
        }))
    };
    if let Some(bytes) = generation_config {
        if let Some(ids) = from(bytes, "eos_token_id")? {
            return Ok(ids);
        }
    }
    Ok(from(config, "config.json eos_token_id")?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSIC: &str = r#"{"vocab_size":128,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
        "num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":512,"sliding_window":512,
        "max_window_layers":2,"tie_word_embeddings":true,"rope_theta":1000000.0,"rms_norm_eps":1e-6,
        "use_sliding_window":false,"hidden_act":"silu"}"#;

    #[test]
    fn classic_and_transformers5_layouts_agree() {
        let classic = parse_config(CLASSIC.as_bytes()).unwrap();
        let v5 = r#"{"vocab_size":128,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":512,"sliding_window":null,
            "layer_types":["full_attention","full_attention"],"tie_word_embeddings":true,
            "rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},"rms_norm_eps":1e-6,
            "use_sliding_window":false,"hidden_act":"silu","dtype":"bfloat16"}"#;
        let v5 = parse_config(v5.as_bytes()).unwrap();
        assert_eq!(classic, v5);
        assert_eq!(v5.rope_theta, 1_000_000.0);
    }

    #[test]
    fn missing_and_mistyped_fields_are_named() {
        let missing = CLASSIC.replace(r#""hidden_size":64,"#, "");
        let err = parse_config(missing.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("missing field `hidden_size`"), "{err}");
        let mistyped = CLASSIC.replace(r#""num_hidden_layers":2"#, r#""num_hidden_layers":"two""#);
        let err = parse_config(mistyped.as_bytes()).unwrap_err().to_string();
        assert!(err.starts_with("config.json: invalid type"), "{err}");
    }

    #[test]
    fn stop_tokens_accept_a_number_or_a_list() {
        assert_eq!(stop_token_ids(Some(br#"{"eos_token_id":[7,5]}"#), b"{}").unwrap(), vec![7, 5]);
        assert_eq!(stop_token_ids(Some(br#"{"eos_token_id":7}"#), b"{}").unwrap(), vec![7]);
        assert_eq!(stop_token_ids(None, br#"{"eos_token_id":3}"#).unwrap(), vec![3]);
        assert!(stop_token_ids(Some(br#"{"eos_token_id":"x"}"#), b"{}").is_err());
    }
}
