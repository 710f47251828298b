//! A Qwen2 forward of our own over candle tensors, with a preallocated per-session KV cache that
//! is written in place and attention that serves grouped-query heads without copying K/V.
//!
//! Why not candle-transformers' model: it concatenates the whole cache on every step and
//! materialises the repeated K/V heads of grouped-query attention every step, so a decode step
//! grows more expensive with the context, and each session must clone the model to own a cache.
//! Here the weights are shared by reference and a session owns only its [`Cache`]. The
//! projections, norms, rotary embedding and softmax use the same candle kernels as the stock
//! model, so greedy ids stay those of transformers (tests check it).

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use candle_transformers::models::qwen2::Config;

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    attn_norm: Tensor,
    ffn_norm: Tensor,
}

/// The shared, read-only model.
pub struct Qwen2 {
    embed: candle_nn::Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    eps: f32,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    max_positions: usize,
    device: Device,
}

/// One session's keys and values: per layer a `(1, kv_heads, capacity, head_dim)` buffer filled
/// from position 0 up to `len`.
pub struct Cache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl Cache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks the first `len` positions as filled without computing them: for benchmarks that time
    /// a step at a long context without paying for its prefill. The keys and values there are
    /// whatever the buffers hold (zeros), which changes the numbers, not the work.
    pub fn assume_filled(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// Bytes held by the buffers (allocated for the full capacity at creation).
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }
}

fn linear(vb: &VarBuilder, name: &str, bias: bool) -> Result<Linear> {
    let w = vb.get_unchecked(&format!("{name}.weight"))?;
    let b = if bias { Some(vb.get_unchecked(&format!("{name}.bias"))?) } else { None };
    Ok(Linear::new(w, b))
}

impl Qwen2 {
    pub fn load(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let head_dim = cfg.hidden_size / cfg.num_attention_heads;
        let m = vb.pp("model");
        let embed = candle_nn::embedding(cfg.vocab_size, cfg.hidden_size, m.pp("embed_tokens"))?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = m.pp(format!("layers.{i}"));
            let (h, kv, inter) = (cfg.hidden_size, cfg.num_key_value_heads * head_dim, cfg.intermediate_size);
            // Shapes are checked here so a wrong checkpoint fails at load, not mid-run.
            let check = |t: &Linear, rows: usize, cols: usize, name: &str| -> Result<()> {
                if t.weight().dims() != [rows, cols] {
                    candle_core::bail!("layer {i} {name}: shape {:?}, expected [{rows}, {cols}]", t.weight().dims())
                }
                Ok(())
            };
            let layer = Layer {
                q: linear(&l, "self_attn.q_proj", true)?,
                k: linear(&l, "self_attn.k_proj", true)?,
                v: linear(&l, "self_attn.v_proj", true)?,
                o: linear(&l, "self_attn.o_proj", false)?,
                gate: linear(&l, "mlp.gate_proj", false)?,
                up: linear(&l, "mlp.up_proj", false)?,
                down: linear(&l, "mlp.down_proj", false)?,
                attn_norm: l.get(h, "input_layernorm.weight")?,
                ffn_norm: l.get(h, "post_attention_layernorm.weight")?,
            };
            check(&layer.q, h, h, "q_proj")?;
            check(&layer.k, kv, h, "k_proj")?;
            check(&layer.v, kv, h, "v_proj")?;
            check(&layer.o, h, h, "o_proj")?;
            check(&layer.gate, inter, h, "gate_proj")?;
            check(&layer.up, inter, h, "up_proj")?;
            check(&layer.down, h, inter, "down_proj")?;
            layers.push(layer);
        }
        let norm = m.get(cfg.hidden_size, "norm.weight")?;
        let lm_head = if vb.contains_tensor("lm_head.weight") {
            linear(&vb, "lm_head", false)?
        } else {
            Linear::new(embed.embeddings().clone(), None)
        };
        // The rotary tables as candle-transformers computes them (same values, same ids).
        let inv_freq: Vec<f32> =
            (0..head_dim).step_by(2).map(|i| 1f32 / cfg.rope_theta.powf(i as f64 / head_dim as f64) as f32).collect();
        let device = vb.device().clone();
        let inv_freq = Tensor::from_vec(inv_freq, (1, head_dim / 2), &device)?.to_dtype(vb.dtype())?;
        let t = Tensor::arange(0u32, cfg.max_position_embeddings as u32, &device)?
            .to_dtype(vb.dtype())?
            .reshape((cfg.max_position_embeddings, 1))?;
        let freqs = t.matmul(&inv_freq)?;
        Ok(Qwen2 {
            embed,
            layers,
            norm,
            lm_head,
            cos: freqs.cos()?,
            sin: freqs.sin()?,
            eps: cfg.rms_norm_eps as f32,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim,
            hidden: cfg.hidden_size,
            max_positions: cfg.max_position_embeddings,
            device,
        })
    }

    /// A cache for up to `capacity` positions, allocated once.
    pub fn new_cache(&self, capacity: usize) -> Result<Cache> {
        let capacity = capacity.min(self.max_positions);
        let shape = (1, self.kv_heads, capacity, self.head_dim);
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for _ in &self.layers {
            k.push(Tensor::zeros(shape, DType::F32, &self.device)?);
            v.push(Tensor::zeros(shape, DType::F32, &self.device)?);
        }
        Ok(Cache { k, v, len: 0, capacity })
    }

    /// Runs `ids` at positions `cache.len()..`, appends their keys and values to the cache, and
    /// returns the logits of the last position (a vector over the vocabulary).
    pub fn forward(&self, cache: &mut Cache, ids: &[u32]) -> Result<Tensor> {
        let (pos, n) = (cache.len, ids.len());
        if n == 0 || pos + n > cache.capacity {
            candle_core::bail!("{n} tokens at position {pos} do not fit a cache of {} positions", cache.capacity)
        }
        let input = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
        let mut x = self.embed.forward(&input)?;
        let (cos, sin) = (self.cos.narrow(0, pos, n)?, self.sin.narrow(0, pos, n)?);
        let total = pos + n;
        let groups = self.heads / self.kv_heads;
        // Causal mask over the new rows: row i sees positions 0..=pos+i.
        let mask = (n > 1)
            .then(|| {
                let m: Vec<f32> = (0..n)
                    .flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
                    .collect();
                Tensor::from_vec(m, (n, total), &self.device)
            })
            .transpose()?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for (l, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.eps)?;
            let q = layer.q.forward(&h)?.reshape((1, n, self.heads, self.head_dim))?.transpose(1, 2)?.contiguous()?;
            let k =
                layer.k.forward(&h)?.reshape((1, n, self.kv_heads, self.head_dim))?.transpose(1, 2)?.contiguous()?;
            let v =
                layer.v.forward(&h)?.reshape((1, n, self.kv_heads, self.head_dim))?.transpose(1, 2)?.contiguous()?;
            let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
            cache.k[l].slice_set(&k, 2, pos)?;
            cache.v[l].slice_set(&v, 2, pos)?;
            let keys = cache.k[l].narrow(2, 0, total)?;
            let values = cache.v[l].narrow(2, 0, total)?;
            // Grouped-query attention without copying K/V: the `groups` query heads that share a
            // KV head are stacked as rows of one matrix against that head's keys.
            let q = q.reshape((1, self.kv_heads, groups * n, self.head_dim))?;
            let mut scores = (q.matmul(&keys.t()?)? * scale)?;
            if let Some(mask) = &mask {
                scores = scores.reshape((1, self.kv_heads, groups, n, total))?.broadcast_add(mask)?.reshape((
                    1,
                    self.kv_heads,
                    groups * n,
                    total,
                ))?;
            }
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let attn = probs.matmul(&values)?; // (1, kv_heads, groups * n, head_dim)
            let attn =
                attn.reshape((1, self.heads, n, self.head_dim))?.transpose(1, 2)?.reshape((1, n, self.hidden))?;
            x = (x + layer.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, self.eps)?;
            let gate = candle_nn::ops::silu(&layer.gate.forward(&h)?)?;
            let mlp = layer.down.forward(&(gate * layer.up.forward(&h)?)?)?;
            x = (x + mlp)?;
        }
        cache.len = total;
        let last = x.narrow(1, n - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, self.eps)?;
        self.lm_head.forward(&last)?.flatten_all()
    }
}
