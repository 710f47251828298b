//! The stock candle-transformers Qwen2 on the same checkpoint, in F32: the baseline the engine is
//! measured against (`decode-scaling`'s curves, `engine-bench`'s decode ratio), written once so
//! that both measure the same loop.

use crate::load::LoadedModel;
use candle_core::{DType, Device, Tensor, D};
use candle_transformers::models::qwen2::ModelForCausalLM;

/// The stock model and its own KV cache (one sequence, or `batch` copies of one).
pub struct Stock {
    model: ModelForCausalLM,
    device: Device,
}

impl Stock {
    /// The stock model over `loaded`'s `model.safetensors`, mapped in F32.
    pub fn new(loaded: &LoadedModel) -> candle_core::Result<Self> {
        let weights = loaded.dir.join("model.safetensors");
        // SAFETY: the checkpoint was verified against its pin and is not modified while mapped.
        let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &loaded.device)? };
        Ok(Stock { model: ModelForCausalLM::new(&loaded.config, vb)?, device: loaded.device.clone() })
    }

    /// Empties its KV cache, for a new sequence.
    pub fn clear(&mut self) {
        self.model.clear_kv_cache();
    }

    /// One forward of `batch` copies of `piece` at position `offset` (the cache holds `offset`
    /// positions): the greedy id of each copy's last position.
    pub fn forward(&mut self, piece: &[u32], batch: usize, offset: usize) -> candle_core::Result<Vec<u32>> {
        let ids: Vec<u32> = (0..batch).flat_map(|_| piece.iter().copied()).collect();
        let input = Tensor::from_vec(ids, (batch, piece.len()), &self.device)?;
        let logits = self.model.forward(&input, offset)?;
        logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()
    }
}
