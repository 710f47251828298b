//! The KV pool and a session's cache in it: every layer's keys of a 64-position block stored
//! dimension by dimension and its values position by position, a free list and its peak, the
//! prefix cache's blocks, and a session's block table that grows block by block.

use crate::kernel;
use candle_core::{CpuStorage, Result, Tensor};

/// One model's KV cache memory: blocks of [`kernel::TILE`] positions, each block holding every
/// layer's keys and values of its positions, shared by every [`Cache`] made from it. Per layer,
/// the keys are `blocks × kv_heads × head_dim × TILE` (a block's keys for one KV head are a tile
/// stored dimension by dimension, so a single position's scores are vector operations along
/// positions: [`kernel::attend_each`]) and the values `blocks × kv_heads × TILE × head_dim`.
/// A block is taken when a cache first writes one of its positions and given back when the cache
/// is cleared or dropped, so what the pool holds is what its caches use, never more than its
/// blocks: a budget. A pool that reuses prefixes ([`super::Qwen2::kv_pool`]) keeps every full block
/// its caches filled, and the partial last block of each finished one, in its prefix cache
/// ([`crate::prefix`]) after they give it back, and takes the least recently used of those back
/// only when it has no free block left.
pub struct KvPool {
    pub(super) k: Vec<Tensor>,
    pub(super) v: Vec<Tensor>,
    pub(super) blocks: usize,
    pub(super) block_bytes: usize,
    /// Whether full blocks are kept and shared by content.
    pub(super) reuse: bool,
    pub(super) state: std::sync::Mutex<Blocks>,
    /// The most blocks in use at once since the pool was made.
    pub(super) peak: std::sync::atomic::AtomicUsize,
}

/// Where every block of a pool is: free, or in the prefix cache (held or idle), or else held
/// by one cache as its own.
pub(super) struct Blocks {
    /// Free blocks, taken from the end.
    pub(super) free: Vec<u32>,
    pub(super) prefix: crate::prefix::PrefixTree,
}

impl Blocks {
    /// Blocks a cache could take now: the free ones and the cached ones no session holds.
    fn available(&self) -> usize {
        self.free.len() + self.prefix.idle()
    }
}

impl KvPool {
    /// Positions one block holds: the unit a pool is made of and a cache grows by, so every
    /// budget rounds down to it and every request's positions up to it. Callers ask the pool
    /// (this, [`KvPool::blocks_for`], [`KvPool::blocks_within`]) rather than the attention
    /// kernel's tile, which it is today.
    pub const BLOCK_POSITIONS: usize = kernel::TILE;

    /// The blocks `positions` positions take: whole blocks, rounded up.
    pub fn blocks_for(positions: usize) -> usize {
        positions.div_ceil(Self::BLOCK_POSITIONS)
    }

    /// The whole blocks a budget of `positions` positions holds, rounded down.
    pub fn blocks_within(positions: usize) -> usize {
        positions / Self::BLOCK_POSITIONS
    }

    /// Positions it holds, all its blocks together.
    pub fn positions(&self) -> usize {
        self.blocks.saturating_mul(Self::BLOCK_POSITIONS)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Blocks> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its blocks, in use or free.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Blocks a cache could take now: free, or cached and held by no session (evicted on demand).
    pub fn free_blocks(&self) -> usize {
        self.state().available()
    }

    /// Blocks sessions hold (their own, and the cached ones they use).
    pub fn used_blocks(&self) -> usize {
        self.blocks - self.free_blocks()
    }

    /// Bytes of one block (every layer's keys and values of [`kernel::TILE`] positions).
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The most bytes its caches held at once.
    pub fn peak_bytes(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::Relaxed) * self.block_bytes
    }

    /// Whether it keeps full blocks for reuse by later prompts with the same prefix.
    pub fn reuses_prefixes(&self) -> bool {
        self.reuse
    }

    /// What its prefix cache did so far (all zero for a pool that does not reuse).
    pub fn prefix_stats(&self) -> crate::prefix::PrefixStats {
        self.state().prefix.stats()
    }

    /// `n` blocks, free or evicted from the prefix cache, or none when fewer are available.
    fn take(&self, n: usize) -> Option<Vec<u32>> {
        let mut state = self.state();
        if state.available() < n {
            return None;
        }
        while state.free.len() < n {
            let block = state.prefix.evict().expect("an idle block is evictable");
            state.free.push(block);
        }
        let at = state.free.len() - n;
        let taken = state.free.split_off(at);
        self.peak.fetch_max(self.blocks - state.available(), std::sync::atomic::Ordering::Relaxed);
        Some(taken)
    }

    /// Gives back a cache's blocks: those in the prefix cache stay there, idle once no cache
    /// holds them; the rest are free.
    fn give(&self, blocks: impl IntoIterator<Item = u32>) {
        let mut state = self.state();
        for block in blocks {
            if !state.prefix.release(block) {
                state.free.push(block);
            }
        }
    }

    /// The cached prefix of `tokens` ([`crate::prefix::PrefixTree::lookup`]), its blocks now
    /// held by the caller; nothing from a pool that does not reuse.
    fn lookup(&self, tokens: &[u32]) -> crate::prefix::Prefix {
        if !self.reuse {
            return crate::prefix::Prefix::default();
        }
        self.state().prefix.lookup(tokens, kernel::TILE)
    }

    /// Copies every layer's keys and values of block `from` into block `to`.
    fn copy_block(&self, from: u32, to: u32) -> Result<()> {
        let op = CopyBlock { from: from as usize, to: to as usize, blocks: self.blocks };
        self.k.iter().chain(&self.v).try_for_each(|t| t.inplace_op1(&op))
    }
}

/// Copies one block of a pool's layer tensor (keys or values) over another, in place.
struct CopyBlock {
    from: usize,
    to: usize,
    blocks: usize,
}

impl candle_core::InplaceOp1 for CopyBlock {
    fn name(&self) -> &'static str {
        "copy-kv-block"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &candle_core::Layout) -> Result<()> {
        let (CpuStorage::F32(pool), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("copy-kv-block: the KV pool must be F32 and contiguous")
        };
        let each = (end - start) / self.blocks;
        let from = start + self.from * each;
        pool.copy_within(from..from + each, start + self.to * each);
        Ok(())
    }
}

/// One session's keys and values, filled from position 0 up to `len`, in blocks of its pool
/// ([`KvPool`]): tile `t` of its positions lives in block `blocks[t]`. It holds the blocks its
/// positions need, at most `capacity` positions' worth. Its first `shared` blocks are in the
/// pool's prefix cache (found there, or put there once full); only positions past them are
/// ever written, and once its session has finished ([`Cache::keep_tail`]) none.
pub struct Cache {
    pub(super) pool: std::sync::Arc<KvPool>,
    pub(super) blocks: Vec<u32>,
    pub(super) len: usize,
    pub(super) capacity: usize,
    pub(super) shared: usize,
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.pool.give(self.blocks.drain(..));
    }
}

impl Cache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The positions it may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks it must take from its pool to hold `n` more positions.
    pub fn blocks_for(&self, n: usize) -> usize {
        (self.len + n).div_ceil(kernel::TILE).saturating_sub(self.blocks.len())
    }

    /// Takes the blocks `n` more positions need; fails, taking none, when the pool has too few.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<()> {
        let want = self.blocks_for(n);
        if want > 0 {
            let Some(taken) = self.pool.take(want) else {
                candle_core::bail!(
                    "the KV pool has {} free blocks, {n} positions at {} need {want}",
                    self.pool.free_blocks(),
                    self.len
                )
            };
            self.blocks.extend(taken);
        }
        Ok(())
    }

    /// Gives every block back and forgets every position: a preempted session's cache, to be
    /// filled again from position 0.
    pub fn clear(&mut self) {
        self.pool.give(self.blocks.drain(..));
        self.len = 0;
        self.shared = 0;
    }

    /// Takes from the pool's prefix cache the longest cached prefix of `tokens` into this empty
    /// cache, and returns the positions it now holds: the whole blocks matched, shared, then
    /// the leading positions of a partly matching block, copied into a block of its own (when
    /// the pool has one to give); 0 from a pool that does not reuse, or a cache that holds
    /// something already.
    pub(crate) fn attach(&mut self, tokens: &[u32]) -> usize {
        if !self.blocks.is_empty() || self.len > 0 {
            return 0;
        }
        let tokens = &tokens[..tokens.len().min(self.capacity)];
        let found = self.pool.lookup(tokens);
        self.blocks = found.blocks;
        self.shared = self.blocks.len();
        self.len = self.shared * kernel::TILE;
        if let Some((from, m)) = found.partial {
            // The source is held, so taking a block cannot evict it; a failed copy (never on the
            // CPU) only means the positions are computed instead.
            if let Some(own) = self.pool.take(1).map(|b| b[0]) {
                self.blocks.push(own);
                if self.pool.copy_block(from, own).is_ok() {
                    self.len += m;
                }
            }
            self.pool.give([from]);
        }
        self.len
    }

    /// Puts its full blocks past the shared ones into the pool's prefix cache; `tokens` are the
    /// ids at its positions (at least `len` of them). A block whose tokens after the same prefix
    /// are cached already is swapped for the cached one (the same bits) and given back.
    pub(crate) fn share(&mut self, tokens: &[u32]) {
        if !self.pool.reuse {
            return;
        }
        let full = self.len.min(tokens.len()) / kernel::TILE;
        if self.shared >= full {
            return;
        }
        let mut state = self.pool.state();
        while self.shared < full {
            let t = self.shared;
            let parent = t.checked_sub(1).map(|p| self.blocks[p]);
            let key = &tokens[t * kernel::TILE..(t + 1) * kernel::TILE];
            if let Err(cached) = state.prefix.insert(parent, key, self.blocks[t]) {
                state.free.push(self.blocks[t]);
                self.blocks[t] = cached;
            }
            self.shared += 1;
        }
    }

    /// Puts its last, partly filled block into the pool's prefix cache, for a later prompt that
    /// continues its history (the next turn of a chat): only once its session is done with it,
    /// as it is never written again. `tokens` are the ids at its positions.
    pub(crate) fn keep_tail(&mut self, tokens: &[u32]) {
        let len = self.len.min(tokens.len());
        let t = len / kernel::TILE;
        if !self.pool.reuse || len % kernel::TILE == 0 || self.shared != t || self.blocks.len() <= t {
            return;
        }
        let parent = t.checked_sub(1).map(|p| self.blocks[p]);
        self.pool.state().prefix.insert_partial(parent, &tokens[t * kernel::TILE..len], self.blocks[t]);
    }

    /// Forgets the positions from `len` on: a forward that failed part way may have written
    /// some of them (the length only advances once every layer has), and a retry from `len`
    /// overwrites them exactly. The blocks stay taken.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len).max(self.shared * kernel::TILE);
    }

    /// Marks the first `len` positions as filled without computing them: for benchmarks that time
    /// a step at a long context without paying for its prefill. The keys and values there are set
    /// to a constant, which changes the numbers, not the work. (Written, not left as allocated:
    /// never-written zeroed memory reads from one shared page, which would hide the cost of
    /// streaming the cache.)
    pub fn assume_filled(&mut self, len: usize) -> Result<()> {
        let len = len.min(self.capacity);
        self.reserve(len.saturating_sub(self.len))?;
        let (kv_heads, d) = (self.pool.k[0].dim(1)?, self.pool.k[0].dim(2)?);
        let constant = Tensor::full(0.01f32, (1, kv_heads, len, d), self.pool.k[0].device())?;
        let store = Store { blocks: &self.blocks, pos: 0, kv_heads, head_dim: d, keys: true };
        for (k, v) in self.pool.k.iter().zip(&self.pool.v) {
            k.inplace_op2(&constant, &store)?;
            v.inplace_op2(&constant, &Store { keys: false, ..store })?;
        }
        self.len = len;
        Ok(())
    }

    /// Bytes of the blocks it holds.
    pub fn bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes
    }
}

/// Writes new keys or values (`1 × kv_heads × n × head_dim`, contiguous) of positions `pos..` into
/// a layer's keys or values in a pool, in place, each position in its block
/// ([`kernel::store_keys`], [`kernel::store_values`]). Why a custom op: a cache's positions are
/// spread over its blocks, and a position's keys are one value in each row of its tile.
#[derive(Clone, Copy)]
pub(super) struct Store<'a> {
    pub(super) blocks: &'a [u32],
    pub(super) pos: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) keys: bool,
}

impl candle_core::InplaceOp2 for Store<'_> {
    fn name(&self) -> &'static str {
        "store-kv"
    }

    fn cpu_fwd(
        &self,
        pool: &mut CpuStorage,
        pool_layout: &candle_core::Layout,
        new: &CpuStorage,
        new_layout: &candle_core::Layout,
    ) -> Result<()> {
        let (Some((ps, pe)), Some((ns, ne))) = (pool_layout.contiguous_offsets(), new_layout.contiguous_offsets())
        else {
            candle_core::bail!("store-kv: the pool and the new keys and values must be contiguous")
        };
        match (pool, new) {
            (CpuStorage::F32(pool), CpuStorage::F32(new)) => {
                let Store { blocks, pos, kv_heads, head_dim, keys } = *self;
                let (pool, new) = (&mut pool[ps..pe], &new[ns..ne]);
                if keys {
                    kernel::store_keys(pool, blocks, new, kv_heads, head_dim, pos);
                } else {
                    kernel::store_values(pool, blocks, new, kv_heads, head_dim, pos);
                }
                Ok(())
            }
            _ => candle_core::bail!("store-kv: the KV pool must be F32"),
        }
    }
}
