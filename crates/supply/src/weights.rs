//! The precision a model's weight matrices are held in: part of how a model is supplied to a run
//! (and recorded in its provenance), so it lives below both the engine and the records.

/// What the weight matrices are stored in. Accumulation, norms and the KV cache are F32 either
/// way; activations too, but for the engine's BF16 dot products (`engine::qwen::arithmetic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WeightDtype {
    /// The checkpoint's values, exactly: results comparable with the F32 references.
    #[default]
    F32,
    /// Rounded to F16 at load: half the bytes to stream per step. Exact for BF16-stored values
    /// within F16's normal range (6.1e-5 to 65504); others lose bits, vanish or overflow.
    F16,
    /// Rounded to BF16 at load: half the bytes to stream per step, and exact for checkpoints
    /// stored in BF16 (as Qwen2.5's are), whose values it holds bit for bit. The engine's layers
    /// then round their activations to BF16 too, for the BF16 dot product (`engine::qwen::arithmetic`).
    Bf16,
    /// As a GGUF file stores each matrix: its Q8_0, Q4_0 and Q4_1 blocks computed on where they
    /// lie in the file, with the activations quantized to 8-bit blocks (`engine::qwen::arithmetic`);
    /// other types widened to F32 at load. For GGUF files only.
    Native,
}

impl WeightDtype {
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::F16 => "f16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::Native => "native",
        }
    }

    pub fn parse(name: &str) -> std::result::Result<Self, UnknownDtype> {
        match name {
            "f32" => Ok(WeightDtype::F32),
            "f16" => Ok(WeightDtype::F16),
            "bf16" => Ok(WeightDtype::Bf16),
            "native" => Ok(WeightDtype::Native),
            _ => Err(UnknownDtype(name.to_string())),
        }
    }
}

/// A weight type's name that is none of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight dtype `{0}`; known: f32, f16, bf16, native (a GGUF file's own block types)")]
pub struct UnknownDtype(pub String);
