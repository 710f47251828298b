//! A Qwen2 forward of our own (Llama's too: the same model without q/k/v biases, which it runs
//! when its weights hold none; `crate::gguf` reads both) over candle tensors, with a preallocated per-session KV cache that
//! is written in place, attention that serves grouped-query heads without copying K/V, and
//! batched steps: one forward advances several sessions, each at its own position.
//!
//! Why not candle-transformers' model: it concatenates the whole cache on every step and
//! materialises the repeated K/V heads of grouped-query attention every step, so a decode step
//! grows more expensive with the context; each session must clone the model to own a cache; and
//! it cannot run sessions at different positions in one forward. Here the weights are shared by
//! reference and a session owns only its [`Cache`].
//!
//! Numerics: every projection, of one row or a prefill chunk's hundreds, goes through our own
//! kernel, whose every output depends only on its own row, and so does attention (one kernel for
//! decoding rows and prefill chunks, each row's softmax taken online over its own positions), so
//! a session's logits are bit-identical whether it steps alone or batched with others, and
//! whether its prompt was prefilled whole, in chunks or token by token. Norms and rotary
//! embedding are candle's, per row. Greedy ids equal those of
//! transformers (tests check it). A step that wants only greedy ids ([`Qwen2::next_batch`], what
//! the engine runs for greedy sessions) reads the head through its screen ([`crate::greedy`]): the same ids, for a
//! quarter of the head's bytes in F32.

use crate::greedy::{self, Screen};
use crate::weights::{self, Matrix, Weights};
use crate::{kernel, memory};
use candle_core::{CpuStorage, DType, Device, Result, Storage, Tensor};
use candle_transformers::models::qwen2::Config;

pub use supply::weights::WeightDtype;

mod budget;
mod kv;
pub use budget::{KvBudget, KvBudgetError};
use kv::{Blocks, Store};
pub use kv::{Cache, KvPool};

/// Rows a forward takes through the layers at once ([`Qwen2::last_hidden`] slices longer ones):
/// enough that each weight read serves many rows, few enough that a slice's intermediates stay
/// in tens of megabytes.
const SLICE_ROWS: usize = 256;

/// The candle dtype weights are held in.
fn candle_dtype(w: WeightDtype) -> DType {
    match w {
        WeightDtype::F32 | WeightDtype::Native => DType::F32,
        WeightDtype::F16 => DType::F16,
        WeightDtype::Bf16 => DType::BF16,
    }
}

/// Runs `$body` with `$w` bound to the data of `$t` (a contiguous weight tensor on the CPU) as
/// stored: each arm instantiates the generic code in `$body` for its element type.
macro_rules! with_weights {
    ($t:expr, |$w:ident| $body:expr) => {{
        let (storage, layout) = $t.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().expect("weights are made contiguous at load");
        match &*storage {
            Storage::Cpu(CpuStorage::F32(w)) => {
                let $w = &w[start..end];
                $body
            }
            Storage::Cpu(CpuStorage::F16(w)) => {
                let $w = &w[start..end];
                $body
            }
            Storage::Cpu(CpuStorage::BF16(w)) => {
                let $w = &w[start..end];
                $body
            }
            _ => candle_core::bail!("weights must be F32, F16 or BF16 on the CPU"),
        }
    }};
}

/// How the engine computes with weights of `dtype`, in words (experiments record it beside the
/// dtype): F16 weights widen to F32; BF16 weights in the layers meet activations rounded to BF16
/// in dot products (`kernel::paired`); the head, attention and the KV cache are F32 in every case.
pub fn arithmetic(dtype: WeightDtype) -> &'static str {
    match dtype {
        WeightDtype::F32 => "f32",
        WeightDtype::F16 => "f16 weights, f32 activations and accumulation",
        WeightDtype::Bf16 => {
            "bf16 weights; the layers' products are bf16 dot products (activations rounded to bf16, f32 \
             accumulation); head, attention and KV cache in f32"
        }
        WeightDtype::Native => {
            "native: q8_0, q4_0 and q4_1 matrices read in place, each block an exact integer dot product \
             with the activations quantized to 8-bit blocks of 32 (f32 scale per block), f32 accumulation; \
             other types widened to f32 at load; norms, attention and KV cache in f32"
        }
    }
}

/// [`Qwen2::decode_step_bytes`]: the bytes a decode step must read, by what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBytes {
    pub layers: usize,
    pub head: usize,
    pub kv: usize,
}

impl StepBytes {
    pub fn total(&self) -> usize {
        self.layers + self.head + self.kv
    }
}

/// A linear layer, bias kept in F32.
struct Proj {
    w: Stored,
    bias: Option<Vec<f32>>,
    out: usize,
}

/// How a projection's weights are held.
enum Stored {
    /// In memory in `layout`: row-major `out × in`, or its values in panels as one flat
    /// `out·in` vector.
    Dense {
        w: Tensor,
        layout: kernel::Layout,
        /// For the head: the quantized copy that finds greedy ids without every logit.
        screen: Option<Screen>,
    },
    /// A GGUF file's blocks (its parts stacked), read where they lie in its map.
    Blocks(Vec<weights::Blocks>),
}

impl Proj {
    /// The matrices `parts` stacked (their rows in order, as one `out × in` matrix), stored in
    /// `dtype`, in panels when `panels` (the layers' projections: [`kernel::Layout`] says why)
    /// or as rows (the head, whose rows are also looked up and screened one by one). For
    /// [`WeightDtype::Native`], parts all in a block format the products read are kept where
    /// they lie in the file; any others are laid out in F32.
    ///
    /// F32 matrices are laid out where they will live, straight from the parts' rows
    /// ([`crate::weights`] says why). BF16 panels pair their inputs (when there is an even
    /// number of them): their products are BF16 dot products, with the activations rounded to
    /// BF16 (`kernel::paired` says why).
    fn new(
        parts: &[Matrix],
        bias: Option<Vec<f32>>,
        dtype: WeightDtype,
        panels: bool,
        device: &Device,
    ) -> Result<Self> {
        let k = parts.first().map_or(0, |p| p.dims().1);
        if k == 0 || parts.iter().any(|p| p.dims().1 != k) {
            candle_core::bail!("a projection's parts must share a positive width")
        }
        let out: usize = parts.iter().map(|p| p.dims().0).sum();
        if dtype == WeightDtype::Native {
            let blocks: Option<Vec<weights::Blocks>> = parts.iter().map(|p| p.blocks().cloned()).collect();
            if let Some(blocks) = blocks.filter(|b| {
                let format = b[0].quant().map(|q| q.format);
                format.is_some() && b.iter().all(|b| b.quant().map(|q| q.format) == format)
            }) {
                return Ok(Proj { w: Stored::Blocks(blocks), bias, out });
            }
        }
        let layout = match (panels, dtype) {
            (true, WeightDtype::Bf16) if k.is_multiple_of(2) => kernel::Layout::paired_panels(k),
            (true, _) => kernel::Layout::panels(k),
            (false, _) => kernel::Layout::rows(k),
        };
        let fill = |first: usize, rows: &mut [f32]| weights::fill_stacked(parts, first, rows);
        let w = match dtype {
            WeightDtype::F32 | WeightDtype::Native => {
                memory::filled_on_huge_pages(out * k, device, |data| layout.fill_into(data, fill))?
            }
            _ => {
                let mut laid = vec![0f32; out * k];
                layout.fill_into(&mut laid, fill);
                memory::on_huge_pages(&Tensor::from_vec(laid, out * k, device)?.to_dtype(candle_dtype(dtype))?)?
            }
        };
        let w = if panels { w } else { w.reshape((out, k))? };
        Ok(Proj { w: Stored::Dense { w, layout, screen: None }, bias, out })
    }

    /// This projection with a [`Screen`] for [`Self::greedy`] (none when a weight is not finite,
    /// or when the weights are blocks: their product reads as few bytes as a screen would).
    fn screened(mut self) -> Result<Self> {
        assert!(self.bias.is_none(), "a screen bounds products without bias");
        if let Stored::Dense { w, screen, .. } = &mut self.w {
            let k = w.dim(1)?;
            *screen = with_weights!(w, |w| Screen::new(w, k));
        }
        Ok(self)
    }

    /// The dense weights, when they are.
    fn dense(&self) -> Option<&Tensor> {
        match &self.w {
            Stored::Dense { w, .. } => Some(w),
            Stored::Blocks(_) => None,
        }
    }

    /// `x` is `rows × in` (F32); returns `rows × out`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Tensor::from_vec(self.outputs(x)?, (x.dim(0)?, self.out), x.device())
    }

    /// [`Self::forward`]'s values, row-major, for a caller that works on them directly.
    fn outputs(&self, x: &Tensor) -> Result<Vec<f32>> {
        let (rows, x) = (x.dim(0)?, x.flatten_all()?.to_vec1::<f32>()?);
        self.products(&x, rows)
    }

    /// The products of `rows` rows `x` (row-major), with the bias.
    fn products(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        match &self.w {
            Stored::Dense { w, layout, .. } => {
                with_weights!(w, |w| Ok(kernel::linear(w, *layout, self.bias.as_deref(), x, rows)))
            }
            Stored::Blocks(parts) => {
                let parts: Vec<kernel::QuantMatrix<'_>> = parts.iter().filter_map(weights::Blocks::quant).collect();
                Ok(kernel::quant_linear(&parts, self.bias.as_deref(), x, rows))
            }
        }
    }

    /// For each row of `x` (`rows × in`, F32), the first index of the largest output: through
    /// the screen where there is one and it holds, else from the row's full product.
    fn greedy(&self, x: &Tensor) -> Result<Vec<u32>> {
        let (rows, k) = x.dims2()?;
        let x = x.flatten_all()?.to_vec1::<f32>()?;
        let screened = match &self.w {
            Stored::Dense { w, screen: Some(screen), .. } => with_weights!(w, |w| screen.argmax(w, &x)),
            _ => vec![None; rows],
        };
        if screened.iter().all(Option::is_none) {
            let all = self.products(&x, rows)?;
            return Ok(all.chunks_exact(self.out).map(greedy::argmax).collect());
        }
        screened
            .into_iter()
            .zip(x.chunks_exact(k))
            .map(|(id, x)| id.map_or_else(|| Ok(greedy::argmax(&self.products(x, 1)?)), Ok))
            .collect()
    }

    /// For each row of `x`, the outputs that could be among its `n` largest (ties included),
    /// with their values, in index order: through the screen where there is one and it holds,
    /// else every output of the row's full product.
    fn top(&self, x: &Tensor, n: usize) -> Result<Vec<Vec<(u32, f32)>>> {
        let (rows, k) = x.dims2()?;
        let x = x.flatten_all()?.to_vec1::<f32>()?;
        let screened = match &self.w {
            Stored::Dense { w, screen: Some(screen), .. } => with_weights!(w, |w| screen.top(w, &x, n)),
            _ => vec![None; rows],
        };
        screened
            .into_iter()
            .zip(x.chunks_exact(k))
            .map(|(top, x)| match top {
                Some((ids, exact)) => Ok(ids.into_iter().map(|j| j as u32).zip(exact).collect()),
                None => Ok((0..).zip(self.products(x, 1)?).collect()),
            })
            .collect()
    }

    /// Bytes of the weights as held (not the screen's copy; a file's blocks as stored).
    fn bytes(&self) -> usize {
        match &self.w {
            Stored::Dense { w, .. } => w.elem_count() * w.dtype().size_in_bytes(),
            Stored::Blocks(parts) => parts.iter().map(weights::Blocks::bytes).sum(),
        }
    }

    /// Bytes a greedy step reads of this projection: its screen's where it has one.
    fn greedy_bytes(&self) -> usize {
        match &self.w {
            Stored::Dense { screen: Some(screen), .. } => screen.bytes(),
            _ => self.bytes(),
        }
    }
}

/// The token embeddings: a tensor, or a GGUF matrix whose rows are dequantized as they are
/// looked up.
enum Embedding {
    Tensor(Tensor),
    Rows(Matrix),
}

impl Embedding {
    /// The rows of `ids`, `ids × hidden` in F32.
    fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Embedding::Tensor(t) => t.index_select(&Tensor::new(ids, device)?, 0)?.to_dtype(DType::F32),
            Embedding::Rows(m) => {
                let (vocab, hidden) = m.dims();
                let mut x = vec![0f32; ids.len() * hidden];
                for (id, row) in ids.iter().zip(x.chunks_exact_mut(hidden)) {
                    if *id as usize >= vocab {
                        candle_core::bail!("token id {id} is past the vocabulary of {vocab}")
                    }
                    m.fill(*id as usize, row);
                }
                Tensor::from_vec(x, (ids.len(), hidden), device)
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Embedding::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Embedding::Rows(m) => m.blocks().map_or(0, weights::Blocks::bytes),
        }
    }
}

struct Layer {
    /// Queries, keys and values in one matrix (rows in that order): one pass over the input.
    qkv: Proj,
    o: Proj,
    /// Gate and up projections in one matrix (gate rows first).
    gate_up: Proj,
    down: Proj,
    attn_norm: Tensor,
    ffn_norm: Tensor,
}

/// What a step needs from an item's last position ([`Qwen2::next_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No token: a prefill chunk that does not end its prompt.
    Nothing,
    /// The greedy id.
    Greedy,
    /// The ids whose logits could be among the `n` largest (ties included), with their logits:
    /// top-k sampling's input, through the head's screen.
    Top(usize),
    /// Every logit, to sample from.
    Logits,
}

/// What a step got for an item, as its [`Want`] asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Nothing,
    Id(u32),
    /// Ids in increasing order, each with its logit (every id, for [`Want::Logits`]); the same
    /// bits as the full product's.
    Candidates(Vec<(u32, f32)>),
}

/// The shared, read-only model.
pub struct Qwen2 {
    /// Token embeddings, `vocab × hidden`, in the weight dtype (or the file's blocks).
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Proj,
    cos: Tensor,
    sin: Tensor,
    eps: f32,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    inter: usize,
    max_positions: usize,
    weight_dtype: WeightDtype,
    /// The head is the embedding matrix (one copy in memory).
    tied: bool,
    device: Device,
}

impl Qwen2 {
    /// Loads the weights from `weights` (found by their Hugging Face names; shapes are checked
    /// here, so a wrong checkpoint fails at load, not mid-run) and stores the matrices in `dtype`.
    pub(crate) fn load_from(cfg: &Config, weights: &impl Weights, dtype: WeightDtype) -> Result<Self> {
        let head_dim = cfg.hidden_size / cfg.num_attention_heads;
        let (h, kv, inter) = (cfg.hidden_size, cfg.num_key_value_heads * head_dim, cfg.intermediate_size);
        let device = Device::Cpu;
        let matrix = |name: &str, rows: usize, cols: usize| weights.matrix(&format!("{name}.weight"), rows, cols);
        let vector = |name: &str, len: usize| weights.vector(name, len);
        let panels = |parts: &[Matrix], bias: Option<Vec<f32>>| Proj::new(parts, bias, dtype, true, &device);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let (a, f) = (format!("model.layers.{i}.self_attn"), format!("model.layers.{i}.mlp"));
            let qkv = [
                matrix(&format!("{a}.q_proj"), h, h)?,
                matrix(&format!("{a}.k_proj"), kv, h)?,
                matrix(&format!("{a}.v_proj"), kv, h)?,
            ];
            // Qwen2 has q/k/v biases, Llama none: a bias is used where the weights hold one.
            let qkv_bias = if weights.contains(&format!("{a}.q_proj.bias")) {
                let parts =
                    [("q_proj", h), ("k_proj", kv), ("v_proj", kv)].map(|(p, n)| vector(&format!("{a}.{p}.bias"), n));
                let mut bias = Vec::with_capacity(h + 2 * kv);
                for part in parts {
                    bias.extend(part?.to_vec1::<f32>()?);
                }
                Some(bias)
            } else {
                None
            };
            let gate_up = [matrix(&format!("{f}.gate_proj"), inter, h)?, matrix(&format!("{f}.up_proj"), inter, h)?];
            layers.push(Layer {
                qkv: panels(&qkv, qkv_bias)?,
                o: panels(&[matrix(&format!("{a}.o_proj"), h, h)?], None)?,
                gate_up: panels(&gate_up, None)?,
                down: panels(&[matrix(&format!("{f}.down_proj"), h, inter)?], None)?,
                attn_norm: vector(&format!("model.layers.{i}.input_layernorm.weight"), h)?,
                ffn_norm: vector(&format!("model.layers.{i}.post_attention_layernorm.weight"), h)?,
            });
        }
        let norm = vector("model.norm.weight", h)?;
        let embed = matrix("model.embed_tokens", cfg.vocab_size, h)?;
        let tied = !weights.contains("lm_head.weight");
        let head = if tied { embed.clone() } else { matrix("lm_head", cfg.vocab_size, h)? };
        let lm_head = Proj::new(&[head], None, dtype, false, &device)?.screened()?;
        // Tied embeddings share the head's (possibly converted) storage; a native file's
        // blocks are looked up in place.
        let embed = match (tied, lm_head.dense()) {
            (true, Some(w)) => Embedding::Tensor(w.clone()),
            (_, _) if dtype == WeightDtype::Native && embed.blocks().is_some() => Embedding::Rows(embed),
            (_, _) => Embedding::Tensor(
                Tensor::from_vec(embed.to_vec(), (cfg.vocab_size, h), &device)?.to_dtype(candle_dtype(dtype))?,
            ),
        };
        // The rotary tables as candle-transformers computes them (same values, same ids).
        let inv_freq: Vec<f32> =
            (0..head_dim).step_by(2).map(|i| 1f32 / cfg.rope_theta.powf(i as f64 / head_dim as f64) as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, head_dim / 2), &device)?;
        let t = Tensor::arange(0u32, cfg.max_position_embeddings as u32, &device)?
            .to_dtype(DType::F32)?
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
            hidden: h,
            inter,
            max_positions: cfg.max_position_embeddings,
            weight_dtype: dtype,
            tied,
            device,
        })
    }

    pub fn weight_dtype(&self) -> WeightDtype {
        self.weight_dtype
    }

    /// Bytes of the weight matrices as held in memory (the embedding counted once when tied).
    pub fn weight_bytes(&self) -> usize {
        let layers = self.layer_bytes();
        let embed = if self.tied { 0 } else { self.embed.bytes() };
        layers + self.lm_head.bytes() + embed
    }

    /// Bytes of every layer's matrices, as stored (norms and biases left out).
    fn layer_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes()).sum()
    }

    /// What one session's greedy decode step streams from memory at `context` cached positions:
    /// every layer matrix once, the head through its screen (its eight-bit copy and row scales;
    /// the few candidate rows it then computes are left out), and the cached keys and values.
    /// Norms, biases and activations are kilobytes and left out.
    pub fn decode_step_bytes(&self, context: usize) -> StepBytes {
        let layers = self.layer_bytes();
        let head = self.lm_head.greedy_bytes();
        let kv = context.saturating_mul(self.position_bytes());
        StepBytes { layers, head, kv }
    }

    /// Bytes of one block of a [`KvPool`]: every layer's keys and values of [`kernel::TILE`]
    /// positions, in F32.
    pub fn block_bytes(&self) -> usize {
        2 * self.layers.len() * self.kv_heads * kernel::TILE * self.head_dim * std::mem::size_of::<f32>()
    }

    /// Bytes a cache for `capacity` positions takes in whole blocks ([`Self::new_cache`]'s
    /// allocation): for a run to check that its sessions fit before it makes them.
    pub fn cache_bytes(&self, capacity: usize) -> usize {
        KvPool::blocks_for(capacity.min(self.max_positions)).saturating_mul(self.block_bytes())
    }

    /// Bytes one position takes in a pool: every layer's keys and values of it.
    pub fn position_bytes(&self) -> usize {
        self.block_bytes() / KvPool::BLOCK_POSITIONS
    }

    /// A budget in this model's positions: as given, or the whole positions its bytes hold.
    pub fn budget_positions(&self, budget: KvBudget) -> usize {
        let n = match budget {
            KvBudget::Positions(n) => n,
            KvBudget::Bytes(b) => b / self.position_bytes().max(1) as u64,
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// A pool within a budget of `positions` (its whole blocks, at least one), keeping full
    /// blocks for reuse by content when `reuse` is set.
    pub fn kv_pool_within(&self, positions: usize, reuse: bool) -> Result<std::sync::Arc<KvPool>> {
        self.kv_pool(KvPool::blocks_within(positions).max(1), reuse)
    }

    /// A pool of `blocks` blocks for this model's caches (allocated zeroed, its pages resident
    /// once written), keeping full blocks for reuse by content when `reuse` is set.
    pub fn kv_pool(&self, blocks: usize, reuse: bool) -> Result<std::sync::Arc<KvPool>> {
        let (kv_heads, d, tile) = (self.kv_heads, self.head_dim, kernel::TILE);
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for _ in &self.layers {
            k.push(memory::zeros((blocks, kv_heads, d, tile), &self.device)?);
            v.push(memory::zeros((blocks, kv_heads, tile, d), &self.device)?);
        }
        let blocks_u32 =
            u32::try_from(blocks).map_err(|_| candle_core::Error::Msg(format!("{blocks} blocks: too many")))?;
        Ok(std::sync::Arc::new(KvPool {
            k,
            v,
            blocks,
            block_bytes: self.block_bytes(),
            reuse,
            state: std::sync::Mutex::new(Blocks {
                free: (0..blocks_u32).rev().collect(),
                prefix: crate::prefix::PrefixTree::default(),
            }),
            peak: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    /// An empty cache in `pool` for up to `capacity` positions, taking blocks as it fills.
    pub fn cache_in(&self, pool: &std::sync::Arc<KvPool>, capacity: usize) -> Cache {
        Cache { pool: pool.clone(), blocks: Vec::new(), len: 0, capacity: capacity.min(self.max_positions), shared: 0 }
    }

    /// A cache for up to `capacity` positions in a pool of its own, every block taken at once:
    /// what a session alone or a benchmark needs, which can never run out.
    pub fn new_cache(&self, capacity: usize) -> Result<Cache> {
        let capacity = capacity.min(self.max_positions);
        let pool = self.kv_pool(KvPool::blocks_for(capacity), false)?;
        let mut cache = self.cache_in(&pool, capacity);
        cache.reserve(capacity)?;
        Ok(cache)
    }

    /// Runs `ids` at positions `cache.len()..`, appends their keys and values to the cache, and
    /// returns the logits of the last position (a vector over the vocabulary).
    pub fn forward(&self, cache: &mut Cache, ids: &[u32]) -> Result<Tensor> {
        self.forward_batch(&mut [(cache, ids)])?.get(0)
    }

    /// One forward for several sessions: each item's `ids` run at its cache's next positions and
    /// are appended to that cache. Returns `items × vocab`: the logits of each item's last
    /// position. Projections and the MLP see all rows at once (each weight is read once for the
    /// whole batch); attention runs per item against its own cache.
    pub fn forward_batch(&self, items: &mut [(&mut Cache, &[u32])]) -> Result<Tensor> {
        kernel::on_pool(|| self.lm_head.forward(&self.last_hidden(items)?))
    }

    /// One forward as [`Self::forward_batch`], returning for each item what its `wants` entry
    /// asks of its last position: nothing (a prefill chunk that does not end its prompt needs no
    /// head), the greedy id (the first index of its largest logit, as over the logits, read
    /// through the head's screen ([`crate::greedy`]) without computing every logit), the
    /// candidates for the `n` largest logits (through the same screen), or every logit. Logits
    /// have the bits of [`Self::forward_batch`]'s.
    pub fn next_batch(&self, items: &mut [(&mut Cache, &[u32])], wants: &[Want]) -> Result<Vec<Next>> {
        assert_eq!(items.len(), wants.len(), "one `wants` per item");
        kernel::on_pool(|| {
            let last = self.last_hidden(items)?;
            let mut next = vec![Next::Nothing; items.len()];
            let mut asked: Vec<Want> = Vec::new();
            for want in wants.iter().filter(|w| **w != Want::Nothing) {
                if !asked.contains(want) {
                    asked.push(*want);
                }
            }
            for want in asked {
                let rows: Vec<u32> = (0..items.len() as u32).filter(|i| wants[*i as usize] == want).collect();
                let x = last.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
                let got: Vec<Next> = match want {
                    Want::Greedy => self.lm_head.greedy(&x)?.into_iter().map(Next::Id).collect(),
                    Want::Top(n) => self.lm_head.top(&x, n)?.into_iter().map(Next::Candidates).collect(),
                    Want::Logits => {
                        let logits = self.lm_head.outputs(&x)?;
                        let every = |l: &[f32]| Next::Candidates((0..).zip(l.iter().copied()).collect());
                        logits.chunks_exact(self.lm_head.out).map(every).collect()
                    }
                    Want::Nothing => unreachable!("not asked"),
                };
                for (row, got) in rows.iter().zip(got) {
                    next[*row as usize] = got;
                }
            }
            Ok(next)
        })
    }

    /// Runs the layers over every item's ids (appending to the caches) and returns the final
    /// norm of each item's last position, `items × hidden`: the head's input.
    ///
    /// More than [`SLICE_ROWS`] rows (a long prompt prefilled whole, or many sessions) go
    /// through the layers in slices of at most that many, in order, each slice's keys and values
    /// cached before the next attends: a chunked prefill inside one step. The bits are those of
    /// one pass (every row's products, norms, rotation and attention depend only on its own row,
    /// position and cache), and the intermediates stay a slice's size: a whole 4096-token prompt
    /// at once made hundreds of megabytes of them per layer, and faulting in their fresh pages
    /// took a fifth of the prefill's time.
    fn last_hidden(&self, items: &mut [(&mut Cache, &[u32])]) -> Result<Tensor> {
        let rows: usize = items.iter().map(|(_, ids)| ids.len()).sum();
        // An empty item or one past its cache is refused by `layers` before anything is written.
        let refused = items.iter().any(|(cache, ids)| ids.is_empty() || cache.len + ids.len() > cache.capacity);
        if rows <= SLICE_ROWS || refused {
            return self.layers(items);
        }
        // Every block first, so that a pool too small fails before any slice is computed.
        for (cache, ids) in items.iter_mut() {
            cache.reserve(ids.len())?;
        }
        // Each item's last position's row, from the slice that ends it.
        let mut last = vec![None; items.len()];
        let mut done = vec![0; items.len()];
        while done.iter().zip(items.iter()).any(|(d, (_, ids))| *d < ids.len()) {
            let mut room = SLICE_ROWS;
            let mut slice = Vec::new();
            let mut ending = Vec::new();
            for (i, (cache, ids)) in items.iter_mut().enumerate() {
                let take = (ids.len() - done[i]).min(room);
                if take == 0 {
                    continue;
                }
                slice.push((&mut **cache, &ids[done[i]..done[i] + take]));
                done[i] += take;
                room -= take;
                if done[i] == ids.len() {
                    ending.push((i, slice.len() - 1));
                }
            }
            let hidden = self.layers(&mut slice)?;
            for (i, at) in ending {
                last[i] = Some(hidden.narrow(0, at, 1)?);
            }
        }
        let last: Vec<Tensor> = last.into_iter().map(|t| t.expect("every item's ids end in a slice")).collect();
        Tensor::cat(&last, 0)
    }

    /// [`Self::last_hidden`] for one slice of rows: all of them through the layers at once.
    fn layers(&self, items: &mut [(&mut Cache, &[u32])]) -> Result<Tensor> {
        let mut positions = Vec::new();
        for (cache, ids) in items.iter_mut() {
            let (pos, n) = (cache.len, ids.len());
            if n == 0 || pos + n > cache.capacity {
                candle_core::bail!("{n} tokens at position {pos} do not fit a cache of {} positions", cache.capacity)
            }
            cache.reserve(n)?;
            positions.extend(pos as u32..(pos + n) as u32);
        }
        let rows = positions.len();
        let all_ids: Vec<u32> = items.iter().flat_map(|(_, ids)| ids.iter().copied()).collect();
        let mut x = self.embed.lookup(&all_ids, &self.device)?;
        let positions = Tensor::new(positions.as_slice(), &self.device)?;
        let (cos, sin) = (self.cos.index_select(&positions, 0)?, self.sin.index_select(&positions, 0)?);
        let (q_width, kv_width) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        for (l, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.eps)?;
            let qkv = layer.qkv.forward(&h)?;
            let heads = |from: usize, width: usize, n: usize| -> Result<Tensor> {
                qkv.narrow(1, from, width)?.reshape((1, rows, n, self.head_dim))?.transpose(1, 2)?.contiguous()
            };
            let q = candle_nn::rotary_emb::rope(&heads(0, q_width, self.heads)?, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&heads(q_width, kv_width, self.kv_heads)?, &cos, &sin)?;
            let v = heads(q_width + kv_width, kv_width, self.kv_heads)?;
            let mut first = 0;
            for (cache, ids) in items.iter_mut() {
                let n = ids.len();
                let part = |t: &Tensor| t.narrow(2, first, n)?.contiguous();
                self.store(cache, l, &part(&k)?, &part(&v)?)?;
                first += n;
            }
            let attn = self.attention(items, l, &q)?;
            x = (x + layer.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, self.eps)?;
            let gate_up = layer.gate_up.outputs(&h)?;
            let act = Tensor::from_vec(kernel::silu_mul(&gate_up, rows), (rows, self.inter), &self.device)?;
            let mlp = layer.down.forward(&act)?;
            x = (x + mlp)?;
        }
        let mut last = Vec::with_capacity(items.len());
        let mut end = 0;
        for (cache, ids) in items.iter_mut() {
            cache.len += ids.len();
            end += ids.len();
            last.push(x.narrow(0, end - 1, 1)?);
        }
        candle_nn::ops::rms_norm(&Tensor::cat(&last, 0)?, &self.norm, self.eps)
    }

    /// Writes one item's new keys and values (`1 × kv_heads × n × d`, rotated, contiguous) into
    /// its cache in layer `l`, at its position.
    fn store(&self, cache: &mut Cache, l: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let store = Store {
            blocks: &cache.blocks,
            pos: cache.len,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            keys: true,
        };
        cache.pool.k[l].inplace_op2(k, &store)?;
        cache.pool.v[l].inplace_op2(v, &Store { keys: false, ..store })
    }

    /// Attention in layer `l` of every item's new rows over its cache (their keys and values
    /// already stored): `q` is every row's queries, `1 × heads × rows × d`, rotated; returns
    /// `rows × hidden`. Decoding rows and prefill chunks alike go through our kernel, all items
    /// in one parallel region ([`kernel::attend_each`]: a row's bits depend only on its own
    /// query, position and cache).
    fn attention(&self, items: &[(&mut Cache, &[u32])], l: usize, q: &Tensor) -> Result<Tensor> {
        let (rows, d, hidden) = (q.dim(2)?, self.head_dim, self.hidden);
        let all_q = q.flatten_all()?.to_vec1::<f32>()?;
        // Each item's queries, `n × heads × d`.
        let mut queries = Vec::with_capacity(items.len());
        let mut first = 0;
        for (_, ids) in items {
            let n = ids.len();
            let mut item = Vec::with_capacity(n * hidden);
            for r in first..first + n {
                for h in 0..self.heads {
                    item.extend_from_slice(&all_q[(h * rows + r) * d..][..d]);
                }
            }
            queries.push(item);
            first += n;
        }
        let storages: Vec<_> = items
            .iter()
            .map(|(cache, _)| (cache.pool.k[l].storage_and_layout(), cache.pool.v[l].storage_and_layout()))
            .collect();
        // Each item's tiles of keys and of values, KV head by KV head, in position order.
        let tile = kernel::TILE * d;
        let mut tiles = Vec::with_capacity(items.len());
        for ((cache, ids), ((k, k_layout), (v, v_layout))) in items.iter().zip(&storages) {
            let (Storage::Cpu(CpuStorage::F32(k)), Storage::Cpu(CpuStorage::F32(v))) = (&**k, &**v) else {
                candle_core::bail!("the KV pool must be F32 on the CPU")
            };
            let (ks, _) = k_layout.contiguous_offsets().expect("pools are allocated contiguous");
            let (vs, _) = v_layout.contiguous_offsets().expect("pools are allocated contiguous");
            let used = &cache.blocks[..(cache.len + ids.len()).div_ceil(kernel::TILE)];
            let at = |h: usize, b: u32| (b as usize * self.kv_heads + h) * tile;
            let keys: Vec<&[f32]> =
                (0..self.kv_heads).flat_map(|h| used.iter().map(move |&b| &k[ks + at(h, b)..][..tile])).collect();
            let values: Vec<&[f32]> =
                (0..self.kv_heads).flat_map(|h| used.iter().map(move |&b| &v[vs + at(h, b)..][..tile])).collect();
            tiles.push((keys, values));
        }
        let mut attending = Vec::with_capacity(items.len());
        for (((cache, ids), q), (keys, values)) in items.iter().zip(&queries).zip(&tiles) {
            let shape = kernel::AttentionShape {
                heads: self.heads,
                kv_heads: self.kv_heads,
                len: cache.len + ids.len(),
                rows: ids.len(),
                d,
            };
            attending.push(kernel::Attending { q, keys, values, shape });
        }
        let attended = kernel::attend_each(&attending, 1.0 / (d as f32).sqrt());
        Tensor::from_vec(attended, (rows, hidden), &self.device)
    }
}

#[cfg(test)]
mod tests;
