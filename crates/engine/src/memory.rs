//! Where the weight matrices and the KV caches live in memory.
//!
//! A decode step streams every weight once: two gigabytes of F32 for Qwen2.5-0.5B, half a million
//! 4 KiB pages, each a TLB miss and a page walk on the way. On 2 MiB pages the same stream misses
//! a thousand times, which measured 4-8% more bandwidth for the projection kernel on Linux, where
//! transparent huge pages are commonly granted only to memory that asks for them (`madvise`).
//! Both start on a huge-page boundary, so on a cache line too: no 512-bit load of the kernels
//! straddles two lines.

use candle_core::{CpuStorage, DType, Device, Result, Shape, Storage, Tensor, WithDType};

/// The huge page size on x86-64 and most aarch64 Linux kernels.
const HUGE_PAGE: usize = 2 << 20;

/// A contiguous copy of `t` (F32, F16 or BF16, on the CPU) whose data starts on a huge-page
/// boundary in memory advised for huge pages. Values, shape and dtype are unchanged; smaller
/// tensors, other dtypes or devices are returned as a plain contiguous tensor.
pub(crate) fn on_huge_pages(t: &Tensor) -> Result<Tensor> {
    let t = t.contiguous()?;
    if t.elem_count() * t.dtype().size_in_bytes() < HUGE_PAGE {
        return Ok(t);
    }
    let (storage, layout) = t.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else { return Ok(t.clone()) };
    let copy = match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => aligned_copy(&v[start..end], &t)?,
        Storage::Cpu(CpuStorage::F16(v)) => aligned_copy(&v[start..end], &t)?,
        Storage::Cpu(CpuStorage::BF16(v)) => aligned_copy(&v[start..end], &t)?,
        _ => return Ok(t.clone()),
    };
    Ok(copy)
}

/// A flat F32 tensor of `len` values on huge pages, written by `fill` where it lives (a matrix
/// laid out straight into it: no copy in between, as [`on_huge_pages`] of a laid-out copy has).
pub(crate) fn filled_on_huge_pages(len: usize, device: &Device, fill: impl FnOnce(&mut [f32])) -> Result<Tensor> {
    on_huge_page::<f32>(Shape::from(len), device, fill)
}

/// `src` copied into a buffer that starts on a huge page ([`on_huge_page`]; callers pass a
/// huge page or more), viewed with `like`'s shape.
fn aligned_copy<T: WithDType>(src: &[T], like: &Tensor) -> Result<Tensor> {
    on_huge_page(like.shape().clone(), like.device(), |data| data.copy_from_slice(src))
}

/// An F32 tensor of zeros whose data starts on a cache line, and, when it spans a huge page or
/// more, on a huge-page boundary with its whole huge pages advised as huge. Its pages become
/// resident as they are first written, as with `Tensor::zeros`. Why: the KV cache is read by
/// 512-bit loads along rows of positions; from an allocation that starts off a cache line (as the
/// allocator's blocks may), every one of them reads two lines.
pub(crate) fn zeros(shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
    let shape = shape.into();
    if !device.is_cpu() {
        return Tensor::zeros(shape, DType::F32, device);
    }
    on_huge_page::<f32>(shape, device, |_| {})
}

/// A tensor of `shape` whose data starts on a huge page when it is that large, on a cache line
/// otherwise ([`aligned_buffer`]), zeroed, then filled by `fill`.
fn on_huge_page<T: WithDType>(shape: Shape, device: &Device, fill: impl FnOnce(&mut [T])) -> Result<Tensor> {
    let len = shape.elem_count();
    let (mut buf, offset) = aligned_buffer::<T>(len)?;
    fill(&mut buf[offset..]);
    Tensor::from_vec(buf, offset + len, device)?.narrow(0, offset, len)?.reshape(shape)
}

/// The size of a cache line, and so of a 512-bit load.
const CACHE_LINE: usize = 64;

/// A zeroed buffer for `len` values from its first aligned boundary on, and that boundary's
/// index: a huge-page boundary, with the whole huge pages of those values advised as huge, when
/// the values fill at least a huge page; a cache line otherwise. Allocated zeroed, so padding
/// before the boundary that the allocator maps fresh is never touched. A small buffer is padded
/// by a cache line only, not a huge page: a KV cache is 48 such buffers, and the allocator hands
/// out reused heap memory for them, which it must zero whole, padding included (measured: a
/// qwen2.5-0.5b session's cache took 40 ms to allocate with huge-page padding).
pub(crate) fn aligned_buffer<T: WithDType>(len: usize) -> Result<(Vec<T>, usize)> {
    let size = std::mem::size_of::<T>();
    let boundary = if len * size >= HUGE_PAGE { HUGE_PAGE } else { CACHE_LINE };
    let capacity = len + boundary / size;
    let layout = std::alloc::Layout::array::<T>(capacity).map_err(candle_core::Error::wrap)?;
    // SAFETY: `layout` has a non-zero size; the buffer comes from the global allocator with the
    // layout of `capacity` values of `T`, as `Vec::from_raw_parts` requires, and is fully
    // initialised: all-zero bits are a valid F32, F16 and BF16 (the only types passed here).
    let mut buf = unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut T;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout)
        }
        Vec::from_raw_parts(ptr, capacity, capacity)
    };
    let address = buf.as_ptr() as usize;
    let offset = (address.next_multiple_of(boundary) - address) / size;
    if boundary == HUGE_PAGE {
        // Only whole huge pages of data: a huge page over the data's end would make its padding
        // resident.
        advise_huge_pages(&buf[offset..offset + len]);
    }
    buf.truncate(offset + len);
    Ok((buf, offset))
}

/// Asks the kernel to back the whole huge pages inside `region` with huge pages when they are
/// first touched. Advice only: refused or unsupported, the memory works the same on small pages.
fn advise_huge_pages<T>(region: &[T]) {
    #[cfg(target_os = "linux")]
    {
        let start = region.as_ptr() as usize;
        let len = std::mem::size_of_val(region) / HUGE_PAGE * HUGE_PAGE;
        if start.is_multiple_of(HUGE_PAGE) && len > 0 {
            // SAFETY: the range lies inside `region`, which this process owns; MADV_HUGEPAGE
            // changes how its pages are backed, never their contents.
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = region;
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn copies_keep_values_shape_and_dtype_and_start_on_a_huge_page() {
        let rows = 2200; // 2200 × 512 halves = 2.15 MiB: past the huge-page threshold.
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = Tensor::arange(0f32, (rows * 512) as f32, &Device::Cpu)
                .unwrap()
                .affine(1e-6, 0.0) // within F16's range
                .unwrap()
                .reshape((rows, 512))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let copy = on_huge_pages(&t).unwrap();
            assert_eq!((copy.dims(), copy.dtype()), (t.dims(), dtype));
            let diff = (copy.to_dtype(DType::F32).unwrap() - t.to_dtype(DType::F32).unwrap()).unwrap();
            assert_eq!(diff.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
            let (storage, layout) = copy.storage_and_layout();
            let Storage::Cpu(cpu) = &*storage else { panic!("a CPU tensor") };
            let base = match cpu {
                CpuStorage::F32(v) => v.as_ptr() as usize,
                CpuStorage::F16(v) => v.as_ptr() as usize,
                CpuStorage::BF16(v) => v.as_ptr() as usize,
                _ => unreachable!(),
            };
            let first = base + layout.start_offset() * dtype.size_in_bytes();
            assert!(first.is_multiple_of(HUGE_PAGE), "{dtype:?} data starts on a huge page");
        }
    }

    #[test]
    fn zeros_start_on_a_huge_page_when_they_span_one_and_on_a_cache_line_always() {
        for (shape, huge) in [((1, 2, 64, 10), false), ((1, 2, 64, 4129), true)] {
            let t = zeros(shape, &Device::Cpu).unwrap();
            assert_eq!(t.dims(), [shape.0, shape.1, shape.2, shape.3]);
            assert_eq!(t.dtype(), DType::F32);
            assert_eq!(t.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cpu(CpuStorage::F32(v)) = &*storage else { panic!("an F32 CPU tensor") };
            let first = v.as_ptr() as usize + layout.start_offset() * 4;
            assert!(first.is_multiple_of(CACHE_LINE), "{shape:?}: data starts on a cache line");
            if huge {
                assert!(first.is_multiple_of(HUGE_PAGE), "{shape:?}: data starts on a huge page");
            }
            assert_eq!(layout.contiguous_offsets().map(|(a, b)| b - a), Some(t.elem_count()));
        }
    }
}
