//! Where the forward's weights come from at load: a checkpoint's tensors, or a GGUF file's
//! blocks read from its map.
//!
//! Why rows on demand: a matrix is laid out in panels ([`crate::kernel::Layout`]) from its rows
//! in F32. Materialising each whole matrix in F32 first (and joining q/k/v and gate/up into one)
//! wrote a full-size copy of the model to fresh memory before the panels, another one: most of a
//! GGUF load went to the kernel zeroing those pages. A [`Matrix`] gives its rows a panel at a
//! time instead, dequantized from the file's blocks, so only the panels are new memory.

use crate::kernel;
use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::GgmlDType;
use candle_core::{CpuStorage, Result, Storage, Tensor};
use std::sync::Arc;

/// Dequantizes one row's blocks (`bytes`, whole blocks) into `out` (their values).
type Dequantize = fn(&[u8], &mut [f32]);

/// One weight matrix (`rows × cols`, row-major in the checkpoint's order), whose rows are read
/// into F32 on demand.
#[derive(Clone)]
pub(crate) enum Matrix {
    /// An F32 tensor on the CPU (a checkpoint's).
    Tensor(Tensor),
    /// A GGUF tensor's blocks in the file's map.
    Gguf(Blocks),
}

/// A GGUF tensor as stored: `rows` rows of whole blocks from `start` of `map`.
#[derive(Clone)]
pub(crate) struct Blocks {
    map: Arc<memmap2::Mmap>,
    start: usize,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    dequantize: Dequantize,
    /// The block format the products read in place ([`crate::kernel::quant_linear`]), when
    /// they read this type.
    format: Option<kernel::Format>,
    /// For rows in rotary order: the stored row of each row in the checkpoint's order.
    order: Option<Arc<[u32]>>,
    /// Llama's q and k rows are stored in the order of llama.cpp's rotary embedding, which
    /// pairs adjacent dimensions, where the forward rotates half against half: the head width
    /// when this matrix's rows are in that order (read back by index: [`rotary_source`]).
    rotary_head: Option<usize>,
}

impl Blocks {
    /// The tensor of type `ty` and `dims` (rows, then columns; one dimension is one row) at
    /// `start` of `map`; an error, saying why, when the type is not read here or the blocks do
    /// not fit the file.
    pub(crate) fn new(
        map: Arc<memmap2::Mmap>,
        start: u64,
        ty: GgmlDType,
        dims: &[usize],
        rotary_head: Option<usize>,
    ) -> std::result::Result<Self, String> {
        let dequantize = dequantizer(ty).ok_or_else(|| format!("is {ty:?}, a type this engine does not load"))?;
        let (rows, cols) = match *dims {
            [n] => (1, n),
            [rows, cols] => (rows, cols),
            _ => return Err(format!("has shape {dims:?}; weights here are vectors or matrices")),
        };
        if cols == 0 || !cols.is_multiple_of(ty.block_size()) {
            return Err(format!("has rows of {cols} values, not whole blocks of {}", ty.block_size()));
        }
        if let Some(d) = rotary_head {
            if d == 0 || !d.is_multiple_of(2) || !rows.is_multiple_of(d) {
                return Err(format!("has {rows} rows, not whole heads of {d}"));
            }
        }
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let end = usize::try_from(start)
            .ok()
            .and_then(|start| rows.checked_mul(row_bytes)?.checked_add(start).map(|end| (start, end)))
            .filter(|&(_, end)| end <= map.len());
        let Some((start, _)) = end else {
            return Err(format!("runs past the end of the file ({} bytes)", map.len()));
        };
        let format = match ty {
            GgmlDType::Q8_0 => Some(kernel::Format::Q8_0),
            GgmlDType::Q4_0 => Some(kernel::Format::Q4_0),
            GgmlDType::Q4_1 => Some(kernel::Format::Q4_1),
            _ => None,
        };
        let order = match (format, rotary_head) {
            (Some(_), Some(d)) => u32::try_from(rows)
                .map(|n| (0..n).map(|r| rotary_source(r as usize, d) as u32).collect())
                .map(Some)
                .map_err(|_| format!("has {rows} rows, too many"))?,
            _ => None,
        };
        Ok(Blocks { map, start, rows, cols, row_bytes, dequantize, format, order, rotary_head })
    }

    /// The blocks as the products read them in place: `None` for a type they do not read.
    pub(crate) fn quant(&self) -> Option<kernel::QuantMatrix<'_>> {
        Some(kernel::QuantMatrix {
            bytes: &self.map[self.start..self.start + self.rows * self.row_bytes],
            format: self.format?,
            rows: self.rows,
            k: self.cols,
            order: self.order.as_deref(),
        })
    }

    /// Bytes of the blocks in the file.
    pub(crate) fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}

impl Matrix {
    /// `t` as a matrix; it must be a 2-D F32 tensor on the CPU.
    pub(crate) fn tensor(t: Tensor) -> Result<Self> {
        t.dims2()?;
        let t = t.contiguous()?;
        if !matches!(&*t.storage_and_layout().0, Storage::Cpu(CpuStorage::F32(_))) {
            candle_core::bail!("weights are read in F32 on the CPU")
        }
        Ok(Matrix::Tensor(t))
    }

    /// Rows and columns.
    pub(crate) fn dims(&self) -> (usize, usize) {
        match self {
            Matrix::Tensor(t) => (t.dim(0).unwrap_or(0), t.dim(1).unwrap_or(0)),
            Matrix::Gguf(b) => (b.rows, b.cols),
        }
    }

    /// The GGUF blocks this matrix is read from, if it is.
    pub(crate) fn blocks(&self) -> Option<&Blocks> {
        match self {
            Matrix::Tensor(_) => None,
            Matrix::Gguf(b) => Some(b),
        }
    }

    /// Rows `first..` into `out` (whole rows, within the matrix).
    pub(crate) fn fill(&self, first: usize, out: &mut [f32]) {
        match self {
            Matrix::Tensor(t) => {
                let (storage, layout) = t.storage_and_layout();
                let (Storage::Cpu(CpuStorage::F32(values)), Some((start, _))) =
                    (&*storage, layout.contiguous_offsets())
                else {
                    unreachable!("checked by Matrix::tensor")
                };
                let from = start + first * t.dim(1).unwrap_or(0);
                out.copy_from_slice(&values[from..from + out.len()]);
            }
            Matrix::Gguf(b) => {
                for (r, out) in (first..).zip(out.chunks_exact_mut(b.cols)) {
                    let row = b.rotary_head.map_or(r, |d| rotary_source(r, d));
                    let from = b.start + row * b.row_bytes;
                    (b.dequantize)(&b.map[from..from + b.row_bytes], out);
                }
            }
        }
    }

    /// Every value, row-major.
    pub(crate) fn to_vec(&self) -> Vec<f32> {
        let (rows, cols) = self.dims();
        let mut out = vec![0f32; rows * cols];
        self.fill(0, &mut out);
        out
    }
}

/// Rows `first..` of the matrices `parts` stacked (rows in order, the same columns) into `out`.
pub(crate) fn fill_stacked(parts: &[Matrix], first: usize, out: &mut [f32]) {
    let cols = parts.first().map_or(0, |p| p.dims().1);
    let (mut first, mut out) = (first, out);
    for part in parts {
        let rows = part.dims().0;
        if first >= rows {
            first -= rows;
            continue;
        }
        let take = (rows - first).min(out.len() / cols.max(1));
        let (now, rest) = out.split_at_mut(take * cols);
        part.fill(first, now);
        (first, out) = (0, rest);
        if out.is_empty() {
            return;
        }
    }
}

/// The stored row that holds row `r` of a q or k matrix in the checkpoint's order, for heads of
/// `d` rows: within a head, checkpoint row `s·d/2 + i` is stored at row `2i + s`.
pub(crate) fn rotary_source(r: usize, d: usize) -> usize {
    let (head, j) = (r / d, r % d);
    let (s, i) = (j / (d / 2), j % (d / 2));
    head * d + 2 * i + s
}

/// Whether this engine loads tensors of type `ty`.
pub(crate) fn loads(ty: GgmlDType) -> bool {
    dequantizer(ty).is_some()
}

/// The dequantization of a type's blocks, for the types this engine loads.
fn dequantizer(ty: GgmlDType) -> Option<Dequantize> {
    Some(match ty {
        GgmlDType::F32 => blocks::<f32>,
        GgmlDType::F16 => blocks::<half::f16>,
        GgmlDType::BF16 => blocks::<half::bf16>,
        GgmlDType::Q8_0 => blocks::<k_quants::BlockQ8_0>,
        GgmlDType::Q4_0 => blocks::<k_quants::BlockQ4_0>,
        GgmlDType::Q4_1 => blocks::<k_quants::BlockQ4_1>,
        GgmlDType::Q4K => blocks::<k_quants::BlockQ4K>,
        GgmlDType::Q5K => blocks::<k_quants::BlockQ5K>,
        GgmlDType::Q6K => blocks::<k_quants::BlockQ6K>,
        _ => return None,
    })
}

/// `bytes` read as blocks of `B` and dequantized into `out` by candle's own `to_float` (the
/// values its whole-tensor dequantization gives), straight from the map when the blocks lie
/// aligned there, through an aligned copy of the row otherwise.
fn blocks<B: GgmlType>(bytes: &[u8], out: &mut [f32]) {
    let n = bytes.len() / std::mem::size_of::<B>();
    debug_assert_eq!(n * std::mem::size_of::<B>(), bytes.len());
    if bytes.as_ptr().align_offset(std::mem::align_of::<B>()) == 0 {
        // SAFETY: the blocks are plain data (floats, halves and byte arrays: every bit pattern a
        // value), `n` of them lie in `bytes`, aligned (checked above), and live as long as it.
        let xs = unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n) };
        B::to_float(xs, out);
    } else {
        let mut xs: Vec<B> = Vec::with_capacity(n);
        // SAFETY: as above; the copy fills the `n` blocks' bytes before the length is set.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), xs.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<B>());
            xs.set_len(n);
        }
        B::to_float(&xs, out);
    }
}

/// Where `crate::qwen::Qwen2::load_from` finds its weights, by their Hugging Face names.
pub(crate) trait Weights {
    /// The matrix `name`, which must be `rows × cols`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix>;
    /// The vector `name` of `len` values, in F32.
    fn vector(&self, name: &str, len: usize) -> Result<Tensor>;
    fn contains(&self, name: &str) -> bool;
}

/// A checkpoint's tensors.
impl Weights for candle_nn::VarBuilder<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let w = self.get_unchecked(name)?;
        if w.dims() != [rows, cols] {
            candle_core::bail!("{name}: shape {:?}, expected [{rows}, {cols}]", w.dims())
        }
        Matrix::tensor(w)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        self.get(len, name)
    }

    fn contains(&self, name: &str) -> bool {
        self.contains_tensor(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_source_undoes_the_converters_row_order() {
        // The converter's permutation, written from its definition: checkpoint row `s·d/2 + i`
        // of each head is stored at row `2i + s`.
        let (heads, d) = (3, 8);
        let mut stored = vec![usize::MAX; heads * d];
        for h in 0..heads {
            for s in 0..2 {
                for i in 0..d / 2 {
                    stored[h * d + 2 * i + s] = h * d + s * d / 2 + i;
                }
            }
        }
        for r in 0..heads * d {
            assert_eq!(stored[rotary_source(r, d)], r, "row {r}");
        }
    }

    #[test]
    fn stacked_rows_cross_parts() {
        let part = |first: f32, rows: usize| {
            let v: Vec<f32> = (0..rows * 2).map(|x| first + x as f32).collect();
            Matrix::tensor(Tensor::from_vec(v, (rows, 2), &candle_core::Device::Cpu).unwrap()).unwrap()
        };
        let parts = [part(0.0, 3), part(6.0, 1), part(8.0, 2)];
        let mut out = vec![0f32; 8];
        fill_stacked(&parts, 1, &mut out);
        assert_eq!(out, (2..10).map(|x| x as f32).collect::<Vec<_>>());
        let mut all = vec![0f32; 12];
        fill_stacked(&parts, 0, &mut all);
        assert_eq!(all, (0..12).map(|x| x as f32).collect::<Vec<_>>());
    }
}
